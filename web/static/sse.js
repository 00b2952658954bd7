// A server-sent events parser for a fetch() response body, following the
// WHATWG "event stream interpretation" rules: lines end with CRLF, LF or CR
// (a CRLF may be split across chunks); a line starting with ":" is a
// comment; "field: value" loses one space after the colon; data lines join
// with "\n"; id sets the last event id (ignored if it holds a NUL) and
// stays set for the events after it; retry takes ASCII digits only; a
// blank line dispatches; an event without data is not dispatched; an
// unfinished event at the end of the stream is dropped.

/**
 * @typedef {{type: string, data: string, lastEventId: string}} SSEEvent
 */

export class SSEParser {
  /**
   * @param {(ev: SSEEvent) => void} onEvent
   * @param {{onRetry?: (ms: number) => void, onComment?: (text: string) => void}} [hooks]
   */
  constructor(onEvent, hooks = {}) {
    this.onEvent = onEvent;
    this.onRetry = hooks.onRetry || (() => {});
    this.onComment = hooks.onComment || (() => {});
    this.buf = '';
    this.skipLF = false; // the last chunk ended with CR: a leading LF belongs to it
    this.data = [];
    this.hasData = false;
    this.type = '';
    this.lastEventId = '';
  }

  /** Feeds decoded text, in pieces of any size. */
  feed(text) {
    if (text === '') return; // keeps skipLF for the chunk that has the text
    if (this.skipLF && text[0] === '\n') text = text.slice(1);
    this.skipLF = false;
    this.buf += text;
    let start = 0;
    for (;;) {
      let cr = this.buf.indexOf('\r', start);
      let lf = this.buf.indexOf('\n', start);
      if (cr < 0 && lf < 0) break;
      let end, next;
      if (cr >= 0 && (lf < 0 || cr < lf)) {
        end = cr;
        if (cr + 1 === this.buf.length) {
          next = cr + 1;
          this.skipLF = true; // maybe the CR of a CRLF whose LF is in the next chunk
        } else {
          next = this.buf[cr + 1] === '\n' ? cr + 2 : cr + 1;
        }
      } else {
        end = lf;
        next = lf + 1;
      }
      this.line(this.buf.slice(start, end));
      start = next;
    }
    this.buf = this.buf.slice(start);
  }

  /** Ends the stream: an event not yet terminated by a blank line is dropped. */
  end() {
    this.buf = '';
    this.data = [];
    this.hasData = false;
    this.type = '';
  }

  line(line) {
    if (line === '') {
      this.dispatch();
      return;
    }
    if (line[0] === ':') {
      this.onComment(line.slice(1).replace(/^ /, ''));
      return;
    }
    const colon = line.indexOf(':');
    let field = line, value = '';
    if (colon >= 0) {
      field = line.slice(0, colon);
      value = line.slice(colon + 1);
      if (value[0] === ' ') value = value.slice(1);
    }
    switch (field) {
      case 'event':
        this.type = value;
        break;
      case 'data':
        this.data.push(value);
        this.hasData = true;
        break;
      case 'id':
        if (!value.includes('\0')) this.lastEventId = value;
        break;
      case 'retry':
        if (/^[0-9]+$/.test(value)) this.onRetry(parseInt(value, 10));
        break;
      default:
        // Unknown fields are ignored.
    }
  }

  dispatch() {
    const hasData = this.hasData;
    const ev = {type: this.type || 'message', data: this.data.join('\n'), lastEventId: this.lastEventId};
    this.data = [];
    this.hasData = false;
    this.type = '';
    if (hasData) this.onEvent(ev);
  }
}

/**
 * Reads an SSE response body to its end, calling onEvent for each event.
 * Resolves when the body ends; rejects when reading fails (the connection
 * dropped, or signal aborted it).
 * @param {Response} res
 * @param {(ev: SSEEvent) => void} onEvent
 * @param {{onRetry?: (ms: number) => void, onComment?: (text: string) => void}} [hooks]
 * @param {string} [lastEventId] the id events start from (a resumed stream's events without id: keep it)
 */
export async function readEvents(res, onEvent, hooks = {}, lastEventId = '') {
  const parser = new SSEParser(onEvent, hooks);
  parser.lastEventId = lastEventId;
  const reader = res.body.getReader();
  // stream: true keeps a character split across chunks whole; the decoder
  // drops a leading BOM, as the spec asks.
  const decoder = new TextDecoder('utf-8');
  try {
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      parser.feed(decoder.decode(value, {stream: true}));
    }
    parser.feed(decoder.decode());
  } finally {
    parser.end();
    reader.releaseLock();
  }
}
