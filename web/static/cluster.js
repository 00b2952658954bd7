// The live cluster view: one EventSource on /v1/cluster/events, a snapshot
// per change, rendered into the charts, three tables and the counters.

import {call, problemFrom, readToken, withParams} from './api.js';
import {el, $, showProblem, clearProblem, num} from './ui.js';
import {TimeChart} from './charts.js';

const EVENTS = '/v1/cluster/events';
const READ_TOKEN = '/v1/cluster/read-token';
// The charts take a sample a second: the snapshot's load carries over
// until the next (the stream sends none while nothing changes), and a
// view that is not live samples nothing, so its lines break.
const SAMPLE_MS = 1000;
// A node that left the catalog stays listed, as gone, this long: a node
// that drained and closed does not just vanish.
const GONE_MS = 60 * 1000;

const OUTCOMES = ['completed', 'failed', 'cancelled', 'expired'];
// Colour classes (app.css s0-s7): an outcome keeps its colour.
const OUTCOME_COLOUR = {completed: 0, failed: 1, cancelled: 2, expired: 3};

/** A figure as a chart's axis and readout show it: at most three digits that mean something. */
function figure(v) {
  if (v === 0) return '0';
  if (Math.abs(v) >= 100) return Math.round(v).toString();
  if (Math.abs(v) >= 10) return v.toFixed(1).replace(/\.0$/, '');
  return v.toFixed(2).replace(/\.?0+$/, '');
}

// Colours for names (queues, nodes), in turn: blue first, green and red
// last, so a queue does not read as an outcome.
const NAME_COLOURS = [4, 6, 2, 3, 5, 7, 0, 1];

/** A stable colour per name (queues, nodes), in order of arrival. */
class Palette {
  constructor() {
    this.of = new Map();
  }

  colour(name) {
    if (!this.of.has(name)) this.of.set(name, NAME_COLOURS[this.of.size % NAME_COLOURS.length]);
    return this.of.get(name);
  }

  /** A dash for names past the first round of colours. */
  dash(name) {
    return [...this.of.keys()].indexOf(name) >= NAME_COLOURS.length ? 2 : 0;
  }
}

export class ClusterView {
  /** @param {(snap: any) => void} onSnapshot also told of every snapshot (the playground's queues). */
  constructor(onSnapshot) {
    this.onSnapshot = onSnapshot;
    this.live = $('live');
    this.problem = $('cluster-problem');
    this.snapshots = 0;
    this.load = null; // the last snapshot's load
    this.known = new Map(); // node id -> {node, seen: last time listed}
    this.charts = this.makeCharts();
    setInterval(() => this.sample(), SAMPLE_MS);
  }

  makeCharts() {
    const queues = new Palette(), nodes = new Palette();
    const charts = {
      jobs: new TimeChart({
        id: 'jobs', title: 'Jobs ended per second', what: 'by outcome, every node, over 5 s', unit: '/s', min: 1, format: figure,
        series: (k) => ({label: k, colour: OUTCOME_COLOUR[k] ?? 7, dash: 0}),
      }),
      firstOutput: new TimeChart({
        id: 'first-output', title: 'Time to first output', what: 'p50 and p99, every node, over 5 s', unit: ' ms', min: 10, format: figure,
        series: (k) => ({label: k, colour: k === 'p50' ? 4 : 5, dash: k === 'p50' ? 0 : 1}),
      }),
      queues: new TimeChart({
        id: 'queues', title: 'Jobs per queue', what: 'in flight (solid) and waiting (dashed)', unit: '', min: 4, format: figure,
        series: (k) => {
          const [what, q] = [k.slice(0, k.indexOf(':')), k.slice(k.indexOf(':') + 1)];
          return {label: `${q} ${what === 'in_flight' ? 'in flight' : 'waiting'}`, colour: queues.colour(q), dash: what === 'in_flight' ? 0 : 1};
        },
      }),
      streams: new TimeChart({
        id: 'streams', title: 'Open streams per node', what: 'client job streams', unit: '', min: 4, format: figure,
        series: (k) => ({label: k, colour: nodes.colour(k), dash: nodes.dash(k)}),
      }),
    };
    $('charts').replaceChildren(...Object.values(charts).map((c) => c.root));
    for (const c of Object.values(charts)) c.render(Date.now()); // the axes, and "no figures yet"
    return charts;
  }

