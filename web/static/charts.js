// Small live line charts in SVG, of our own: the cluster view's load over
// the last minutes, one sample a second. Each chart says its latest values
// in its legend, shows the values at a moment under the pointer (or the
// arrow keys, once focused), and has a text alternative a screen reader
// reads: what it shows, its latest values and its highest.
//
// Styles come from app.css by class (s0…s7 colour a series, d0…d3 dash
// it): the page's CSP allows no inline style.

import {el} from './ui.js';

const SVG = 'http://www.w3.org/2000/svg';
// The span a chart shows, and the gap between samples past which a line
// breaks (no sample: the view was not live).
export const WINDOW_MS = 5 * 60 * 1000;
const BREAK_MS = 2500;
const HEIGHT = 150;
const M = {left: 46, right: 10, top: 10, bottom: 22};

function svg(tag, attrs = {}, ...children) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v !== undefined && v !== null) e.setAttribute(k, String(v));
  }
  for (const c of children) {
    if (c !== null && c !== undefined) e.append(c);
  }
  return e;
}

/** The smallest 1, 2 or 5 times a power of ten at or above v (and at least min). */
export function niceMax(v, min) {
  const x = Math.max(v, min);
  const p = 10 ** Math.floor(Math.log10(x));
  for (const m of [1, 2, 5, 10]) {
    if (m * p >= x) return m * p;
  }
  return 10 * p;
}

/** A time of day, to the second. */
function clock(t) {
  return new Date(t).toLocaleTimeString([], {hour12: false});
}

/**
 * One chart. Series appear as their keys first come in a sample, each
 * styled by opts.series(key): {label, colour (0-7), dash (0-3)}.
 */
export class TimeChart {
  /**
   * @param {{id: string, title: string, what: string, unit: string,
   *          format: (v: number) => string, min: number,
   *          series: (key: string) => {label: string, colour: number, dash: number}}} opts
   */
  constructor(opts) {
    this.o = opts;
    this.samples = []; // {t, v: {key: number|null}}, oldest first
    this.keys = []; // series, in the order they came
    this.cursor = -1; // the sample the readout shows; -1: none
    const id = `chart-${opts.id}`;
    this.svg = svg('svg', {class: 'chart-svg', 'aria-hidden': 'true', focusable: 'false'});
    this.tip = el('div', {class: 'chart-tip', hidden: true});
    this.plot = el('div', {class: 'chart-plot', tabindex: '0', role: 'img', 'aria-describedby': `${id}-text`}, this.svg, this.tip);
    this.legend = el('ul', {class: 'legend'});
    this.text = el('p', {class: 'sr-only', id: `${id}-text`});
    // What the readout says, for a screen reader moving with the keys.
    this.said = el('p', {class: 'sr-only', 'aria-live': 'polite'});
    this.root = el('figure', {class: 'chart', id, 'data-chart': opts.id},
      el('figcaption', {}, el('span', {class: 'chart-title', text: opts.title}), ' ', el('span', {class: 'muted', text: opts.what})),
      this.plot, this.legend, this.text, this.said);
    this.plot.setAttribute('aria-label', `${opts.title} (${opts.what}), the last ${WINDOW_MS / 60000} minutes`);
    this.plot.addEventListener('pointermove', (e) => this.point(e.clientX));
    this.plot.addEventListener('pointerleave', () => this.setCursor(-1));
    this.plot.addEventListener('blur', () => this.setCursor(-1));
    this.plot.addEventListener('keydown', (e) => this.key(e));
  }

  /** Adds the sample of time t: values by series key (null or absent: no value). */
  push(t, values) {
    for (const k of Object.keys(values)) {
      if (!this.keys.includes(k)) this.keys.push(k);
    }
    this.samples.push({t, v: values});
    const from = t - WINDOW_MS - BREAK_MS;
    let drop = 0;
    while (drop < this.samples.length && this.samples[drop].t < from) drop++;
    if (drop) {
      this.samples.splice(0, drop);
      if (this.cursor >= 0) this.cursor = Math.max(0, this.cursor - drop);
    }
  }

