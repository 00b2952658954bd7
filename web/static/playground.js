// The playground form: a queue and capabilities from the live catalog, the
// input, TTL and options, the mode; and the buttons that drive a run.

import {el, $, showProblem, clearProblem} from './ui.js';
import {JobView} from './jobview.js';
import {StreamedRun, DetachedRun} from './jobrun.js';

const OTHER = '\u0000other'; // the "Another queue…" option's value: no queue name has a NUL

export class Playground {
  constructor() {
    this.form = $('job-form');
    this.queue = $('queue');
    this.otherField = $('queue-other-field');
    this.other = $('queue-other');
    this.caps = $('caps-list');
    this.submitBtn = $('submit');
    this.cancelBtn = $('cancel');
    this.dropBtn = $('drop');
    this.pauseBtn = $('pause');
    this.problem = $('problem');
    this.view = new JobView();
    this.queues = [];
    this.run = null;
    this.capChoice = {}; // key -> chosen value ('' any), kept across refreshes

    this.form.addEventListener('submit', (e) => {
      e.preventDefault();
      this.submit();
    });
    this.queue.addEventListener('change', () => {
      this.queuePicked = true;
      this.queueChanged();
    });
    this.view.onConn = () => this.buttons();
    this.cancelBtn.addEventListener('click', () => {
      if (this.run) this.run.cancel();
      this.buttons();
    });
    this.dropBtn.addEventListener('click', () => this.run && this.run.drop && this.run.drop());
    this.pauseBtn.addEventListener('click', () => this.togglePause());
    for (const r of this.form.elements['mode']) r.addEventListener('change', () => this.buttons());
    this.setQueues([]);
    this.buttons();
  }

  /** The queues of the catalog (GET /v1/queues or a cluster snapshot). */
  setQueues(queues) {
    const chosen = this.queue.value;
    this.queues = queues;
    const opts = queues.map((q) => {
      const n = q.consumers.length;
      return el('option', {value: q.name, text: `${q.name} (${n} worker${n === 1 ? '' : 's'})`});
    });
    opts.push(el('option', {value: OTHER, text: 'Another queue…'}));
    this.queue.replaceChildren(...opts);
    // Keep what the user picked; until they pick, the catalog decides:
    // "demo" when there is one (the queue `make run`'s demo worker serves,
    // whose input is plain text; its neighbour "chat" wants OpenAI-style
    // messages), else the first queue, else "Another queue…".
    if (this.queuePicked && [...this.queue.options].some((o) => o.value === chosen)) this.queue.value = chosen;
    else if (queues.some((q) => q.name === 'demo')) this.queue.value = 'demo';
    else this.queue.value = queues.length ? queues[0].name : OTHER;
    this.queueChanged(false);
  }

  queueChanged(focus = true) {
    const other = this.queue.value === OTHER;
    this.otherField.hidden = !other;
    if (other && focus) this.other.focus();
    this.renderCaps();
  }

  queueName() {
    return this.queue.value === OTHER ? this.other.value.trim() : this.queue.value;
  }

  /** One radio group per capability key the queue's workers offer. */
  renderCaps() {
    const q = this.queues.find((q) => q.name === this.queue.value);
    const byKey = new Map();
    for (const c of q ? q.consumers : []) {
      for (const cap of c.capabilities) {
        const i = cap.indexOf('=');
        const k = cap.slice(0, i), v = cap.slice(i + 1);
        if (!byKey.has(k)) byKey.set(k, new Set());
        byKey.get(k).add(v);
      }
    }
    if (byKey.size === 0) {
      this.caps.replaceChildren(el('p', {class: 'help', text: q
        ? 'The workers of this queue declare no capabilities.'
        : 'No worker in the catalog for this queue: the node will answer no_capable_worker.'}));
      return;
    }
    const groups = [];
    let n = 0;
    for (const [k, values] of [...byKey].sort(([a], [b]) => a.localeCompare(b))) {
      const chosen = values.has(this.capChoice[k]) ? this.capChoice[k] : '';
      const radios = ['', ...[...values].sort()].map((v) => {
        const id = `cap-${n}-${v === '' ? 'any' : v}`.replace(/[^A-Za-z0-9_-]/g, '_');
        const input = el('input', {type: 'radio', name: `cap-${n}`, id, value: v, checked: v === chosen, 'data-key': k});
        input.addEventListener('change', () => { this.capChoice[k] = v; });
        return el('label', {for: id}, input, v === '' ? 'any' : v);
      });
      groups.push(el('div', {class: 'cap-group', role: 'radiogroup', 'aria-labelledby': `cap-${n}-key`},
        el('span', {id: `cap-${n}-key`, class: 'cap-key', text: k}), radios));
      n++;
    }
    this.caps.replaceChildren(...groups);
  }

  capabilities() {
    const out = {};
    for (const r of this.caps.querySelectorAll('input[type=radio]:checked')) {
      if (r.value !== '') out[r.dataset.key] = r.value;
    }
    return out;
  }

  /**
   * The envelope as text: the user's JSON goes in as typed, so a mistake
   * in it is the node's to refuse, with its code (malformed_json,
   * invalid_field, missing_input…), as any client would see it.
   */
  envelope() {
    const parts = [];
    const ttl = $('ttl').value.trim();
    if (ttl !== '') parts.push(`"ttl_ms":${ttl}`);
    const caps = this.capabilities();
    if (Object.keys(caps).length) parts.push(`"capabilities":${JSON.stringify(caps)}`);
    const input = $('input').value;
    if (this.form.elements['input-kind'].value === 'json') {
      if (input.trim() !== '') parts.push(`"input":${input}`);
    } else {
      parts.push(`"input":${JSON.stringify(input)}`);
    }
    const options = $('options').value.trim();
    if (options !== '') parts.push(`"options":${options}`);
    return `{${parts.join(',')}}`;
  }

  mode() {
    return this.form.elements['mode'].value;
  }

  submit() {
    if (this.run && !this.run.ended) return;
    clearProblem(this.problem);
    this.view.reset();
    const queue = this.queueName();
    if (!queue) {
      this.onProblem({code: 'invalid_queue_name', title: 'No queue', detail: 'Type the name of a queue.'});
      this.other.focus();
      return;
    }
    const hooks = {
      onProblem: (err, hint) => this.onProblem(err, hint),
      onEnd: () => this.buttons(),
    };
    this.run = this.mode() === 'detached' ? new DetachedRun(this.view, hooks) : new StreamedRun(this.view, hooks);
    this.view.say(`Submitting to queue ${queue}…`);
    this.buttons();
    this.run.start(queue, this.envelope());
    this.buttons();
  }

  onProblem(err, hint) {
    showProblem(this.problem, err, hint);
    this.problem.focus();
    this.buttons();
  }

  togglePause() {
    const r = this.run;
    if (!r || !r.disconnect) return;
    if (r.connected) r.disconnect();
    else r.reconnect();
    this.buttons();
  }

  /** Enables what makes sense now. */
  buttons() {
    const r = this.run;
    const live = !!r && !r.ended;
    const detached = live && r instanceof DetachedRun;
    this.submitBtn.disabled = live;
    // A detached job can be cancelled once the node has named it.
    this.cancelBtn.disabled = !live || r.stopped || (detached && !r.id);
    this.dropBtn.disabled = !detached || !r.connected;
    this.pauseBtn.disabled = !detached;
    const paused = detached && !!r.eventsURL && !r.connected;
    // The label says what a press does; the connection line says the state.
    this.pauseBtn.textContent = paused ? 'Reconnect' : 'Disconnect';
    this.form.dataset.running = String(live);
  }
}
