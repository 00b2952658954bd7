package integration_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/switchyard/switchyard/worker"
)

// browserPage is the whole client: a real EventSource on the job's events,
// same-origin with the page. The EventSource reconnects by itself and
// sends the last id it saw as Last-Event-ID; the page does nothing for it.
const browserPage = `<!doctype html>
<meta charset="utf-8">
<title>switchyard events</title>
<script>
window.seqs = [];        // seq of every job event, in the order delivered
window.ids = [];         // its SSE id (the resume token)
window.types = [];       // its event name
window.other = [];       // resync / terminated control events, if any
window.opens = 0;        // connections opened (first one and reconnects)
window.connErrors = 0;   // EventSource's own error events (drops)
window.finished = false; // a terminal job event arrived
window.closedEarly = false; // EventSource gave up before a terminal event
function start(id) {
  const es = new EventSource('/v1/jobs/' + encodeURIComponent(id) + '/events');
  es.onopen = () => { window.opens++; };
  const onEvent = (e) => {
    // The job's "error" event and EventSource's own connection error share
    // a name; only the job's is a MessageEvent with data.
    if (!(e instanceof MessageEvent)) {
      window.connErrors++;
      if (es.readyState === EventSource.CLOSED && !window.finished) window.closedEarly = true;
      return;
    }
    const seq = JSON.parse(e.data).seq;
    window.seqs.push(seq);
    window.ids.push(e.lastEventId);
    // Test instrumentation, not part of the client: tells the test's proxy
    // which events the page has, so it cuts only after they are in.
    fetch('/seen?seq=' + seq, {method: 'POST'});
    window.types.push(e.type);
    if (e.type === 'done' || e.type === 'error') {
      window.finished = true;
      es.close();
    }
  };
  for (const t of ['accepted', 'output', 'done', 'error']) es.addEventListener(t, onEvent);
  for (const t of ['resync', 'terminated']) es.addEventListener(t, (e) => window.other.push(e.type + ' ' + e.data));
}
</script>
<p>switchyard</p>
`

// browserReconnectMS is sent to the EventSource as an SSE "retry:" field by
// the test's proxy. Without it Chromium waits its default 3 s before each
// reconnect; the value changes only that wait, nothing of how it resumes.
const browserReconnectMS = 100

// errCut is what the cutting writer returns once its byte budget is spent:
// ReverseProxy then closes the upstream body and aborts the response with
// http.ErrAbortHandler, so the browser sees the connection die mid-stream.
var errCut = errors.New("test proxy: connection cut")

// cutInto is how many bytes of the event after the last one let through
// reach the client before its connection is cut: the cut falls in the
// middle of that event, which the client must then not see.
const cutInto = 20

// cuttingWriter passes an SSE response through and, with events set, lets
// exactly that many complete events (blocks with an id: line) reach the
// client, then cutInto bytes of the next block, then fails the write. It
// follows the stream's lines across writes, so the cut falls at the same
// event whatever the chunking: a replay of many events in one write is cut
// as precisely as a live stream.
//
// settle runs once the events to let through are flushed, before the cut:
// Chromium may drop what it received just before a connection dies, so the
// test waits there until the page has them.
type cuttingWriter struct {
	http.ResponseWriter
	events   int // complete events to let through; 0: never cut
	settle   func()
	passed   int // complete events written so far
	line     []byte
	hasID    bool // the current block has an id: line
	blockLen int  // bytes of the current block written so far
}