  /** Draws the chart as of now. */
  render(now) {
    const W = Math.max(this.plot.clientWidth, 200);
    const H = HEIGHT;
    const x0 = M.left, x1 = W - M.right, y0 = H - M.bottom, y1 = M.top;
    const from = now - WINDOW_MS;
    const x = (t) => x0 + (x1 - x0) * (t - from) / WINDOW_MS;
    let hi = 0;
    for (const s of this.samples) {
      for (const k of this.keys) {
        const v = s.v[k];
        if (typeof v === 'number' && s.t >= from) hi = Math.max(hi, v);
      }
    }
    const top = niceMax(hi, this.o.min);
    const y = (v) => y0 - (y0 - y1) * v / top;
    this.x = x;
    this.geom = {x0, x1, now};

    const parts = [];
    for (const v of [0, top / 2, top]) {
      parts.push(svg('line', {class: 'grid', x1: x0, x2: x1, y1: y(v), y2: y(v)}));
      parts.push(svg('text', {class: 'axis', x: x0 - 6, y: y(v) + 4, 'text-anchor': 'end'}, this.o.format(v)));
    }
    // A tick a minute; labels as long as there is room for them.
    const minutes = WINDOW_MS / 60000;
    const perMinute = (x1 - x0) / minutes;
    const every = perMinute < 34 ? 2 : 1;
    for (let m = minutes; m >= 0; m--) {
      const tx = x(now - m * 60000);
      parts.push(svg('line', {class: 'tick', x1: tx, x2: tx, y1: y0, y2: y0 + 4}));
      if (m % every !== 0 && m !== minutes) continue;
      parts.push(svg('text', {class: 'axis', x: tx, y: H - 6, 'text-anchor': m === 0 ? 'end' : m === minutes ? 'start' : 'middle'},
        m === 0 ? 'now' : perMinute < 60 ? `−${m}m` : `−${m} min`));
    }
    this.keys.forEach((k) => {
      const st = this.o.series(k);
      let d = '';
      let last = -Infinity;
      for (const s of this.samples) {
        const v = s.v[k];
        if (typeof v !== 'number' || s.t < from - BREAK_MS) {
          last = -Infinity;
          continue;
        }
        d += `${s.t - last > BREAK_MS ? 'M' : 'L'}${x(Math.max(s.t, from)).toFixed(1)},${y(v).toFixed(1)}`;
        last = s.t;
      }
      if (d) parts.push(svg('path', {class: `line s${st.colour} d${st.dash}`, d, 'data-series': k}));
    });
    const c = this.samples[this.cursor];
    if (c) {
      parts.push(svg('line', {class: 'cursor', x1: x(c.t), x2: x(c.t), y1: y1, y2: y0}));
      for (const k of this.keys) {
        const v = c.v[k];
        if (typeof v === 'number') parts.push(svg('circle', {class: `dot s${this.o.series(k).colour}`, cx: x(c.t), cy: y(v), r: 3.5}));
      }
    }
    this.svg.setAttribute('viewBox', `0 0 ${W} ${H}`);
    this.svg.setAttribute('width', W);
    this.svg.setAttribute('height', H);
    this.svg.replaceChildren(...parts);
    this.root.dataset.samples = String(this.samples.length);
    this.root.dataset.top = String(top);
    this.renderLegend();
    this.renderText(from);
    this.renderTip();
  }

  /** The legend: each series with its latest value. */
  renderLegend() {
    const last = this.samples[this.samples.length - 1];
    this.legend.replaceChildren(...this.keys.map((k) => {
      const st = this.o.series(k);
      const v = last ? last.v[k] : undefined;
      return el('li', {'data-series': k},
        svg('svg', {class: 'swatch', viewBox: '0 0 24 8', width: 24, height: 8, 'aria-hidden': 'true'},
          svg('line', {class: `line s${st.colour} d${st.dash}`, x1: 0, x2: 24, y1: 4, y2: 4})),
        el('span', {text: st.label}), ' ',
        el('b', {class: 'value', text: typeof v === 'number' ? this.o.format(v) + this.o.unit : '–'}));
    }));
  }

