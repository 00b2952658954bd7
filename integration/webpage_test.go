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

	"github.com/chromedp/cdproto/cdp"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

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

type pageRequest struct{ Method, Path, Query, Auth string }

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
		l.requests = append(l.requests, pageRequest{Method: e.Request.Method, Path: u.Path, Query: u.RawQuery, Auth: auth})
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

// watchCSP has every page the tab loads from now on record the violations
// of its CSP, as the page itself sees them (window.__csp).
func (p *webPage) watchCSP() {
	p.t.Helper()
	p.do("watch for CSP violations", chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := cdp.Call(ctx, tg, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{
			Source: `window.__csp = []; document.addEventListener('securitypolicyviolation',
				(e) => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));`,
		})
		return err
	}))
}

// mustBeClean fails the test for every CSP violation the page saw
// (watchCSP), and every exception or error the browser reported (log).
func (p *webPage) mustBeClean(log *pageLog) {
	p.t.Helper()
	if v := eval[[]string](p, `window.__csp`); len(v) > 0 {
		p.t.Errorf("CSP violations: %q", v)
	}
	// Copied out: the listener runs on the tab's reader, which must never
	// wait on this lock while a step waits on the tab.
	log.mu.Lock()
	exceptions, errs := slices.Clone(log.exceptions), slices.Clone(log.errors)
	log.mu.Unlock()
	for _, e := range exceptions {
		p.t.Errorf("uncaught exception in the page: %s", e)
	}
	for _, e := range errs {
		p.t.Errorf("error logged in the page: %s", e)
	}
}

// pageStep bounds one action on the page. It is wide: on a machine busy
// with other tests, typing a line key by key has taken over 15s.
const pageStep = 45 * time.Second

// webPage drives the page of one node in one tab.
type webPage struct {
	t  *testing.T
	br *browser
}

func (p *webPage) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	if err := chromedp.Do(p.br.step(pageStep), actions...); err != nil {
		p.t.Fatalf("%s: %v", what, err)
	}
}

func eval[T any](p *webPage, js string) T {
	p.t.Helper()
	v, err := chromedp.Run(p.br.step(pageStep), chromedp.Evaluate[T](js, chromedp.EvalAwaitPromise))
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
	keepScreenshot(t, name, png)
}

// mustScreenshotView saves what the viewport shows now as name, as
// mustScreenshot does the whole page.
func mustScreenshotView(t *testing.T, p *webPage, name string) {
	t.Helper()
	png, err := chromedp.Run(p.br.step(15*time.Second), chromedp.CaptureScreenshot())
	if err != nil {
		t.Errorf("screenshot: %v", err)
		return
	}
	keepScreenshot(t, name, png)
}

func keepScreenshot(t *testing.T, name string, png []byte) {
	t.Helper()
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
