package integration_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	cdpbrowser "github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/cdp"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/worker"
)

// cancelRecorder wraps the demo tokens handler and records, for each job
// whose context ended before the handler was done, why: what the worker
// itself saw.
type cancelRecorder struct {
	mu     sync.Mutex
	causes map[string]error
}

func (c *cancelRecorder) handler(delay time.Duration) worker.Handler {
	tokens := worker.Tokens(delay)
	return func(ctx context.Context, job *worker.Job, out *worker.Output) (any, error) {
		res, err := tokens(ctx, job, out)
		if ctx.Err() != nil {
			c.mu.Lock()
			c.causes[job.ID] = context.Cause(ctx)
			c.mu.Unlock()
		}
		return res, err
	}
}

func (c *cancelRecorder) cause(id string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.causes[id]
}

// pageLog is what the browser reports about the page: uncaught
// exceptions, errors logged by the page or by the browser's security
// checks (a CSP violation), and every request with its Authorization.
type pageLog struct {
	mu         sync.Mutex
	exceptions []string
	errors     []string
	requests   []pageRequest
}

type pageRequest struct{ Method, Path, Auth string }

func (l *pageLog) listen(ev any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch e := ev.(type) {
	case *runtime.EventExceptionThrown:
		d := e.ExceptionDetails
		text := d.Text
		if d.Exception != nil {
			text += " " + d.Exception.Description
		}
		l.exceptions = append(l.exceptions, fmt.Sprintf("%s (%s:%d)", text, d.URL, d.LineNumber+1))
	case *runtime.EventConsoleAPICalled:
		if e.Type == runtime.ConsoleAPICalledTypeError {
			var args []string
			for _, a := range e.Args {
				args = append(args, string(a.Value)+a.Description)
			}
			l.errors = append(l.errors, "console.error: "+strings.Join(args, " "))
		}
	case *cdplog.EventEntryAdded:
		// A refusal the page shows is logged by the browser as a failed
		// resource (source network): expected. Anything else at error
		// level — a CSP violation (security), a script error — is not.
		if e.Entry.Level == cdplog.EntryLevelError && e.Entry.Source != cdplog.EntrySourceNetwork {
			l.errors = append(l.errors, fmt.Sprintf("%s: %s", e.Entry.Source, e.Entry.Text))
		}
	case *network.EventRequestWillBeSent:
		u, err := url.Parse(e.Request.URL)
		if err != nil {
			return
		}
		auth, _ := e.Request.Headers["Authorization"].(string)
		l.requests = append(l.requests, pageRequest{Method: e.Request.Method, Path: u.Path, Auth: auth})
	}
}

func (l *pageLog) requestsTo(method, path string) []pageRequest {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []pageRequest
	for _, r := range l.requests {
		if r.Method == method && r.Path == path {
			out = append(out, r)
		}
	}
	return out
}

// webPage drives the page of one node in one tab.
type webPage struct {
	t  *testing.T
	br *browser
}

func (p *webPage) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	if err := chromedp.Do(p.br.step(15*time.Second), actions...); err != nil {
		p.t.Fatalf("%s: %v", what, err)
	}
}

func eval[T any](p *webPage, js string) T {
	p.t.Helper()
	v, err := chromedp.Run(p.br.step(15*time.Second), chromedp.Evaluate[T](js, chromedp.EvalAwaitPromise))
	if err != nil {
		p.t.Fatalf("evaluate %.80q: %v", js, err)
	}
	return v
}

// wait polls the page until cond (a JavaScript expression) is true.
func (p *webPage) wait(what, cond string, d time.Duration) {
	p.t.Helper()
	_, err := chromedp.Run(p.br.step(d+5*time.Second), chromedp.Poll[bool](cond,
		chromedp.WithPollingInterval(20*time.Millisecond), chromedp.WithPollingTimeout(d)))
	if err != nil {
		st := p.state()
		p.t.Fatalf("waiting %s for %s: %v\npage: job %s, state %q, conn %q, final %q, problem %q %q\nevents: %v\nnotes: %q",
			d, what, err, st.JobID, st.State, st.Conn, st.Final, st.Problem, st.ProblemText, st.Seqs, st.Notes)
	}
}