  /**
   * One sample of every chart: the last load while live; an empty one
   * (the lines break) while not, once there was a first.
   */
  sample() {
    if (!this.sampled && !this.load) return;
    this.sampled = true;
    const t = Date.now();
    const l = this.live.dataset.live === 'live' ? this.load : null;
    const c = this.charts;
    if (l) {
      const jobs = {};
      for (const o of OUTCOMES) jobs[o] = l.jobs_per_second ? (l.jobs_per_second[o] ?? 0) : null;
      c.jobs.push(t, jobs);
      const fo = l.first_output_ms;
      c.firstOutput.push(t, {p50: fo ? fo.p50 : null, p99: fo ? fo.p99 : null});
      const qs = {};
      for (const q of l.queues) {
        qs[`in_flight:${q.name}`] = q.in_flight;
        qs[`waiting:${q.name}`] = q.depth;
      }
      c.queues.push(t, qs);
      const ns = {};
      for (const n of l.nodes) ns[n.node] = n.error ? null : n.streams_open;
      c.streams.push(t, ns);
    } else {
      for (const ch of Object.values(c)) ch.push(t, {});
    }
    for (const ch of Object.values(c)) ch.render(t);
  }

  /**
   * Opens the stream. An EventSource cannot send the key: it reads with a
   * read token (scope cluster:read), asked for with the key; on a node
   * that checks keys that takes the admin role.
   */
  async start() {
    if (this.es) this.es.close();
    this.es = null;
    this.setLive('connecting', 'connecting…');
    try {
      this.url = withParams(EVENTS, {read_token: await readToken(READ_TOKEN)});
    } catch (err) {
      this.setLive('closed', 'not live');
      showProblem(this.problem, err, 'The live view needs a read token: a key with the admin role, on a node that checks keys.');
      return;
    }
    const es = new EventSource(this.url);
    this.es = es;
    this.setLive('connecting', 'connecting…');
    es.addEventListener('open', () => {
      clearProblem(this.problem);
      this.setLive('live', 'live');
    });
    es.addEventListener('snapshot', (e) => {
      let snap;
      try {
        snap = JSON.parse(e.data);
      } catch (err) {
        showProblem(this.problem, {code: 'bad_snapshot', title: 'Unreadable snapshot', detail: String(err)});
        return;
      }
      this.snapshots++;
      const first = !this.load && snap.load;
      this.load = snap.load || null;
      this.render(snap);
      this.onSnapshot(snap);
      // The first figures show at once, not a second later.
      if (first) this.sample();
    });
    es.addEventListener('error', () => {
      // The tables keep the last snapshot: the badge says it is not live.
      if (es.readyState === EventSource.CONNECTING) {
        this.setLive('reconnecting', this.snapshots ? 'reconnecting… (last snapshot shown)' : 'reconnecting…');
        return;
      }
      this.setLive('closed', this.snapshots ? 'not live (last snapshot shown)' : 'not live');
      this.explain();
    });
  }

  setLive(state, text) {
    this.live.dataset.live = state;
    this.live.textContent = text;
  }

  /** The EventSource was refused: ask again with fetch (and, as it, the read token, no key) to show why. */
  async explain() {
    const ctrl = new AbortController();
    try {
      const res = await call(this.url, {signal: ctrl.signal}, {auth: false});
      if (res.status === 401) {
        // The read token expired: a new one.
        this.start();
      } else if (!res.ok) {
        showProblem(this.problem, await problemFrom(res), 'The live view could not start.');
      } else {
        showProblem(this.problem, {title: 'The live view closed', detail: 'The node answers again; retrying.'});
        setTimeout(() => this.start(), 1000);
      }
    } catch (err) {
      showProblem(this.problem, err, 'The live view stopped. Reload the page to try again.');
    } finally {
      ctrl.abort();
    }
  }

  render(s) {
    $('node-name').textContent = s.node;
    document.title = `Switchyard · ${s.node}`;
    this.renderCounters(s.counters);
    this.renderNodes(s.nodes, s.node, s.load);
    this.renderQueues(s.queues);
    this.renderWorkers(s.queues);
    this.live.dataset.snapshots = String(this.snapshots);
  }

  renderCounters(c) {
    const sum = (m) => Object.values(m || {}).reduce((a, b) => a + b, 0);
    // The breakdown names what is there: zero series are left out.
    const by = (m) => Object.entries(m || {}).filter(([, v]) => v !== 0).sort(([a], [b]) => a.localeCompare(b))
      .map(([k, v]) => `${k || '–'} ${num(v)}`).join(', ');
    const rows = [
      ['jobs', 'Jobs ended', num(sum(c.jobs)), by(c.jobs)],
      ['peer_messages', 'Peer messages', num(sum(c.peer_messages)), by(c.peer_messages)],
      ['streams_open', 'Streams open', num(sum(c.streams_open)), by(c.streams_open)],
      ['unary_fallbacks', 'Unary fallbacks', num(c.unary_fallbacks), ''],
      ['workers_connected', 'Workers connected here', num(c.workers_connected), ''],
    ];
    $('counters').replaceChildren(...rows.map(([key, label, total, detail]) =>
      el('div', {'data-counter': key},
        el('dt', {text: label}),
        el('dd', {}, el('span', {class: 'total', text: total}), detail ? el('span', {class: 'by', text: detail}) : null))));
  }

