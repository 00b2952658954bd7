package integration_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	cdpbrowser "github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/chromedp"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/worker"
)

// The web page, in a real Chromium, against a real node and a demo worker:
// the cluster view lists the node and the worker and stays live; a job's
// tokens appear one by one; a cancel ends the job cancelled on the worker;
// a detached stream dropped by hand, and ended by the node, resumes
// without a gap or a duplicate; a position the history no longer holds
// shows resync; a refusal shows its code; the API key goes on every call.
//
// The node ends every stream after 2.5s (--stream-max-duration), so that
// the browser's own EventSource reconnect, with Last-Event-ID, is part of
// the test; and keeps 64 events of history per job, so resync is reached.
func TestWebPage(t *testing.T) {
	t.Parallel()
	n := MustStartNode(t, func(c *switchyard.Config) {
		s := &c.HTTP.Stream
		s.MaxDuration, s.Idle, s.Heartbeat = 2500*time.Millisecond, 2*time.Second, 500*time.Millisecond
		s.Setup, s.WriteTimeout = 1500*time.Millisecond, 1500*time.Millisecond
		c.Engine.HistoryEvents, s.MaxLagEvents = 64, 48
	})
	rec := &cancelRecorder{causes: map[string]error{}}
	MustStartWorker(t, n, worker.Config{Name: "web-worker", Concurrency: 8}, rec.handler(100*time.Millisecond))
	log := &pageLog{}
	br := mustStartBrowser(t, chromedp.WithListener(log.listen)) // after the node: closes first
	p := &webPage{t: t, br: br}

	p.watchCSP()
	p.do("load the page", chromedp.Navigate(baseURL(n)+"/"))
	version, err := chromedp.Run(br.step(10*time.Second), func(ctx context.Context, tg *chromedp.Target) (cdpbrowser.GetVersionResult, error) {
		return cdp.Call(ctx, tg, cdpbrowser.GetVersion, cdp.Empty{})
	})
	if err != nil {
		t.Fatalf("browser version: %v", err)
	}
	t.Logf("browser: %s (%s)", version.Product, version.UserAgent)

	// In order, on the one page: each step starts once the last job ended.
	w := &webTest{n: n, br: br, rec: rec, log: log}
	t.Run("ClusterView", w.clusterView)
	t.Run("TokensStreamOneByOne", w.tokensStreamOneByOne)
	t.Run("JobPanelInViewAfterSubmit", w.jobPanelInView)
	t.Run("EventListFollows", w.eventListFollows)
	t.Run("CancelReachesWorker", w.cancelReachesWorker)
	t.Run("DetachedDropResumes", w.detachedDropResumes)
	t.Run("ResyncWhenHistoryIsGone", w.resyncWhenHistoryIsGone)
	t.Run("RefusalShowsCode", w.refusalShowsCode)
	t.Run("APIKeyOnEveryCall", w.apiKeyOnEveryCall)
	t.Run("SSEParser", func(t *testing.T) { testSSEParser(t, w.page(t)) })
	t.Run("LiveWithoutReload", w.liveWithoutReload)
	t.Run("QueueShowsSubjects", w.queueShowsSubjects)
	t.Run("Accessible", w.accessible)

	mustScreenshot(t, p, "web-page.png")
	p.mustBeClean(log)
}

// webTest is the node, the worker's record, the browser and its log that
// the steps of TestWebPage share.
type webTest struct {
	n   *switchyard.Node
	br  *browser
	rec *cancelRecorder
	log *pageLog
}

func (w *webTest) page(t *testing.T) *webPage { return &webPage{t: t, br: w.br} }

