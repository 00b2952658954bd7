package integration_test

import (
	"testing"
)

// sseParserCasesJS runs the page's own SSE parser (web/static/sse.js), as
// the browser loads it, on the cases the event-stream rules are easy to get
// wrong on, fed in pieces; it returns the cases that failed.
const sseParserCasesJS = `(async () => {
	const base = document.querySelector('script[type=module]').src.replace(/app\.js$/, '');
	const {SSEParser, readEvents} = await import(base + 'sse.js');
	const run = (chunks) => {
		const got = [];
		const p = new SSEParser((e) => got.push([e.type, e.data, e.lastEventId]), {
			onRetry: (ms) => got.push(['retry', String(ms)]),
			onComment: (c) => got.push(['comment', c]),
		});
		for (const c of chunks) p.feed(c);
		p.end();
		return got;
	};
	const cases = [
		['multi-line data', ['data: a\ndata: b\n\n'], [['message', 'a\nb', '']]],
		['CRLF', ['event: x\r\ndata: 1\r\n\r\n'], [['x', '1', '']]],
		['CR alone', ['data: 1\r\rdata: 2\r\r'], [['message', '1', ''], ['message', '2', '']]],
		['CRLF split across chunks', ['data: 1\r', '\n\r', '\n'], [['message', '1', '']]],
		['CR, empty chunk, LF', ['data: 1\r', '', '\ndata: 2\n\n'], [['message', '1\n2', '']]],
		['field split across chunks', ['da', 'ta: hel', 'lo\n', '\n'], [['message', 'hello', '']]],
		['comment', [': heartbeat\ndata: x\n\n'], [['comment', 'heartbeat'], ['message', 'x', '']]],
		['id stays for later events', ['id: 7\ndata: a\n\ndata: b\n\n'], [['message', 'a', '7'], ['message', 'b', '7']]],
		['id with NUL ignored', ['id: 1\n\nid: a\u0000b\ndata: x\n\n'], [['message', 'x', '1']]],
		['empty id resets', ['id: 1\ndata: a\n\nid\ndata: b\n\n'], [['message', 'a', '1'], ['message', 'b', '']]],
		['retry digits only', ['retry: 1500\n\nretry: 1.5\n\nretry: x\n\n'], [['retry', '1500']]],
		['one space stripped, not two', ['data:a\ndata:  b\n\n'], [['message', 'a\n b', '']]],
		['field without colon', ['data\n\n'], [['message', '', '']]],
		['event without data: nothing', ['event: foo\n\n'], []],
		['type resets after dispatch', ['event: foo\ndata: 1\n\ndata: 2\n\n'], [['foo', '1', ''], ['message', '2', '']]],
		['unknown field ignored', ['foo: bar\ndata: y\n\n'], [['message', 'y', '']]],
		['unfinished event dropped at the end', ['data: x\n'], []],
		['colon in value kept', ['data: {"a":"b:c"}\n\n'], [['message', '{"a":"b:c"}', '']]],
	];
	const failed = [];
	for (const [name, chunks, want] of cases) {
		const got = run(chunks);
		if (JSON.stringify(got) !== JSON.stringify(want)) failed.push(name + ': got ' + JSON.stringify(got) + ', want ' + JSON.stringify(want));
	}
	// Bytes: a BOM first, and a two-byte character split across chunks.
	const enc = new TextEncoder().encode('\uFEFFdata: caf\u00e9\n\n');
	const cut = enc.length - 3; // inside the é
	const body = new ReadableStream({start(c) { c.enqueue(enc.slice(0, cut)); c.enqueue(enc.slice(cut)); c.close(); }});
	const got = [];
	await readEvents(new Response(body), (e) => got.push(e.data));
	if (JSON.stringify(got) !== JSON.stringify(['caf\u00e9'])) failed.push('bytes: got ' + JSON.stringify(got));
	return failed;
})()`

func testSSEParser(t *testing.T, p *webPage) {
	for _, f := range eval[[]string](p, sseParserCasesJS) {
		t.Errorf("sse.js: %s", f)
	}
}