func (c *cuttingWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

func (c *cuttingWriter) Flush() { _ = http.NewResponseController(c.ResponseWriter).Flush() }

func (c *cuttingWriter) WriteHeader(code int) {
	c.ResponseWriter.WriteHeader(code)
	if code == http.StatusOK && strings.HasPrefix(c.Header().Get("Content-Type"), "text/event-stream") {
		// A field-only block: sets the reconnection time, dispatches nothing.
		_, _ = fmt.Fprintf(c.ResponseWriter, "retry: %d\n\n", browserReconnectMS)
	}
}

func (c *cuttingWriter) Write(p []byte) (int, error) {
	if c.events == 0 {
		return c.ResponseWriter.Write(p)
	}
	done := 0 // bytes of p written
	for i, b := range p {
		if c.passed == c.events && c.blockLen == cutInto {
			n, _ := c.ResponseWriter.Write(p[done:i])
			c.Flush()
			return done + n, errCut
		}
		c.blockLen++
		switch {
		case b != '\n':
			c.line = append(c.line, b)
			continue
		case len(c.line) == 0: // a blank line ends the block
			if c.hasID {
				c.passed++
			}
			c.hasID, c.blockLen = false, 0
			if c.passed == c.events && c.settle != nil {
				n, err := c.ResponseWriter.Write(p[done : i+1])
				done += n
				if err != nil {
					return done, err
				}
				c.Flush()
				c.settle()
				c.settle = nil
			}
		case bytes.HasPrefix(c.line, []byte("id:")):
			c.hasID = true
		}
		c.line = c.line[:0]
	}
	n, err := c.ResponseWriter.Write(p[done:])
	return done + n, err
}

// seenSeqs is the highest seq the page reported having.
type seenSeqs struct {
	mu      sync.Mutex
	max     uint64
	changed chan struct{}
}

func (s *seenSeqs) add(seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if seq > s.max {
		s.max = seq
		close(s.changed)
		s.changed = make(chan struct{})
	}
}

// wait reports whether the page has seq within d.
func (s *seenSeqs) wait(seq uint64, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		s.mu.Lock()
		got, changed := s.max, s.changed
		s.mu.Unlock()
		if got >= seq {
			return true
		}
		select {
		case <-changed:
		case <-timer.C:
			return false
		}
	}
}

// tLogWriter sends a logger's lines to the test log.
type tLogWriter struct{ tb testing.TB }