// clusterView: the live view lists this node and the worker, and the
// playground offers the worker's queue.
func (w *webTest) clusterView(t *testing.T) {
	p := w.page(t)
	p.wait("the node and the worker in the live view", `!!document.querySelector('#nodes tr[data-node="it-node"]')
		&& !!document.querySelector('#workers tr[data-worker="web-worker"]')`, 10*time.Second)
	type view struct{ Node, Worker, Queue, Self, Picker string }
	v := eval[view](p, `({
		Node: document.querySelector('#nodes tr[data-node="it-node"]').innerText,
		Worker: document.querySelector('#workers tr[data-worker="web-worker"]').innerText,
		Queue: document.querySelector('#queues tr[data-queue="demo"]').innerText,
		Self: document.getElementById('node-name').textContent,
		Picker: document.getElementById('queue').value,
	})`)
	if !strings.Contains(v.Node, "online") || v.Self != "it-node" {
		t.Errorf("node row %q, node name %q", v.Node, v.Self)
	}
	for _, want := range []string{"demo", "it-node", "model=demo", "8"} {
		if !strings.Contains(v.Worker, want) {
			t.Errorf("worker row %q lacks %q", v.Worker, want)
		}
	}
	if !strings.Contains(v.Queue, "it-node") || !strings.Contains(v.Queue, "0 of 8") {
		t.Errorf("queue row %q: want dispatcher it-node and load 0 of 8", v.Queue)
	}
	if v.Picker != "demo" {
		t.Errorf("the playground's queue is %q, want demo from the catalog", v.Picker)
	}
}

// tokensStreamOneByOne: a streamed job, submitted from the keyboard, shows
// its output growing token by token before done.
func (w *webTest) tokensStreamOneByOne(t *testing.T) {
	p := w.page(t)
	p.idle()
	input := "one two three four five six seven eight"
	p.fill(form{Queue: "demo", Input: input, Mode: "stream"})
	// Every state of the output the DOM goes through, with the job's
	// state at that moment.
	eval[chromedp.Void](p, `(() => {
		window.__outputs = [];
		const out = document.getElementById('output');
		new MutationObserver(() => window.__outputs.push({text: out.textContent,
			state: document.getElementById('job-state').dataset.state,
			status: document.getElementById('job-status').textContent}))
			.observe(out, {childList: true, subtree: true, characterData: true});
	})()`)
	// Submitted from the keyboard.
	p.do("submit with the keyboard", chromedp.Focus(chromedp.ID("submit")), chromedp.KeyEvent("\r"))
	p.wait("the final state", `!document.getElementById('final').hidden`, 15*time.Second)
	st := p.state()
	if st.Final != "completed" || st.Output != input {
		t.Fatalf("final %q, output %q, want completed %q", st.Final, st.Output, input)
	}
	if !contiguous(st.Seqs, 10) || st.Types[1] != "accepted" || st.Types[len(st.Types)-1] != "done" {
		t.Fatalf("events %v, seqs %v: want accepted, 8 outputs, done as seqs 1..10", st.Types, st.Seqs)
	}
	if !strings.HasPrefix(st.JobID, "j_") || st.Gen != "1" || st.Seq != "10" {
		t.Errorf("job id %q, generation %q, seq %q", st.JobID, st.Gen, st.Seq)
	}
	type snap struct{ Text, State, Status string }
	seen := eval[[]snap](p, `window.__outputs`)
	var partial []string
	for _, s := range seen {
		if s.Text != "" && s.Text != input && s.State != "completed" && !slices.Contains(partial, s.Text) {
			partial = append(partial, s.Text)
		}
	}
	if len(partial) < 2 {
		t.Fatalf("intermediate outputs %q before done: want at least two (DOM states %d)", partial, len(seen))
	}
	t.Logf("%d distinct intermediate outputs before done, e.g. %q then %q", len(partial), partial[0], partial[1])
	// The status line (the live region a screen reader reads) follows the
	// output: with words on screen it no longer says it waits for them.
	for _, s := range seen {
		if s.Text != "" && s.State == "running" && !strings.HasPrefix(s.Status, "Streaming: ") {
			t.Errorf("with %q on screen the status line says %q", s.Text, s.Status)
			break
		}
	}
	if st := eval[string](p, `document.getElementById('job-status').textContent`); !strings.Contains(st, "completed") {
		t.Errorf("after done the status line says %q", st)
	}
}