// jobState is what the page shows of the current job.
type jobState struct {
	JobID, Gen, Seq, State, Conn string
	Final, FinalOutcome          string
	Output                       string
	Tokens                       int
	Seqs                         []uint64
	Types, Notes                 []string
	Problem, ProblemText         string
}

const jobStateJS = `(() => {
	const $ = (id) => document.getElementById(id);
	const lis = [...document.querySelectorAll('#events li')];
	return {
		JobID: $('job-id').textContent, Gen: $('job-gen').textContent, Seq: $('job-seq').textContent,
		State: $('job-state').dataset.state, Conn: $('job-conn').textContent,
		Final: $('final').hidden ? '' : $('final').dataset.state,
		FinalOutcome: $('final').hidden ? '' : $('final').dataset.outcome,
		Output: $('output').textContent,
		Tokens: document.querySelectorAll('#output .tok').length,
		Seqs: lis.filter((li) => li.dataset.seq !== undefined).map((li) => Number(li.dataset.seq)),
		Types: lis.map((li) => li.dataset.type),
		Notes: lis.filter((li) => !li.classList.contains('event')).map((li) => li.dataset.type + ': ' + li.querySelector('.summary').textContent),
		Problem: $('problem').hidden ? '' : $('problem').dataset.code,
		ProblemText: $('problem').hidden ? '' : $('problem').innerText,
	};
})()`

func (p *webPage) state() jobState {
	v, err := chromedp.Run(p.br.step(10*time.Second), chromedp.Evaluate[jobState](jobStateJS))
	if err != nil {
		p.t.Fatalf("read the page: %v", err)
	}
	return v
}

// form fills the playground's form as a user would leave it.
type form struct {
	Queue   string `json:"queue"` // a queue of the list, or any other name
	Input   string `json:"input"`
	Kind    string `json:"kind"` // text or json
	TTL     string `json:"ttl"`
	Options string `json:"options"`
	Mode    string `json:"mode"` // stream or detached
}

func (p *webPage) fill(f form) {
	p.t.Helper()
	if f.Kind == "" {
		f.Kind = "text"
	}
	if f.TTL == "" {
		f.TTL = "30000"
	}
	arg, _ := json.Marshal(f)
	eval[chromedp.Void](p, `((o) => {
		const $ = (id) => document.getElementById(id);
		const q = $('queue');
		const opt = [...q.options].find((x) => x.value === o.queue) || q.options[q.options.length - 1];
		q.value = opt.value;
		q.dispatchEvent(new Event('change'));
		$('queue-other').value = opt.value === o.queue ? '' : o.queue;
		$('input').value = o.input;
		document.querySelector('input[name=input-kind][value=' + o.kind + ']').checked = true;
		$('ttl').value = o.ttl;
		$('options').value = o.options;
	})(`+string(arg)+`)`)
	// The mode by a click, as a user picks it: it enables the buttons.
	p.do("pick the mode", chromedp.Click(chromedp.CSS(`input[name=mode][value=`+f.Mode+`]`)))
}

// idle waits until no job runs on the page (the previous one ended).
func (p *webPage) idle() {
	p.t.Helper()
	p.wait("the page to be idle", `document.getElementById('job-form').dataset.running === 'false'`, 10*time.Second)
}

func contiguous(seqs []uint64, n int) bool {
	if len(seqs) != n {
		return false
	}
	for i, s := range seqs {
		if s != uint64(i+1) {
			return false
		}
	}
	return true
}

