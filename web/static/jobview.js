// The job panel: the job's id, generation, attempt and sequence, its output
// token by token, every event and connection change in order, and the
// job's final state as the node reports it.

import {el, $} from './ui.js';

// Entries kept in the event list: a long job drops its oldest lines.
const MAX_LOG = 1000;

export class JobView {
  constructor() {
    this.id = $('job-id');
    this.gen = $('job-gen');
    this.attempt = $('job-attempt');
    this.seq = $('job-seq');
    this.conn = $('job-conn');
    this.state = $('job-state');
    this.status = $('job-status');
    this.output = $('output');
    this.finalBox = $('final');
    this.list = $('events');
    this.count = $('events-count');
    this.reset();
  }

  reset() {
    for (const e of [this.id, this.gen, this.attempt, this.seq, this.conn]) e.textContent = '–';
    this.setState('', '–');
    this.status.textContent = '';
    this.output.replaceChildren();
    this.finalBox.hidden = true;
    this.finalBox.replaceChildren();
    this.list.replaceChildren();
    this.events = 0;
    this.count.textContent = '0';
  }

  setJob(id) {
    this.id.textContent = id;
  }

  setConn(text) {
    this.conn.textContent = text;
    if (this.onConn) this.onConn();
  }

  /** state is a job state (data-state, for styling and tests), label its text. */
  setState(state, label = state) {
    this.state.dataset.state = state;
    this.state.textContent = label;
  }

  /** A line for screen readers and eyes: the latest thing that happened. */
  say(text) {
    this.status.textContent = text;
  }

  /** A job event (accepted, output, done, error) with its parsed data. */
  event(type, d) {
    if (d.job_id) this.id.textContent = d.job_id;
    if (d.gen !== undefined) this.gen.textContent = String(d.gen);
    if (d.attempt !== undefined) this.attempt.textContent = String(d.attempt);
    if (d.seq !== undefined) this.seq.textContent = String(d.seq);
    let summary = '';
    switch (type) {
      case 'accepted':
        this.setState('accepted', 'accepted');
        summary = `queue ${d.queue}, ttl ${d.ttl_ms} ms`;
        this.say(`Accepted on queue ${d.queue}: waiting for output…`);
        break;
      case 'output': {
        this.setState('running', 'streaming');
        const text = typeof d.data === 'string' ? d.data : JSON.stringify(d.data);
        this.output.append(el('span', {class: 'tok', 'data-seq': d.seq, text}));
        summary = JSON.stringify(d.data);
        break;
      }
      case 'done':
        this.setState(d.outcome || 'completed');
        summary = `${d.outcome || 'completed'}${d.result !== undefined ? ', result ' + JSON.stringify(d.result) : ''}`;
        this.say(`Job ${d.outcome || 'completed'}.`);
        break;
      case 'error':
        this.setState(d.outcome || 'failed', d.code && d.code !== d.outcome ? `${d.outcome || 'failed'} (${d.code})` : d.outcome);
        summary = `${d.outcome}${d.code !== d.outcome ? ': ' + d.code : ''}${d.detail ? ' — ' + d.detail : ''}`;
        this.say(`Job ${d.outcome}: ${d.code}.`);
        break;
    }
    this.log({type, seq: d.seq}, summary);
  }

  /** A control event of the stream (terminated, resync, gap). */
  control(type, d, text) {
    this.log({type, kind: 'control'}, text || JSON.stringify(d));
    this.say(text);
  }

  /** A connection change: opened, dropped, reconnecting, resumed. */
  note(text, kind = 'conn') {
    this.log({type: kind, kind: 'note'}, text);
  }

  /** A marker in the output where events were lost (resync, gap). */
  outputGap(text) {
    this.output.append(el('span', {class: 'gap', text: ` [${text}] `}));
  }

  log({type, seq, kind = 'event'}, summary) {
    const li = el('li', {class: kind, 'data-type': type, 'data-seq': seq},
      seq !== undefined ? el('span', {class: 'seq', text: String(seq)}) : null,
      el('span', {class: 'type', text: type}),
      el('span', {class: 'summary', text: summary}));
    this.list.append(li);
    while (this.list.childElementCount > MAX_LOG) this.list.firstElementChild.remove();
    this.count.textContent = String(++this.events);
    const wrap = this.list.parentElement;
    if (wrap) wrap.scrollTop = wrap.scrollHeight;
  }

  /** The job as GET /v1/jobs/{id} reports it once it ended. */
  final(v) {
    const rows = [
      ['State', v.state],
      ['Outcome', v.outcome],
      ['Code', v.code],
      ['Detail', v.detail],
      ['Worker', v.worker],
      ['Consumer', v.handled_by],
      ['Outputs', String(v.outputs)],
      ['Last seq', String(v.last_seq)],
      ['Ended', v.ended_at ? new Date(v.ended_at).toLocaleTimeString([], {hour12: false}) + '.' + v.ended_at.slice(20, 23) : ''],
    ].filter(([, val]) => val !== undefined && val !== '');
    this.finalBox.replaceChildren(
      el('h4', {text: 'Final state (GET ' + v.links.self + ')'}),
      el('dl', {class: 'facts'}, rows.map(([k, val]) => el('div', {}, el('dt', {text: k}), el('dd', {text: val})))),
    );
    this.finalBox.dataset.state = v.state;
    this.finalBox.dataset.outcome = v.outcome || '';
    this.finalBox.hidden = false;
    this.say(`Job ${v.state}${v.detail ? ': ' + v.detail : ''}.`);
    if (v.state && v.state !== this.state.dataset.state) {
      this.setState(v.state, v.code && v.code !== v.state ? `${v.state} (${v.code})` : v.state);
    }
  }
}