// cancelReachesWorker: Cancel on a streamed job ends it cancelled, and the
// worker's job context is cancelled by the node.
func (w *webTest) cancelReachesWorker(t *testing.T) {
	p := w.page(t)
	p.idle()
	p.fill(form{Queue: "demo", Input: words(40), Mode: "stream"})
	p.do("submit", chromedp.Click(chromedp.ID("submit")))
	p.wait("three tokens", `document.querySelectorAll('#output .tok').length >= 3`, 10*time.Second)
	p.do("cancel", chromedp.Click(chromedp.ID("cancel")))
	p.wait("the final state", `!document.getElementById('final').hidden`, 10*time.Second)
	st := p.state()
	if st.Final != "cancelled" || st.FinalOutcome != "cancelled" {
		t.Fatalf("final state %q outcome %q, want cancelled", st.Final, st.FinalOutcome)
	}
	if st.Tokens >= 40 {
		t.Fatalf("%d tokens: the job ran to the end", st.Tokens)
	}
	// The facts and the final state agree on the last seq: the cancel's
	// error event, which the closed stream never brought, is said.
	if final := eval[string](p, `[...document.querySelectorAll('#final dt')].find((dt) => dt.textContent === 'Last seq').nextElementSibling.textContent`); final != st.Seq {
		t.Errorf("Last seq %s in the facts, %s in the final state", st.Seq, final)
	}
	if !slices.ContainsFunc(st.Notes, func(n string) bool { return strings.Contains(n, "came after the page stopped reading") }) {
		t.Errorf("no note of the events the page did not read: %q", st.Notes)
	}
	waitFor(t, 5*time.Second, "the worker to see the cancel", func() bool { return w.rec.cause(st.JobID) != nil })
	if c := w.rec.cause(st.JobID); !strings.Contains(c.Error(), "cancelled by the node") {
		t.Fatalf("the worker's job context ended with %v, want a cancel from the node", c)
	}
	t.Logf("job %s: page shows %s after %d tokens; the worker saw %q", st.JobID, st.Final, st.Tokens, w.rec.cause(st.JobID))
}

// detachedDropResumes: a detached stream dropped by hand, then ended by the
// node and resumed by the browser itself, delivers every seq once, in order.
func (w *webTest) detachedDropResumes(t *testing.T) {
	p := w.page(t)
	p.idle()
	resumed := metric(t, w.n, "switchyard_stream_resumes_accepted_total", map[string]string{"transport": "sse"})
	input := words(50)
	p.fill(form{Queue: "demo", Input: input, Mode: "detached"})
	p.do("submit", chromedp.Click(chromedp.ID("submit")))
	p.wait("three tokens", `document.querySelectorAll('#output .tok').length >= 3`, 10*time.Second)
	p.do("drop the connection", chromedp.Click(chromedp.ID("drop")))
	p.wait("the final state", `!document.getElementById('final').hidden`, 30*time.Second)
	st := p.state()
	if st.Final != "completed" || st.Output != input {
		t.Fatalf("final %q, output %q", st.Final, st.Output)
	}
	if !contiguous(st.Seqs, 52) {
		t.Fatalf("seqs %v: want 1..52 once each, in order (no gap, no duplicate)", st.Seqs)
	}
	has := func(prefix, sub string) bool {
		return slices.ContainsFunc(st.Notes, func(n string) bool { return strings.HasPrefix(n, prefix) && strings.Contains(n, sub) })
	}
	for _, want := range [][2]string{
		{"dropped:", "you dropped the connection"},
		{"resumed:", "?last_event_id="},
		{"terminated:", "max_duration"},
		{"resumed:", "by the browser itself"},
	} {
		if !has(want[0], want[1]) {
			t.Errorf("no %s note with %q: %q", want[0], want[1], st.Notes)
		}
	}
	if got := metric(t, w.n, "switchyard_stream_resumes_accepted_total", map[string]string{"transport": "sse"}) - resumed; got < 2 {
		t.Errorf("the node accepted %v resumes, want >= 2 (the drop and the browser's reconnect)", got)
	}
	t.Logf("notes: %q", st.Notes)
}