func words(n int) string {
	w := make([]string, n)
	for i := range w {
		w[i] = fmt.Sprintf("w%02d", i)
	}
	return strings.Join(w, " ")
}

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

	// Violations of the page's CSP, as the page itself sees them.
	p.do("watch for CSP violations", chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := cdp.Call(ctx, tg, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{
			Source: `window.__csp = []; document.addEventListener('securitypolicyviolation',
				(e) => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));`,
		})
		return err
	}))
	p.do("load the page", chromedp.Navigate(baseURL(n)+"/"))
	version, err := chromedp.Run(br.step(10*time.Second), func(ctx context.Context, tg *chromedp.Target) (cdpbrowser.GetVersionResult, error) {
		return cdp.Call(ctx, tg, cdpbrowser.GetVersion, cdp.Empty{})
	})
	if err != nil {
		t.Fatalf("browser version: %v", err)
	}
	t.Logf("browser: %s (%s)", version.Product, version.UserAgent)

	t.Run("ClusterView", func(t *testing.T) {
		p := &webPage{t: t, br: br}
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
	})

	t.Run("TokensStreamOneByOne", func(t *testing.T) {
		p := &webPage{t: t, br: br}
		p.idle()
		input := "one two three four five six seven eight"
		p.fill(form{Queue: "demo", Input: input, Mode: "stream"})
		// Every state of the output the DOM goes through, with the job's
		// state at that moment.
		eval[chromedp.Void](p, `(() => {
			window.__outputs = [];
			const out = document.getElementById('output');
			new MutationObserver(() => window.__outputs.push({text: out.textContent,
				state: document.getElementById('job-state').dataset.state}))
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
		type snap struct{ Text, State string }
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
	})

	t.Run("CancelReachesWorker", func(t *testing.T) {
		p := &webPage{t: t, br: br}
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
		waitFor(t, 5*time.Second, "the worker to see the cancel", func() bool { return rec.cause(st.JobID) != nil })
		if c := rec.cause(st.JobID); !strings.Contains(c.Error(), "cancelled by the node") {
			t.Fatalf("the worker's job context ended with %v, want a cancel from the node", c)
		}
		t.Logf("job %s: page shows %s after %d tokens; the worker saw %q", st.JobID, st.Final, st.Tokens, rec.cause(st.JobID))
	})

	t.Run("DetachedDropResumes", func(t *testing.T) {
		p := &webPage{t: t, br: br}
		p.idle()
		resumed := metric(t, n, "switchyard_stream_resumes_accepted_total", map[string]string{"transport": "sse"})
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
		if got := metric(t, n, "switchyard_stream_resumes_accepted_total", map[string]string{"transport": "sse"}) - resumed; got < 2 {
			t.Errorf("the node accepted %v resumes, want >= 2 (the drop and the browser's reconnect)", got)
		}
		t.Logf("notes: %q", st.Notes)
	})

	t.Run("ResyncWhenHistoryIsGone", func(t *testing.T) {
		p := &webPage{t: t, br: br}
		p.idle()
		// 100 words at 25ms: 102 events in 2.5s, of which the node keeps 64.
		p.fill(form{Queue: "demo", Input: words(100), Options: `{"delay_ms": 25}`, Mode: "detached"})
		p.do("submit", chromedp.Click(chromedp.ID("submit")))
		p.wait("a token", `document.querySelectorAll('#output .tok').length >= 1`, 10*time.Second)
		p.do("disconnect", chromedp.Click(chromedp.ID("pause")))
		st := p.state()
		if len(st.Seqs) == 0 || st.Seqs[len(st.Seqs)-1] >= 102-64 {
			t.Fatalf("the page had seqs %v when it disconnected: too late for resync to be reached", st.Seqs)
		}
		last := st.Seqs[len(st.Seqs)-1]
		waitFor(t, 15*time.Second, "the job to complete with nobody reading", func() bool {
			var v struct{ State string }
			getJSON(t, baseURL(n)+"/v1/jobs/"+st.JobID, &v)
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
	})

	t.Run("RefusalShowsCode", func(t *testing.T) {
		p := &webPage{t: t, br: br}
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
	})

	t.Run("APIKeyOnEveryCall", func(t *testing.T) {
		p := &webPage{t: t, br: br}
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
		before := len(log.requestsTo("POST", "/v1/queues/demo/jobs"))
		p.fill(form{Queue: "demo", Input: "with a key", Mode: "stream"})
		p.do("submit", chromedp.Click(chromedp.ID("submit")))
		p.wait("the final state", `!document.getElementById('final').hidden`, 15*time.Second)
		id := p.state().JobID
		posts := log.requestsTo("POST", "/v1/queues/demo/jobs")[before:]
		gets := log.requestsTo("GET", "/v1/jobs/"+id)
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
		if posts := log.requestsTo("POST", "/v1/queues/demo/jobs"); posts[len(posts)-1].Auth != "" {
			t.Errorf("a POST after Forget still sent %q", posts[len(posts)-1].Auth)
		}
	})

	t.Run("SSEParser", func(t *testing.T) { testSSEParser(t, &webPage{t: t, br: br}) })

	t.Run("LiveWithoutReload", func(t *testing.T) {
		p := &webPage{t: t, br: br}
		// Jobs ended so far, counted by the node; the page's counter follows
		// through the one stream, without a reload.
		ended := 0.0
		for _, o := range []string{"completed", "cancelled", "failed", "expired"} {
			ended += metric(t, n, "switchyard_jobs_total", map[string]string{"outcome": o})
		}
		p.wait(fmt.Sprintf("the jobs counter to reach %v", ended),
			fmt.Sprintf(`Number(document.querySelector('[data-counter=jobs] .total').textContent) >= %v`, ended), 10*time.Second)
		type nav struct{ Loads, Snapshots int }
		v := eval[nav](p, `({Loads: performance.getEntriesByType('navigation').length,
			Snapshots: Number(document.getElementById('live').dataset.snapshots)})`)
		if v.Loads != 1 || v.Snapshots < 2 {
			t.Errorf("%d page loads, %d snapshots: want one load and a live view", v.Loads, v.Snapshots)
		}
	})

	t.Run("Accessible", func(t *testing.T) {
		p := &webPage{t: t, br: br}
		unlabelled := eval[[]string](p, `[...document.querySelectorAll('input, select, textarea, button')]
			.filter((e) => !(e.labels && e.labels.length) && !e.getAttribute('aria-label') && !e.textContent.trim())
			.map((e) => e.outerHTML.slice(0, 80))`)
		if len(unlabelled) > 0 {
			t.Errorf("controls without a label: %q", unlabelled)
		}
		// A narrow phone screen: nothing wider than the viewport.
		p.do("narrow viewport", chromedp.EmulateViewport(390, 844))
		if w := eval[[]int](p, `[document.documentElement.scrollWidth, window.innerWidth]`); w[0] > w[1] {
			t.Errorf("the page is %dpx wide in a %dpx viewport", w[0], w[1])
		}
		mustScreenshot(t, p, "web-page-narrow.png")
		p.do("wide viewport", chromedp.EmulateViewport(1280, 1000))
	})

	mustScreenshot(t, p, "web-page.png")
	if v := eval[[]string](p, `window.__csp`); len(v) > 0 {
		t.Errorf("CSP violations: %q", v)
	}
	// Copied out: the listener runs on the tab's reader, which must never
	// wait on this lock while a step waits on the tab.
	log.mu.Lock()
	exceptions, errs := slices.Clone(log.exceptions), slices.Clone(log.errors)
	log.mu.Unlock()
	for _, e := range exceptions {
		t.Errorf("uncaught exception in the page: %s", e)
	}
	for _, e := range errs {
		t.Errorf("error logged in the page: %s", e)
	}
}

// mustScreenshot saves the page as name in the test's artifact directory
// (kept with go test -artifacts) and, when the test has failed, also in a
// temporary directory that outlives the test; it logs where.
func mustScreenshot(t *testing.T, p *webPage, name string) {
	t.Helper()
	png, err := chromedp.Run(p.br.step(15*time.Second), chromedp.FullScreenshot(100))
	if err != nil {
		t.Errorf("screenshot: %v", err)
		return
	}
	path := filepath.Join(t.ArtifactDir(), name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (kept after the test with go test -artifacts)", path)
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		dir, err := os.MkdirTemp("", "switchyard-web-")
		if err == nil {
			kept := filepath.Join(dir, name)
			if os.WriteFile(kept, png, 0o644) == nil {
				t.Logf("screenshot of the failed test kept: %s", kept)
			}
		}
	})
}