  /** The text alternative: what the chart shows now and its highest. */
  renderText(from) {
    const last = this.samples[this.samples.length - 1];
    if (!last) {
      this.text.textContent = `${this.o.title}: no figures yet.`;
      return;
    }
    const now = [], peaks = [];
    for (const k of this.keys) {
      const st = this.o.series(k);
      const v = last.v[k];
      now.push(`${st.label} ${typeof v === 'number' ? this.o.format(v) + this.o.unit : 'no value'}`);
      let peak = null;
      for (const s of this.samples) {
        const pv = s.v[k];
        if (s.t >= from && typeof pv === 'number' && (!peak || pv > peak.v)) peak = {v: pv, t: s.t};
      }
      if (peak && peak.v > 0) peaks.push(`${st.label} ${this.o.format(peak.v)}${this.o.unit} at ${clock(peak.t)}`);
    }
    this.text.textContent = `${this.o.title}, ${this.o.what}, the last ${WINDOW_MS / 60000} minutes. ` +
      `Now: ${now.join(', ') || 'nothing'}. ` + (peaks.length ? `Highest: ${peaks.join('; ')}.` : 'All zero so far.');
  }

  /** The readout of the sample under the cursor. */
  renderTip() {
    const c = this.samples[this.cursor];
    if (!c) {
      this.tip.hidden = true;
      return;
    }
    const rows = this.keys.map((k) => {
      const st = this.o.series(k);
      const v = c.v[k];
      return el('li', {}, el('span', {class: `key-mark s${st.colour}`}), `${st.label} `,
        el('b', {text: typeof v === 'number' ? this.o.format(v) + this.o.unit : '–'}));
    });
    this.tip.replaceChildren(el('p', {class: 'tip-time', text: clock(c.t)}), el('ul', {}, rows));
    this.tip.hidden = false;
    // In the corner away from the cursor, so it hides nothing near it (by
    // class: the page sets no style of its own).
    const cx = this.x(c.t);
    this.tip.classList.toggle('at-left', cx > (this.geom.x0 + this.geom.x1) / 2);
  }

  /** The sample nearest the pointer at clientX. */
  point(clientX) {
    if (!this.samples.length || !this.geom) return;
    const r = this.plot.getBoundingClientRect();
    const W = Math.max(this.plot.clientWidth, 200);
    const px = (clientX - r.left) * W / r.width;
    const {x0, x1, now} = this.geom;
    const t = now - WINDOW_MS + (px - x0) / (x1 - x0) * WINDOW_MS;
    let best = -1, bestD = Infinity;
    this.samples.forEach((s, i) => {
      const dd = Math.abs(s.t - t);
      if (dd < bestD) [best, bestD] = [i, dd];
    });
    // Far from any sample (before the page was open), there is nothing to
    // read out.
    this.setCursor(bestD <= WINDOW_MS / 50 ? best : -1);
  }

  /** Left and right move the readout a sample, Home and End to the first and last, Escape hides it. */
  key(e) {
    const n = this.samples.length;
    if (!n) return;
    let i = this.cursor < 0 ? n - 1 : this.cursor;
    switch (e.key) {
      case 'ArrowLeft': i = Math.max(0, i - 1); break;
      case 'ArrowRight': i = Math.min(n - 1, i + 1); break;
      case 'Home': i = 0; break;
      case 'End': i = n - 1; break;
      case 'Escape': this.setCursor(-1); return;
      default: return;
    }
    e.preventDefault();
    this.setCursor(i);
    const c = this.samples[i];
    this.said.textContent = `${clock(c.t)}: ` + this.keys.map((k) => {
      const v = c.v[k];
      return `${this.o.series(k).label} ${typeof v === 'number' ? this.o.format(v) + this.o.unit : 'no value'}`;
    }).join(', ');
  }

  setCursor(i) {
    this.cursor = i;
    if (this.geom) this.render(this.geom.now);
  }
}