// resyncWhenHistoryIsGone: a reconnect after the job's history moved past
// the page's position shows resync and a gap, then the rest.
func (w *webTest) resyncWhenHistoryIsGone(t *testing.T) {
	p := w.page(t)
	p.idle()
	// 100 words at 25ms: 102 events in 2.5s, of which the node keeps 64.
	p.fill(form{Queue: "demo", Input: words(100), Options: `{"delay_ms": 25}`, Mode: "detached"})
	p.do("submit", chromedp.Click(chromedp.ID("submit")))
	p.wait("a token", `document.querySelectorAll('#output .tok').length >= 1`, 10*time.Second)
	p.do("disconnect", chromedp.Click(chromedp.ID("pause")))
	st := p.state()
	if status := eval[string](p, `document.getElementById('job-status').textContent`); !strings.HasPrefix(status, "Disconnected by you after seq ") {
		t.Errorf("after Disconnect the status line says %q", status)
	}
	if len(st.Seqs) == 0 || st.Seqs[len(st.Seqs)-1] >= 102-64 {
		t.Fatalf("the page had seqs %v when it disconnected: too late for resync to be reached", st.Seqs)
	}
	last := st.Seqs[len(st.Seqs)-1]
	waitFor(t, 15*time.Second, "the job to complete with nobody reading", func() bool {
		var v struct{ State string }
		getJSON(t, baseURL(w.n)+"/v1/jobs/"+st.JobID, &v)
		return v.State == "completed"
	})
	p.do("reconnect", chromedp.Click(chromedp.ID("pause")))
	p.wait("the final state", `!document.getElementById('final').hidden`, 15*time.Second)
	st = p.state()
	if st.Final != "completed" {
		t.Fatalf("final %q", st.Final)
	}
	if !slices.Contains(st.Types, "resync") || !slices.Contains(st.Types, "gap") {
		t.Fatalf("no resync and gap in %v", st.Types)
	}
	if n := eval[int](p, `document.querySelectorAll('#output .gap').length`); n != 1 {
		t.Errorf("%d gap markers in the output, want 1", n)
	}
	for i := 1; i < len(st.Seqs); i++ {
		if st.Seqs[i] <= st.Seqs[i-1] {
			t.Fatalf("seqs %v go back at %d", st.Seqs, i)
		}
	}
	if got := st.Seqs[len(st.Seqs)-1]; got != 102 {
		t.Errorf("last seq %d, want 102", got)
	}
	t.Logf("disconnected after seq %d; reconnect got resync, then seqs %d..%d", last, st.Seqs[slices.Index(st.Seqs, last)+1], st.Seqs[len(st.Seqs)-1])
}

// refusalShowsCode: a refused submit shows its HTTP status and problem
// code, and takes the focus.
func (w *webTest) refusalShowsCode(t *testing.T) {
	p := w.page(t)
	for _, tc := range []struct {
		name string
		form form
		code string
		http string
	}{
		{"unknown queue", form{Queue: "no-such-queue", Input: "x", Mode: "stream"}, "no_capable_worker", "503"},
		{"not JSON", form{Queue: "demo", Input: `{"unterminated`, Kind: "json", Mode: "detached"}, "malformed_json", "400"},
		{"TTL zero", form{Queue: "demo", Input: "x", TTL: "0", Mode: "stream"}, "ttl_out_of_range", "422"},
	} {
		p.idle()
		p.fill(tc.form)
		p.do("submit", chromedp.Click(chromedp.ID("submit")))
		p.wait("the problem "+tc.code, `document.getElementById('problem').dataset.code === '`+tc.code+`'`, 10*time.Second)
		st := p.state()
		if !strings.Contains(st.ProblemText, tc.http) || !strings.Contains(st.ProblemText, tc.code) {
			t.Errorf("%s: the problem box says %q, want %s and %s", tc.name, st.ProblemText, tc.http, tc.code)
		}
		if focused := eval[string](p, `document.activeElement.id`); focused != "problem" {
			t.Errorf("%s: focus on %q, want the problem box", tc.name, focused)
		}
	}
}

