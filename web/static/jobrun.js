// One job's run, over either of the two ways a browser reads a stream:
// StreamedRun POSTs with fetch and reads the SSE body itself (resuming
// with a Last-Event-ID header when the node ends the stream early);
// DetachedRun POSTs for a 202 and streams through an EventSource, which
// resumes by itself. Both report to a JobView.

import {call, json, problemFrom, readToken, withParams, ApiError} from './api.js';
import {readEvents} from './sse.js';

const JOB_EVENTS = ['accepted', 'output', 'restart', 'done', 'error'];
const CONTROL_EVENTS = ['terminated', 'resync', 'gap'];
const TERMINAL = new Set(['completed', 'failed', 'cancelled', 'expired']);
// Resumes in a row that bring no event before a streamed run gives up.
const MAX_RESUMES = 10;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

class Run {
  /**
   * @param {import('./jobview.js').JobView} view
   * @param {{onProblem: (err: any, hint?: string) => void, onEnd: () => void}} hooks
   */
  constructor(view, hooks) {
    this.view = view;
    this.hooks = hooks;
    this.id = '';
    this.lastId = ''; // the SSE id (resume token) of the last job event
    this.lastSeq = 0;
    this.received = 0; // job events received
    this.skipThrough = 0; // after a resync: seqs already shown
    this.retryMs = 1000; // the node's retry: hint
    this.finished = false; // the terminal event came
    this.stopped = false; // the user cancelled
    this.ended = false; // end() ran
  }

  /** One event from either transport: type, its data, its SSE id. */
  handle(type, data, id) {
    let d;
    try {
      d = JSON.parse(data);
    } catch {
      this.view.note(`unreadable ${type} event: ${data.slice(0, 80)}`, 'bad');
      return;
    }
    if (JOB_EVENTS.includes(type)) {
      if (d.seq !== undefined && d.seq <= this.skipThrough) return; // shown before the resync
      if (id) this.lastId = id;
      if (d.job_id && !this.id) this.id = d.job_id;
      if (d.seq !== undefined) this.lastSeq = d.seq;
      this.received++;
      this.view.event(type, d);
      if (type === 'done' || type === 'error') {
        this.finished = true;
        this.onTerminal();
      }
      return;
    }
    switch (type) {
      case 'terminated':
        this.view.control(type, d, `The node ended the stream (${d.reason}) after seq ${d.resume_after_seq}; resuming from there.`);
        break;
      case 'resync':
        // The restart from the oldest event kept opens with a gap event
        // for what is gone: the output marks it then.
        this.view.control(type, d, `resync: the job's history now starts at seq ${d.oldest_seq}; what came after seq ` +
          `${this.lastSeq} before it is gone. Starting over from the oldest event kept.`);
        this.skipThrough = this.lastSeq;
        this.onResync();
        break;
      case 'gap': {
        const from = Math.max(d.from_seq, this.skipThrough + 1);
        if (d.to_seq >= from) {
          this.view.control(type, d, `gap: seq ${from}–${d.to_seq} skipped`);
          this.view.outputGap(`seq ${from}–${d.to_seq} skipped`);
        }
        break;
      }
    }
  }

  onTerminal() {}

  onResync() {}

  /** Shows a refusal or failure and ends the run. */
  failed(err, hint) {
    if (err && err.name === 'AbortError') return;
    this.hooks.onProblem(err, hint);
    this.view.setConn('closed');
    this.view.say(`Failed: ${err.code || err.status || ''} ${err.detail || err.message || ''}`.trim());
    this.end();
  }

  /** The job's final state from the node, polled until it is terminal. */
  async showFinal() {
    if (!this.id) return;
    const path = '/v1/jobs/' + encodeURIComponent(this.id);
    for (let i = 0; i < 50; i++) {
      let v;
      try {
        v = await json(path);
      } catch (err) {
        this.hooks.onProblem(err, 'Reading the final state failed.');
        return;
      }
      if (TERMINAL.has(v.state) || i === 49) {
        this.view.final(v);
        return;
      }
      await sleep(100);
    }
  }

  end() {
    if (this.ended) return;
    this.ended = true;
    this.hooks.onEnd();
  }
}

export class StreamedRun extends Run {
  async start(queue, body) {
    this.ctrl = new AbortController();
    const signal = this.ctrl.signal;
    this.view.setConn('posting…');
    let res;
    try {
      res = await call(`/v1/queues/${encodeURIComponent(queue)}/jobs`, {
        method: 'POST',
        headers: {'Content-Type': 'application/json', 'Accept': 'text/event-stream'},
        body, signal,
      });
    } catch (err) {
      return this.failed(err);
    }
    if (!res.ok) return this.failed(await problemFrom(res));
    const ct = res.headers.get('Content-Type') || '';
    if (!ct.startsWith('text/event-stream')) {
      return this.failed(new ApiError({status: res.status, code: 'not_a_stream', title: 'Not an event stream', detail: `the node answered ${ct}`}));
    }
    this.id = res.headers.get('X-Job-Id') || '';
    this.view.setJob(this.id);
    this.view.note(`POST answered ${res.status}: streaming job ${this.id}`);
    await this.read(res, 'POST');
    await this.resumeUntilDone(signal);
  }

