package integration_test

import (
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/worker"
)

// The web page on a node that checks keys: without a key every panel
// shows 401; with an operator's key (submit and admin) the live view runs
// on a cluster read token, and a detached job streams through an
// EventSource on a job read token, resuming by itself when the node ends
// the stream, with no key in any URL.
func TestWebPageWithKeys(t *testing.T) {
	t.Parallel()
	const ops = "ops-submit-admin-key-0006"
	n := MustStartNode(t, func(c *switchyard.Config) {
		c.Auth.Inline = accessKeys() + "  - {subject: ops, key: " + ops + ", roles: [submit, admin], queues: ['*']}\n"
		s := &c.HTTP.Stream
		s.MaxDuration, s.Idle, s.Heartbeat = 2500*time.Millisecond, 2*time.Second, 500*time.Millisecond
		s.Setup, s.WriteTimeout = 1500*time.Millisecond, 1500*time.Millisecond
	})
	MustStartWorker(t, n, worker.Config{Name: "keyed-worker", Queue: "demo", Concurrency: 4, DialOptions: []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()), worker.APIKey(keyAliceWork)}}, worker.Tokens(60*time.Millisecond))
	log := &pageLog{}
	br := mustStartBrowser(t, chromedp.WithListener(log.listen))
	p := &webPage{t: t, br: br}
	p.do("load the page", chromedp.Navigate(baseURL(n)+"/"))
	p.wait("the live view refused without a key", `document.getElementById('cluster-problem').innerText.includes('unauthenticated')`, 10*time.Second)
	p.wait("the queue list's hint to ask for a key", `document.getElementById('queue-help').textContent.includes('wants an API key')`, 10*time.Second)

	// A key that may submit but not read the catalog: the page says what
	// it lacks, claims nothing about workers it cannot see, and runs a job.
	p.do("set a submit-only key",
		chromedp.Click(chromedp.CSS(`#key-panel summary`)),
		chromedp.SendKeys(chromedp.ID("api-key"), keyAlice),
		chromedp.Click(chromedp.CSS(`#key-form button[type=submit]`)))
	p.wait("the hints for a key without the admin role", `document.getElementById('queue-help').textContent.includes('may not read the catalog')
		&& document.getElementById('cluster-problem').innerText.includes('permission_denied')`, 10*time.Second)
	type hints struct{ Queue, Caps, Cluster, Problem string }
	const hintsJS = `({Queue: document.getElementById('queue-help').textContent, Caps: document.getElementById('caps-list').innerText,
		Cluster: document.getElementById('cluster-problem').innerText, Problem: document.getElementById('problem').hidden ? '' : document.getElementById('problem').innerText})`
	h := eval[hints](p, hintsJS)
	if strings.Contains(h.Caps, "no_capable_worker") || !strings.Contains(h.Caps, "may not read the catalog") {
		t.Errorf("with a submit-only key the capabilities say %q", h.Caps)
	}
	if strings.Contains(h.Cluster, "set one under") || !strings.Contains(h.Cluster, "valid, but may not do this") {
		t.Errorf("with a submit-only key the live view says %q", h.Cluster)
	}
	if h.Problem != "" {
		t.Errorf("the queue list refused, the playground shows a problem: %q", h.Problem)
	}
	p.fill(form{Queue: "demo", Input: "one two three", Mode: "stream"})
	p.do("submit", chromedp.Click(chromedp.ID("submit")))
	p.wait("the final state", `!document.getElementById('final').hidden`, 15*time.Second)
	if st := p.state(); st.Final != "completed" || st.Output != "one two three" {
		t.Fatalf("a job with the submit-only key: final %q, output %q, problem %q", st.Final, st.Output, st.ProblemText)
	}
	p.idle()
	p.fill(form{Queue: "not-alices", Input: "x", Mode: "stream"})
	p.do("submit", chromedp.Click(chromedp.ID("submit")))
	p.wait("the refusal", `document.getElementById('problem').dataset.code === 'permission_denied'`, 10*time.Second)
	if h := eval[hints](p, hintsJS); strings.Contains(h.Problem, "set one under") || !strings.Contains(h.Problem, "valid, but may not do this") || !strings.Contains(h.Problem, "403") {
		t.Errorf("a 403 with a key set says %q", h.Problem)
	}
	p.do("forget the submit-only key", chromedp.Click(chromedp.ID("key-forget")), chromedp.Click(chromedp.CSS(`#key-panel summary`)))
	p.idle()

	p.do("set the key",
		chromedp.Click(chromedp.CSS(`#key-panel summary`)),
		chromedp.SendKeys(chromedp.ID("api-key"), ops),
		chromedp.Click(chromedp.CSS(`#key-form button[type=submit]`)))
	p.wait("the live view with the worker", `!!document.querySelector('#workers tr[data-worker="keyed-worker"]')
		&& document.getElementById('live').dataset.live === 'live'`, 10*time.Second)

	input := words(60)
	p.fill(form{Queue: "demo", Input: input, Mode: "detached"})
	p.do("submit", chromedp.Click(chromedp.ID("submit")))
	p.wait("the final state", `!document.getElementById('final').hidden`, 30*time.Second)
	st := p.state()
	if st.Final != "completed" || st.Output != input || !contiguous(st.Seqs, 62) {
		t.Fatalf("the detached job: final %q, seqs %v, notes %q", st.Final, st.Seqs, st.Notes)
	}
	if !strings.Contains(strings.Join(st.Notes, "\n"), "by the browser itself") {
		t.Errorf("no reconnect by the browser itself (the node ends streams after 2.5s): %q", st.Notes)
	}
	// The EventSources read with tokens, never the key.
	log.mu.Lock()
	defer log.mu.Unlock()
	streams := 0
	for _, r := range log.requests {
		if strings.HasSuffix(r.Path, "/events") && r.Method == "GET" {
			streams++
			if !strings.Contains(r.Query, "read_token=") {
				t.Errorf("a stream without a read token: %s?%s", r.Path, r.Query)
			}
		}
		if strings.Contains(r.Path+r.Query, ops) {
			t.Errorf("the key in a URL: %s?%s", r.Path, r.Query)
		}
	}
	if streams < 3 {
		t.Errorf("%d stream requests, want the live view's and at least two of the job's", streams)
	}
	for _, e := range log.exceptions {
		t.Errorf("uncaught exception in the page: %s", e)
	}
}