// apiKeyOnEveryCall: a key set in the panel stays in the tab only and goes
// on every call as a bearer token; Forget stops it.
func (w *webTest) apiKeyOnEveryCall(t *testing.T) {
	p := w.page(t)
	p.idle()
	p.do("set the key",
		chromedp.Click(chromedp.CSS(`#key-panel summary`)),
		chromedp.SendKeys(chromedp.ID("api-key"), "web-test-key"),
		chromedp.Click(chromedp.CSS(`#key-form button[type=submit]`)))
	type store struct {
		Session       string
		Local         int
		State, Cookie string
	}
	s := eval[store](p, `({Session: sessionStorage.getItem('switchyard.apiKey') || '', Local: localStorage.length,
		State: document.getElementById('key-state').textContent, Cookie: document.cookie})`)
	if s.Session != "web-test-key" || s.Local != 0 || s.Cookie != "" || s.State != "set for this tab" {
		t.Fatalf("after setting the key: %+v", s)
	}
	before := len(w.log.requestsTo("POST", "/v1/queues/demo/jobs"))
	p.fill(form{Queue: "demo", Input: "with a key", Mode: "stream"})
	p.do("submit", chromedp.Click(chromedp.ID("submit")))
	p.wait("the final state", `!document.getElementById('final').hidden`, 15*time.Second)
	id := p.state().JobID
	posts := w.log.requestsTo("POST", "/v1/queues/demo/jobs")[before:]
	gets := w.log.requestsTo("GET", "/v1/jobs/"+id)
	if len(posts) != 1 || posts[0].Auth != "Bearer web-test-key" {
		t.Errorf("POST with the key: %+v", posts)
	}
	if len(gets) == 0 || slices.ContainsFunc(gets, func(r pageRequest) bool { return r.Auth != "Bearer web-test-key" }) {
		t.Errorf("GET of the job with the key: %+v", gets)
	}
	p.do("forget the key", chromedp.Click(chromedp.ID("key-forget")))
	if s := eval[store](p, `({Session: sessionStorage.getItem('switchyard.apiKey') || ''})`); s.Session != "" {
		t.Fatalf("the key is still stored: %+v", s)
	}
	p.idle()
	p.do("submit", chromedp.Click(chromedp.ID("submit")))
	p.wait("the final state", `!document.getElementById('final').hidden`, 15*time.Second)
	if posts := w.log.requestsTo("POST", "/v1/queues/demo/jobs"); posts[len(posts)-1].Auth != "" {
		t.Errorf("a POST after Forget still sent %q", posts[len(posts)-1].Auth)
	}
}

// liveWithoutReload: the counters follow the node's through the one stream,
// with no reload of the page.
func (w *webTest) liveWithoutReload(t *testing.T) {
	p := w.page(t)
	// Jobs ended so far, counted by the node; the page's counter follows
	// through the one stream, without a reload.
	ended := 0.0
	for _, o := range []string{"completed", "cancelled", "failed", "expired"} {
		ended += metric(t, w.n, "switchyard_jobs_total", map[string]string{"outcome": o})
	}
	p.wait(fmt.Sprintf("the jobs counter to reach %v", ended),
		fmt.Sprintf(`Number(document.querySelector('[data-counter=jobs] .total').textContent) >= %v`, ended), 10*time.Second)
	type nav struct{ Loads, Snapshots int }
	v := eval[nav](p, `({Loads: performance.getEntriesByType('navigation').length,
		Snapshots: Number(document.getElementById('live').dataset.snapshots)})`)
	if v.Loads != 1 || v.Snapshots < 2 {
		t.Errorf("%d page loads, %d snapshots: want one load and a live view", v.Loads, v.Snapshots)
	}
}