  /** Resumes the stream, with Last-Event-ID, until the terminal event. */
  async resumeUntilDone(signal) {
    let tries = 0;
    while (!this.finished && !this.stopped) {
      if (++tries > MAX_RESUMES) {
        return this.failed(new ApiError({code: 'resume_failed', title: 'Could not resume the stream', detail: `${MAX_RESUMES} attempts brought no event`}));
      }
      await sleep(this.retryMs);
      if (this.stopped) return;
      const headers = {};
      const from = this.resyncing ? '' : this.lastId;
      this.resyncing = false;
      if (from) headers['Last-Event-ID'] = from;
      this.view.setConn('resuming…');
      this.view.note(from ? `resuming: GET events with Last-Event-ID of seq ${this.lastSeq}` : 'starting over: GET events without a position');
      this.view.say(from ? `Resuming after seq ${this.lastSeq}…` : 'Starting over from the oldest event kept…');
      let res;
      try {
        res = await call(`/v1/jobs/${encodeURIComponent(this.id)}/events`, {headers, signal});
      } catch (err) {
        if (err.name === 'AbortError') return;
        this.view.note(`no answer: ${err.detail || err.message}`);
        continue;
      }
      if (res.status === 204) {
        this.view.note('204: the node has nothing more to send');
        break;
      }
      if (!res.ok) return this.failed(await problemFrom(res), 'The stream could not be resumed.');
      const before = this.received;
      await this.read(res, 'GET');
      if (this.received > before) tries = 0;
    }
    if (!this.stopped && !this.finished) {
      await this.showFinal();
      this.end();
    }
  }

  async read(res, how) {
    this.view.setConn(`streaming (${how})`);
    try {
      await readEvents(res, (ev) => this.handle(ev.type, ev.data, ev.lastEventId),
        {onRetry: (ms) => { this.retryMs = ms; }}, this.lastId);
      if (!this.finished && !this.stopped) {
        this.view.note('the stream ended before the job did');
        this.view.say(`The stream ended after seq ${this.lastSeq}, before the job did: resuming…`);
      }
    } catch (err) {
      if (this.stopped) return;
      this.view.note(`connection lost: ${err.message || err}`, 'dropped');
      this.view.say(`Connection lost after seq ${this.lastSeq}: resuming…`);
    }
    if (!this.stopped) this.view.setConn(this.finished ? 'closed (job ended)' : 'lost');
  }

  onTerminal() {
    this.view.setConn('closed (job ended)');
    // The terminal event is the last: the body ends right after it.
    this.showFinal().then(() => this.end());
  }

  onResync() {
    this.resyncing = true;
  }

  /** Cancel by leaving: the node cancels a streamed job whose client left. */
  async cancel() {
    if (this.stopped || this.finished) return;
    this.stopped = true;
    this.ctrl.abort();
    this.view.setConn('closed by you');
    this.view.note('you closed the stream: a job streamed to its POST is cancelled when its client leaves');
    this.view.say('Cancelling: disconnected, waiting for the node…');
    await this.showFinal();
    this.end();
  }
}

export class DetachedRun extends Run {
  async start(queue, body) {
    this.view.setConn('posting…');
    let v;
    try {
      v = await json(`/v1/queues/${encodeURIComponent(queue)}/jobs`, {
        method: 'POST', headers: {'Content-Type': 'application/json'}, body,
      });
    } catch (err) {
      return this.failed(err);
    }
    this.id = v.job_id;
    this.eventsURL = v.links.events;
    this.view.setJob(v.job_id);
    this.view.setState(v.state);
    this.view.setConn('connecting…'); // and the buttons follow: the job can be cancelled now
    this.view.note(`202 Accepted: job ${v.job_id} is ${v.state}; opening an EventSource on ${v.links.events}`);
    this.opens = 0;
    this.open('');
  }

  /**
   * Opens an EventSource from after (a resume token; '' from the start).
   * An EventSource cannot send the key: it reads with a read token, asked
   * for once with the key (and again when it expired, see probe).
   */
  open(after) {
    if (this.token) {
      this.openWith(after);
      return;
    }
    readToken(`/v1/jobs/${encodeURIComponent(this.id)}/read-token`).then((tok) => {
      if (this.finished) return;
      this.token = tok;
      this.openWith(after);
    }, (err) => this.failed(err, 'No read token for the stream.'));
  }

  /** The stream's URL with the read token, from after. */
  streamURL(after) {
    const params = {read_token: this.token};
    // EventSource cannot set Last-Event-ID on a new object: the query
    // parameter says the same. When this EventSource reconnects by itself,
    // it sends its newer id in the header, which the node prefers.
    if (after) params.last_event_id = after;
    return withParams(this.eventsURL, params);
  }

