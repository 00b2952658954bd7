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