// queueShowsSubjects: while a job runs, the queue's row shows the subject
// holding its slot (the anonymous caller, on a node without keys), and the
// job's end empties it again.
func (w *webTest) queueShowsSubjects(t *testing.T) {
	p := w.page(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res := post(ctx, t, w.n, "demo", `{"ttl_ms":60000,"input":"`+words(100)+`"}`, false)
	var job struct {
		ID string `json:"job_id"`
	}
	if err := json.NewDecoder(res.Body).Decode(&job); err != nil || res.StatusCode != 202 {
		t.Fatalf("POST: %d %v", res.StatusCode, err)
	}
	res.Body.Close()
	p.wait("the running job's subject in the queue row", `(() => {
		const s = document.querySelector('#queues tr[data-queue="demo"] [data-subject="anonymous"]');
		return !!s && s.textContent.includes('0 waiting, 1 running (100%, fair 100%)');
	})()`, 10*time.Second)
	req, _ := http.NewRequestWithContext(ctx, http.MethodDelete, baseURL(w.n)+"/v1/jobs/"+job.ID, nil)
	if res, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else {
		res.Body.Close()
	}
	p.wait("the queue row without subjects once the job ended", `(() => {
		const row = document.querySelector('#queues tr[data-queue="demo"]');
		return !!row && !row.querySelector('[data-subject]') && row.lastElementChild.textContent === '–';
	})()`, 10*time.Second)
}

// accessible: every control has a label, and nothing is wider than a
// phone's screen.
func (w *webTest) accessible(t *testing.T) {
	p := w.page(t)
	unlabelled := eval[[]string](p, `[...document.querySelectorAll('input, select, textarea, button')]
		.filter((e) => !(e.labels && e.labels.length) && !e.getAttribute('aria-label') && !e.textContent.trim())
		.map((e) => e.outerHTML.slice(0, 80))`)
	if len(unlabelled) > 0 {
		t.Errorf("controls without a label: %q", unlabelled)
	}
	// "API key" looks like the control it is: a bordered button with a
	// pointer.
	type look struct {
		Cursor, Border string
		Height         float64
	}
	if k := eval[look](p, `(() => { const s = getComputedStyle(document.querySelector('#key-panel summary'));
		return {Cursor: s.cursor, Border: s.borderTopWidth, Height: document.querySelector('#key-panel summary').getBoundingClientRect().height}; })()`); k.Cursor != "pointer" || k.Border == "0px" || k.Height < 44 {
		t.Errorf("the API key control: %+v, want a pointer, a border and 44px", k)
	}
	p.do("desktop viewport", chromedp.EmulateViewport(1280, 900))
	if w := eval[[]int](p, `[document.documentElement.scrollWidth, window.innerWidth]`); w[0] > w[1] {
		t.Errorf("the page is %dpx wide in a %dpx viewport", w[0], w[1])
	}
	// A narrow phone screen: nothing wider than the viewport.
	p.do("narrow viewport", chromedp.EmulateViewport(390, 844))
	if w := eval[[]int](p, `[document.documentElement.scrollWidth, window.innerWidth]`); w[0] > w[1] {
		t.Errorf("the page is %dpx wide in a %dpx viewport", w[0], w[1])
	}
	mustScreenshot(t, p, "web-page-narrow.png")
	p.do("wide viewport", chromedp.EmulateViewport(1280, 1000))
}

// jobPanelInView: at 1280×900, the job's panel, its status line and its
// output are in view after Submit, with no scrolling.
func (w *webTest) jobPanelInView(t *testing.T) {
	p := w.page(t)
	p.idle()
	p.do("desktop viewport", chromedp.EmulateViewport(1280, 900))
	defer p.do("back to the test's viewport", chromedp.EmulateViewport(1280, 1000))
	p.fill(form{Queue: "demo", Input: "in view", Mode: "stream"})
	eval[chromedp.Void](p, `window.scrollTo(0, 0)`)
	if b := eval[float64](p, `document.getElementById('submit').getBoundingClientRect().bottom`); b > 900 {
		t.Errorf("Submit ends at %vpx: out of a 900px viewport", b)
	}
	p.do("submit", chromedp.Click(chromedp.ID("submit"), chromedp.NodeVisible))
	p.wait("the final state", `!document.getElementById('final').hidden`, 15*time.Second)
	type box struct {
		ScrollY, Height       float64
		Panel, Status, Output [2]float64 // top, bottom
	}
	b := eval[box](p, `(() => { const r = (id) => { const b = document.getElementById(id).getBoundingClientRect(); return [b.top, b.bottom]; };
		return {ScrollY: window.scrollY, Height: window.innerHeight, Panel: r('job'), Status: r('job-status'), Output: r('output')}; })()`)
	if b.ScrollY != 0 {
		t.Errorf("the page scrolled to %v on Submit", b.ScrollY)
	}
	for name, r := range map[string][2]float64{"the job panel's top": b.Panel, "the status line": b.Status, "the output": b.Output} {
		if r[0] < 0 || r[1] > b.Height {
			t.Errorf("%s is at %v..%v, out of the %vpx viewport", name, r[0], r[1], b.Height)
		}
	}
}

// eventListFollows: the event list (the box that scrolls) shows the newest
// event as events come, and the terminal one at the end; scrolled back by
// the reader, it stays where they read.
func (w *webTest) eventListFollows(t *testing.T) {
	p := w.page(t)
	p.idle()
	p.fill(form{Queue: "demo", Input: words(60), Options: `{"delay_ms": 40}`, Mode: "stream"})
	p.do("submit", chromedp.Click(chromedp.ID("submit")))
	type list struct {
		Top, Height, Client, Count float64
		LastVisible                bool
	}
	const listJS = `(() => { const l = document.querySelector('ol.event-list'); const last = l.lastElementChild;
		const lb = l.getBoundingClientRect(), ib = last ? last.getBoundingClientRect() : lb;
		return {Top: l.scrollTop, Height: l.scrollHeight, Client: l.clientHeight, Count: l.childElementCount,
			LastVisible: ib.top >= lb.top - 1 && ib.bottom <= lb.bottom + 1}; })()`
	p.wait("the list to overflow", `(() => { const l = document.querySelector('ol.event-list'); return l.scrollHeight > l.clientHeight + 40; })()`, 10*time.Second)
	if l := eval[list](p, listJS); !l.LastVisible || l.Top == 0 {
		t.Errorf("mid-job, %v events: the newest is not in view (scrolled to %v of %v)", l.Count, l.Top, l.Height)
	}
	// The reader scrolls back: new events do not pull the list away.
	eval[chromedp.Void](p, `document.querySelector('ol.event-list').scrollTop = 0`)
	before := eval[list](p, listJS).Count
	p.wait("more events", fmt.Sprintf(`document.querySelector('ol.event-list').childElementCount > %v + 3`, before), 10*time.Second)
	if l := eval[list](p, listJS); l.Top != 0 {
		t.Errorf("scrolled to the top by the reader, the list moved to %v", l.Top)
	}
	// Back at the end, it follows again to the terminal event.
	eval[chromedp.Void](p, `(() => { const l = document.querySelector('ol.event-list'); l.scrollTop = l.scrollHeight; })()`)
	p.wait("the final state", `!document.getElementById('final').hidden`, 15*time.Second)
	l := eval[list](p, listJS)
	last := eval[string](p, `document.querySelector('ol.event-list li.event:last-of-type') ? [...document.querySelectorAll('ol.event-list li.event')].pop().dataset.type : ''`)
	if !l.LastVisible || last != "done" {
		t.Errorf("at the end: the last entry in view %v, the last event %q (want done in view)", l.LastVisible, last)
	}
}
