// The job panel: the job's id, generation, attempt and sequence, its output
// token by token, every event and connection change in order, and the
// job's final state as the node reports it.

import {el, $} from './ui.js';

// Entries kept in the event list: a long job drops its oldest lines.
const MAX_LOG = 1000;
// While output streams, the status line (a live region a screen reader
// reads out) says how far it got at most this often.
const PROGRESS_EVERY_MS = 2000;

/** atBottom reports whether box is scrolled to (within a line of) its end. */
function atBottom(box) {
  return box.scrollHeight - box.scrollTop - box.clientHeight < 24;
}

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
    this.outputTitle = $('output-title');
    this.finalBox = $('final');
    this.list = $('events');
    this.count = $('events-count');
    this.sent = $('sent');
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
    this.outputs = 0;
    this.progressAt = 0; // when the status line last said how far the output got; 0: it says something else
    this.count.textContent = '0';
  }

  /** What the job was sent: the queue, and the envelope as posted. */
  setSent(queue, body) {
    let text = body;
    try {
      text = JSON.stringify(JSON.parse(body), null, 2);
    } catch {
      // Not JSON: the node refuses it, and this shows what it got.
    }
    this.sent.textContent = `POST /v1/queues/${queue}/jobs\n${text}`;
  }

  /** chat: the output is a chat reply. */
  setChat(chat) {
    this.outputTitle.textContent = chat ? 'Reply' : 'Output';
    this.output.classList.toggle('chat-reply', chat);
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
    this.progressAt = 0;
  }

  /** The status line says how far the output got: at once after it said anything else, then every few seconds. */
  progress(seq) {
    const now = Date.now();
    if (this.progressAt && now - this.progressAt < PROGRESS_EVERY_MS) return;
    const n = this.outputs;
    this.status.textContent = `Streaming: ${n} output${n === 1 ? '' : 's'} so far (seq ${seq}).`;
    this.progressAt = now;
  }

  /** A job event (accepted, output, restart, done, error) with its parsed data. */
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
        const follow = atBottom(this.output);
        this.output.append(el('span', {class: 'tok', 'data-seq': d.seq, text}));
        if (follow) this.output.scrollTop = this.output.scrollHeight;
        this.outputs++;
        this.progress(d.seq);
        summary = JSON.stringify(d.data);
        break;
      }
      case 'restart':
        // The output so far belongs to the run that was lost: marked, and
        // the new run's follows it.
        this.setState('running', 'restarted');
        this.outputGap(`restart: ${d.reason}, the output above is abandoned; attempt ${d.attempt}`);
        summary = `${d.reason} after seq ${d.last_seq}: restart ${d.restarts} of ${d.max_restarts}, generation ${d.gen}`;
        this.say(`The job's worker was lost (${d.reason}); it runs again from the start.`);
        break;
      case 'done':
        this.setState(d.outcome || 'completed');
        summary = `${d.outcome || 'completed'}${d.result !== undefined ? ', result ' + JSON.stringify(d.result) : ''}`;
        this.say(`Job ${d.outcome || 'completed'}: ${this.outputs} output${this.outputs === 1 ? '' : 's'}.`);
        break;
      case 'error':
        this.setState(d.outcome || 'failed', d.code && d.code !== d.outcome ? `${d.outcome || 'failed'} (${d.code})` : d.outcome);
        summary = `${d.outcome}${d.code !== d.outcome ? ': ' + d.code : ''}${d.detail ? ' — ' + d.detail : ''}`;
        this.say(`Job ${d.outcome}: ${d.code}${d.detail ? ' — ' + d.detail : ''}.`);
        break;
    }
    this.log({type, seq: d.seq}, summary);
  }

  /** A control event of the stream (terminated, resync, gap). */
  control(type, d, text) {
    this.log({type, kind: 'control'}, text || JSON.stringify(d));
    this.say(text);
  }

  /**
   * A connection change: opened, dropped, reconnecting, resumed. say puts
   * it on the status line too (what a screen reader hears).
   */
  note(text, kind = 'conn', say = false) {
    this.log({type: kind, kind: 'note'}, text);
    if (say) this.say(text);
  }

  /** A marker in the output where events were lost (resync, gap). */
  outputGap(text) {
    this.output.append(el('span', {class: 'gap', text: ` [${text}] `}));
  }

  /**
   * An entry of the event list. The list follows new entries while it is
   * scrolled to its end; scrolled back by the reader, it stays where they
   * are reading.
   */
  log({type, seq, kind = 'event'}, summary) {
    const follow = atBottom(this.list);
    const li = el('li', {class: kind, 'data-type': type, 'data-seq': seq},
      seq !== undefined ? el('span', {class: 'seq', text: String(seq)}) : null,
      el('span', {class: 'type', text: type}),
      el('span', {class: 'summary', text: summary}));
    this.list.append(li);
    while (this.list.childElementCount > MAX_LOG) this.list.firstElementChild.remove();
    this.count.textContent = String(++this.events);
    if (follow) this.list.scrollTop = this.list.scrollHeight;
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
    // The facts say the job's last seq as the node knows it: events the
    // page did not read (a streamed job cancelled by closing its stream
    // ends with an event nobody reads) are said, not silently skipped.
    const shown = Number(this.seq.textContent) || 0;
    if (v.last_seq !== undefined && v.last_seq !== shown) {
      if (v.last_seq > shown) {
        this.note(`the job's last event is seq ${v.last_seq}: ${v.last_seq - shown === 1 ? `seq ${v.last_seq}` : `seq ${shown + 1}–${v.last_seq}`} came after the page stopped reading`);
      }
      this.seq.textContent = String(v.last_seq);
    }
    this.say(`Job ${v.state}${v.detail ? ': ' + v.detail : ''}.`);
    if (v.state && v.state !== this.state.dataset.state) {
      this.setState(v.state, v.code && v.code !== v.state ? `${v.state} (${v.code})` : v.state);
    }
  }
}