  openWith(after) {
    const url = this.streamURL(after);
    const es = new EventSource(url);
    this.es = es;
    let opensHere = 0;
    es.addEventListener('open', () => {
      if (es !== this.es) return;
      this.renewed = false;
      opensHere++;
      this.opens++;
      let how;
      if (this.opens === 1) how = 'open';
      else if (opensHere === 1 && after) how = `resumed after seq ${this.lastSeq} (new EventSource, ?last_event_id=)`;
      else if (opensHere === 1) how = 'reopened from the start';
      else how = `resumed by the browser itself (Last-Event-ID) after seq ${this.lastSeq}`;
      this.view.setConn(how);
      this.view.note(`connection ${this.opens}: ${how}`, this.opens === 1 ? 'conn' : 'resumed');
      if (this.opens > 1) this.view.say(how);
    });
    for (const t of [...JOB_EVENTS.filter((t) => t !== 'error'), ...CONTROL_EVENTS]) {
      es.addEventListener(t, (e) => {
        if (es === this.es) this.handle(t, e.data, e.lastEventId);
      });
    }
    // The job's "error" event and the EventSource's own connection error
    // share a name; only the job's is a MessageEvent with data.
    es.addEventListener('error', (e) => {
      if (es !== this.es) return;
      if (e instanceof MessageEvent) this.handle('error', e.data, e.lastEventId);
      else this.connectionError(es);
    });
  }

  connectionError(es) {
    if (this.finished) return;
    if (es.readyState === EventSource.CONNECTING) {
      this.view.setConn('reconnecting (the browser, with Last-Event-ID)…');
      this.view.note('connection lost: the browser reconnects by itself', 'dropped');
      this.view.say(`Connection lost after seq ${this.lastSeq}: the browser reconnects by itself…`);
      return;
    }
    // CLOSED: the node answered something other than a stream. An
    // EventSource does not say what; the same request by fetch does (the
    // same request: the read token, no key).
    this.es = null;
    this.view.setConn('closed');
    this.probe();
  }

  async probe() {
    const ctrl = new AbortController();
    const headers = this.lastId ? {'Last-Event-ID': this.lastId} : {};
    try {
      const res = await call(this.streamURL(''), {headers, signal: ctrl.signal}, {auth: false});
      if (res.status === 401 && !this.renewed) {
        // The read token expired: one new one, with the key.
        this.renewed = true;
        this.token = '';
        this.view.note('the read token expired: asking for a new one');
        this.open(this.lastId);
        return;
      }
      if (res.status === 204) {
        this.view.note('204: the node has nothing more to send');
      } else if (!res.ok) {
        return this.failed(await problemFrom(res), 'The EventSource was refused: this is what the node says.');
      } else {
        this.view.note('the stream answers again: reopening');
        this.open(this.lastId);
        return;
      }
    } catch (err) {
      return this.failed(err);
    } finally {
      ctrl.abort();
    }
    await this.showFinal();
    this.end();
  }

  onTerminal() {
    if (this.es) this.es.close();
    this.es = null;
    this.view.setConn('closed (job ended)');
    this.showFinal().then(() => this.end());
  }

  onResync() {
    // The EventSource would reconnect with the same stale id and get the
    // same resync: start over without a position instead.
    if (this.es) this.es.close();
    this.open('');
  }

  /** Closes the EventSource and at once opens another from the last id. */
  drop() {
    if (!this.es || this.finished) return;
    this.es.close();
    this.view.note(`you dropped the connection after seq ${this.lastSeq}`, 'dropped');
    this.view.say(`You dropped the connection after seq ${this.lastSeq}: resuming from there…`);
    this.open(this.lastId);
  }

  /** Closes the EventSource; the job runs on. */
  disconnect() {
    if (!this.es || this.finished) return;
    this.es.close();
    this.es = null;
    this.view.setConn('disconnected by you (the job runs on)');
    this.view.note(`you disconnected after seq ${this.lastSeq}`, 'dropped');
    this.view.say(`Disconnected by you after seq ${this.lastSeq}: the job runs on. Reconnect to read the rest.`);
  }

  reconnect() {
    if (this.es || this.finished) return;
    this.open(this.lastId);
  }

  get connected() {
    return !!this.es;
  }

  /** DELETE: the node cancels the job and tells its worker at once. */
  async cancel() {
    if (this.stopped || this.finished) return;
    this.stopped = true;
    let v;
    try {
      v = await json('/v1/jobs/' + encodeURIComponent(this.id), {method: 'DELETE'});
    } catch (err) {
      this.stopped = false;
      this.hooks.onProblem(err, 'The cancel was not accepted.');
      return;
    }
    this.view.note(`DELETE answered: the job is ${v.state}${v.code && v.code !== v.state ? ' (' + v.code + ')' : ''}`);
    if (!this.es) {
      // Nothing listening: the node's answer is the final state.
      this.view.final(v);
      this.finished = true;
      this.end();
    }
    // Otherwise the stream brings the terminal event.
  }
}