func (w tLogWriter) Write(p []byte) (int, error) {
	w.tb.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// A real browser's EventSource, its connection dropped twice mid-job by a
// proxy — in the middle of an event, at two different positions — resumes
// by itself with the signed tokens the node put in the SSE ids, each time
// right after the last event it received, and sees every event exactly
// once, in order. A token edited by hand is refused.
func TestBrowserEventSourceResumes(t *testing.T) {
	t.Parallel()
	t0 := time.Now()

	n := MustStartNode(t, nil)
	const outputs = 60
	MustStartWorker(t, n, worker.Config{}, func(ctx context.Context, _ *worker.Job, out *worker.Output) (any, error) {
		for i := range outputs {
			if err := out.Send(ctx, fmt.Sprintf("token-%02d", i)); err != nil {
				return nil, err
			}
			time.Sleep(4 * time.Millisecond)
		}
		return nil, nil
	})
	// After the node: the browser closes first.
	br := mustStartBrowser(t)

	// The page's origin: the page itself, and /v1/ reverse-proxied to the
	// node with the first two event streams cut in the middle of an event:
	// the first after 5 events (seqs 1-5), the second — resumed after seq
	// 5 — after 10 more (6-15). Two cuts at two positions: two distinct
	// resumes, after seq 5 and after seq 15.
	cuts := []int{5, 10}
	wantResumes := []uint64{5, 15}
	target, err := url.Parse(baseURL(n))
	if err != nil {
		t.Fatal(err)
	}
	upstream := &http.Transport{}
	defer upstream.CloseIdleConnections()
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.Transport = upstream
	proxy.FlushInterval = -1 // stream every write: this is SSE
	proxy.ErrorLog = log.New(tLogWriter{t}, "proxy: ", 0)
	var (
		mu      sync.Mutex
		lastIDs []string // Last-Event-ID of each events request, in order
	)
	pageHas := &seenSeqs{changed: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /seen", func(w http.ResponseWriter, r *http.Request) {
		if seq, err := strconv.ParseUint(r.URL.Query().Get("seq"), 10, 64); err == nil {
			pageHas.add(seq)
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = io.WriteString(w, browserPage)
	})
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, "/events") {
			proxy.ServeHTTP(w, r)
			return
		}
		mu.Lock()
		lastIDs = append(lastIDs, r.Header.Get("Last-Event-ID"))
		k := len(lastIDs)
		mu.Unlock()
		cw := &cuttingWriter{ResponseWriter: w}
		if k <= len(cuts) {
			want := wantResumes[k-1]
			cw.events = cuts[k-1]
			cw.settle = func() {
				// On time out, cut anyway: the resume checks below say
				// what went wrong.
				if !pageHas.wait(want, 10*time.Second) {
					t.Logf("cut %d: the page did not report seq %d", k, want)
				}
			}
		}
		proxy.ServeHTTP(cw, r)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	defer srv.CloseClientConnections()

	tBrowser := time.Since(t0)
	step := br.step
	if err := chromedp.Do(step(10*time.Second), chromedp.Navigate(srv.URL+"/")); err != nil {
		t.Fatalf("load the page: %v", err)
	}

	// The job runs on its own (202): no stream holds it.
	res := post(t.Context(), t, n, "demo", `{"input":"x","ttl_ms":20000}`, false)
	if res.StatusCode != http.StatusAccepted {
		t.Fatalf("submit: %d", res.StatusCode)
	}
	var job struct {
		JobID string `json:"job_id"`
	}
	decode(t, res, &job)
	tStart := time.Now()
	idJS, _ := json.Marshal(job.JobID)
	if err := chromedp.Do(step(5*time.Second), chromedp.Evaluate[chromedp.Void](fmt.Sprintf("start(%s)", idJS))); err != nil {
		t.Fatalf("open the EventSource: %v", err)
	}

	if _, err := chromedp.Run(step(25*time.Second), chromedp.Poll[bool](`window.finished || window.closedEarly`,
		chromedp.WithPollingInterval(10*time.Millisecond), chromedp.WithPollingTimeout(20*time.Second))); err != nil {
		t.Fatalf("waiting for the terminal event: %v", err)
	}
	tStream := time.Since(tStart)

	type pageState struct {
		Seqs        []uint64 `json:"seqs"`
		IDs         []string `json:"ids"`
		Types       []string `json:"types"`
		Other       []string `json:"other"`
		Opens       int      `json:"opens"`
		ConnErrors  int      `json:"connErrors"`
		Finished    bool     `json:"finished"`
		ClosedEarly bool     `json:"closedEarly"`
	}
	st, err := chromedp.Run(step(5*time.Second), chromedp.Evaluate[pageState](`({
		seqs: window.seqs, ids: window.ids, types: window.types, other: window.other,
		opens: window.opens, connErrors: window.connErrors,
		finished: window.finished, closedEarly: window.closedEarly})`))
	if err != nil {
		t.Fatalf("read the page: %v", err)
	}
	mu.Lock()
	reqs := append([]string(nil), lastIDs...)
	mu.Unlock()
	t.Logf("browser up in %s (incl. node and worker); stream done %s after the EventSource opened: "+
		"%d events, %d events requests, %d opens, %d connection errors",
		tBrowser, tStream.Round(time.Millisecond), len(st.Seqs), len(reqs), st.Opens, st.ConnErrors)

	if !st.Finished || st.ClosedEarly {
		t.Fatalf("EventSource stopped before the terminal event; seqs %v, types %v, other %v", st.Seqs, st.Types, st.Other)
	}
	for _, o := range st.Other {
		if strings.HasPrefix(o, "resync") {
			t.Errorf("resume refused with %s", o)
		} else {
			t.Logf("control event (the EventSource resumes after it): %s", o)
		}
	}
	for i, s := range st.Seqs {
		if s != uint64(i+1) {
			t.Fatalf("position %d has seq %d (a gap or a duplicate): %v", i, s, st.Seqs)
		}
	}
	if want := outputs + 2; len(st.Seqs) != want { // accepted, outputs, done
		t.Fatalf("got %d events, want %d: %v", len(st.Seqs), want, st.Types)
	}
	if first, last := st.Types[0], st.Types[len(st.Types)-1]; first != "accepted" || last != "done" {
		t.Fatalf("events from %s to %s, want accepted to done", first, last)
	}
	if len(reqs) != 3 {
		t.Fatalf("the proxy saw %d events requests, want 3 (two cut, one to the end)", len(reqs))
	}
	if reqs[0] != "" {
		t.Errorf("the first events request carried Last-Event-ID %q", reqs[0])
	}
	seen := map[string]bool{}
	for i, id := range st.IDs {
		seen[id] = true
		if id == "" {
			t.Errorf("event %d (seq %d) has no id", i, st.Seqs[i])
		}
	}
	for i, id := range reqs[1:] {
		if id == "" {
			t.Errorf("events request %d carried no Last-Event-ID", i+2)
		} else if !seen[id] {
			t.Errorf("events request %d carried a Last-Event-ID the page never received: %q", i+2, id)
		} else if after := st.Seqs[slices.Index(st.IDs, id)]; after != wantResumes[i] {
			t.Errorf("events request %d resumed after seq %d, want %d: the last event before cut %d", i+2, after, wantResumes[i], i+1)
		} else {
			t.Logf("events request %d resumed after seq %d", i+2, after)
		}
	}
	if got := metric(t, n, "switchyard_stream_resumes_accepted_total", map[string]string{"transport": "sse"}); got < 2 {
		t.Errorf("switchyard_stream_resumes_accepted_total = %v, want >= 2", got)
	}
	if t.Failed() {
		return
	}

	t.Run("TamperedTokenRefused", func(t *testing.T) {
		// A real id from the stream, one character in the middle changed.
		// Not the last character of a segment, whose low bits base64 may
		// not carry.
		tok := st.IDs[len(st.IDs)/2]
		i := len(tok) / 2
		for i < len(tok)-1 && (tok[i] == '.' || tok[i+1] == '.') {
			i++
		}
		if i >= len(tok)-1 {
			t.Fatalf("no character to flip in %q", tok)
		}
		b := []byte(tok)
		if b[i] == 'A' {
			b[i] = 'B'
		} else {
			b[i] = 'A'
		}
		tampered := string(b)
		idJS, _ := json.Marshal(job.JobID)
		tokJS, _ := json.Marshal(tampered)
		type answer struct {
			Status int    `json:"status"`
			Body   string `json:"body"`
		}
		got, err := chromedp.Run(step(10*time.Second), chromedp.Evaluate[answer](fmt.Sprintf(`(async (id, tok) => {
			const r = await fetch('/v1/jobs/' + encodeURIComponent(id) + '/events', {headers: {'Last-Event-ID': tok}});
			return {status: r.status, body: await r.text()};
		})(%s, %s)`, idJS, tokJS), chromedp.EvalAwaitPromise))
		if err != nil {
			t.Fatalf("fetch from the page: %v", err)
		}
		mu.Lock()
		sent := lastIDs[len(lastIDs)-1]
		mu.Unlock()
		if sent != tampered {
			t.Fatalf("the proxy saw Last-Event-ID %q, want the tampered %q", sent, tampered)
		}
		var p struct {
			Code string `json:"code"`
		}
		if err := json.Unmarshal([]byte(got.Body), &p); err != nil {
			t.Fatalf("status %d, body %q: %v", got.Status, got.Body, err)
		}
		if got.Status != http.StatusBadRequest || p.Code != "invalid_resume_token" {
			t.Fatalf("tampered token: %d %s, want 400 invalid_resume_token", got.Status, got.Body)
		}
	})

	// A web app that POSTs with fetch and reads the SSE body from a
	// ReadableStream sees every event as it is produced, in order.
	t.Run("FetchReadableStream", func(t *testing.T) {
		type result struct {
			Types  []string `json:"types"`
			Seqs   []int    `json:"seqs"`
			Chunks int      `json:"chunks"`
			Status int      `json:"status"`
		}
		got, err := chromedp.Run(step(15*time.Second), chromedp.Evaluate[result](`(async () => {
			const r = await fetch('/v1/queues/demo/jobs', {
				method: 'POST',
				headers: {'Content-Type': 'application/json', 'Accept': 'text/event-stream'},
				body: JSON.stringify({input: 'x', ttl_ms: 20000}),
			});
			const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
			let buf = '', chunks = 0;
			const types = [], seqs = [];
			for (;;) {
				const {value, done} = await reader.read();
				if (done) break;
				chunks++;
				buf += value;
				let i;
				while ((i = buf.indexOf('\n\n')) >= 0) {
					const block = buf.slice(0, i);
					buf = buf.slice(i + 2);
					let type = 'message', data = '';
					for (const line of block.split('\n')) {
						if (line.startsWith('event:')) type = line.slice(6).trim();
						if (line.startsWith('data:')) data += line.slice(5).trim();
					}
					if (!data) continue;
					types.push(type);
					seqs.push(JSON.parse(data).seq);
				}
			}
			return {types, seqs, chunks, status: r.status};
		})()`, chromedp.EvalAwaitPromise))
		if err != nil {
			t.Fatalf("fetch from the page: %v", err)
		}
		if got.Status != 200 || len(got.Types) == 0 || got.Types[0] != "accepted" || got.Types[len(got.Types)-1] != "done" {
			t.Fatalf("fetch stream: status %d, events %v", got.Status, got.Types)
		}
		for i, seq := range got.Seqs {
			if seq != i+1 {
				t.Fatalf("fetch stream seqs %v: not 1..n", got.Seqs)
			}
		}
		// Streamed, not buffered to the end: the body arrived in pieces.
		if got.Chunks < 3 {
			t.Fatalf("the body arrived in %d chunks: it was buffered, not streamed", got.Chunks)
		}
		t.Logf("fetch + ReadableStream: %d events in %d chunks", len(got.Types), got.Chunks)
	})
}