  /**
   * The nodes with their states (draining, fenced, spare, and suspected
   * when this node's tracker holds a standing record silent) and figures;
   * and the nodes that left the catalog in the last minute, as gone.
   */
  renderNodes(nodes, self, load) {
    const now = Date.now();
    const figures = new Map((load ? load.nodes : []).map((f) => [f.node, f]));
    for (const n of nodes) this.known.set(n.id, {node: n, seen: now});
    const listed = new Set(nodes.map((n) => n.id));
    const gone = [];
    for (const [id, k] of this.known) {
      if (listed.has(id)) continue;
      if (now - k.seen > GONE_MS) this.known.delete(id);
      else gone.push(k);
    }
    const stateCell = (n) => el('td', {},
      el('span', {class: 'state', 'data-state': n.state, text: n.state}),
      n.suspected ? el('span', {class: 'state', 'data-state': 'suspected', text: 'suspected',
        title: 'Missed this node\'s ping, or its connection broke, while its record still stands: offered nothing new and its queues taken over; suspected, not proven dead.'}) : null);
    const rows = nodes.map((n) => {
      const f = figures.get(n.id);
      return el('tr', {'data-node': n.id, 'data-state': n.state, 'data-suspected': n.suspected ? 'true' : null},
        el('th', {scope: 'row'}, n.id, n.id === self ? el('span', {class: 'tag', text: 'this node'}) : null),
        el('td', {text: n.zone || '–'}),
        stateCell(n),
        el('td', {class: 'num', text: f && !f.error ? String(f.streams_open) : '–', title: f && f.error ? f.error : null}),
        el('td', {class: 'num', text: f && f.jobs_per_second !== undefined ? figure(f.jobs_per_second) : '–'}),
        el('td', {}, n.http_addr ? el('a', {href: `http://${n.http_addr}/`, text: n.http_addr}) : '–'));
    });
    for (const k of gone) {
      const at = new Date(k.seen).toLocaleTimeString([], {hour12: false});
      rows.push(el('tr', {'data-node': k.node.id, 'data-state': 'gone', class: 'gone'},
        el('th', {scope: 'row', text: k.node.id}),
        el('td', {text: k.node.zone || '–'}),
        el('td', {}, el('span', {class: 'state', 'data-state': 'gone', text: 'gone'}),
          el('span', {class: 'muted', text: ` since ${at} (last seen ${k.node.state})`})),
        el('td', {class: 'num', text: '–'}), el('td', {class: 'num', text: '–'}), el('td', {text: '–'})));
    }
    this.fill('nodes', rows, 6, 'No node in the catalog.');
  }

  renderQueues(queues) {
    const rows = queues.map((q) => {
      const slots = q.consumers.reduce((a, c) => a + c.concurrency, 0);
      const load = q.local ? `${q.local.bound} of ${slots}` : '–';
      return el('tr', {'data-queue': q.name},
        el('th', {scope: 'row', text: q.name}),
        el('td', {text: q.dispatcher || '–'}),
        el('td', {text: String(q.consumers.length)}),
        el('td', {text: q.local ? String(q.local.depth) : '–'}),
        el('td', {text: load}),
        this.subjectsCell(q.local));
    });
    this.fill('queues', rows, 6, 'No queue: queues exist while they have workers or jobs.');
  }

  /**
   * The queue's fair share on its dispatcher: each subject's waiting jobs,
   * the slots it holds, its share of them and what its weight entitles it
   * to (docs/scheduling.md).
   */
  subjectsCell(local) {
    const subjects = local && local.subjects ? local.subjects : [];
    if (subjects.length === 0) return el('td', {text: '–'});
    const pc = (f) => `${Math.round(100 * f)}%`;
    return el('td', {class: 'subjects'}, ...subjects.map((s) =>
      el('div', {'data-subject': s.subject || 'anonymous',
        title: `weight ${s.weight}: entitled to ${pc(s.fair_share)} of the slots while every subject here waits`},
      el('span', {class: 'subject', text: s.subject || 'anonymous'}),
      ` ${num(s.depth)} waiting, ${num(s.bound)} running (${pc(s.share)}, fair ${pc(s.fair_share)})`)));
  }

  renderWorkers(queues) {
    const rows = [];
    for (const q of queues) {
      for (const c of q.consumers) {
        rows.push(el('tr', {'data-worker': c.name || c.id},
          el('th', {scope: 'row', title: c.id, text: c.name || c.id}),
          el('td', {text: q.name}),
          el('td', {text: c.node + (c.zone ? ` (${c.zone})` : '')}),
          el('td', {}, c.capabilities.length ? c.capabilities.map((cap) => el('code', {class: 'cap', text: cap})) : '–'),
          el('td', {text: String(c.concurrency)})));
      }
    }
    this.fill('workers', rows, 5, 'No worker attached anywhere.');
  }

  fill(table, rows, cols, empty) {
    const body = $(table).tBodies[0];
    if (rows.length === 0) rows = [el('tr', {class: 'empty'}, el('td', {colSpan: cols, text: empty}))];
    body.replaceChildren(...rows);
  }
}
