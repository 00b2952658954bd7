package integration_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/openapi/client"
	"github.com/switchyard/switchyard/worker"
)

// notProvoked are the answers the document lists that this test does not
// make a node give, each with the reason; an answer joins this list only
// with one. The codes behind them are provoked, and their problem
// documents checked, by TestEveryDocumentedCode.
var notProvoked = map[string]string{
	"listMembers 503 application/problem+json":  "catalog_unavailable: a catalog that cannot answer (TestMembers runs the member routes on a cluster)",
	"addMember 503 application/problem+json":    "catalog_unavailable: a catalog that cannot answer",
	"removeMember 503 application/problem+json": "catalog_unavailable: a catalog that cannot answer",
	"submitJob 504 application/problem+json":    "expired before the job reached its dispatcher: a dispatcher node that cannot be reached (a fault test's)",
	"createChatCompletion 429 application/json": "queue_full on the front door's queue: the code and shape of submitJob's 429, provoked here",
	"jobOutput 429 application/problem+json":    "reader_behind waits half a session's idle timeout: TestEveryDocumentedCode provokes it",
	"createChatCompletion 503 application/json": "no_capable_worker with the model offered: a worker leaving between the front door's two checks",
}

// The document tells the truth (issue 26): a broad set of real exchanges
// with real nodes — every operation, its success in each media type and
// every error it can answer with, streams and JSON, the OpenAI-compatible
// routes included, on a node without keys, one with keys and one
// draining — each held to the served document by kin-openapi's
// openapi3filter (docCheck: requests, responses, and each event of each
// stream against its event's schema). Every answer the document promises
// must have been seen, less notProvoked.
func TestDocumentIsTheTruth(t *testing.T) {
	t.Parallel()
	dc := newDocCheck(t)
	n := MustStartNode(t, func(c *switchyard.Config) {
		c.HTTP.OpenAIQueue = "demo"
		c.Engine.Limits.MaxInputBytes = 1024
		// The HTTP workers here post only when a step needs them to.
		c.Workers.IdleTimeout = time.Minute
		// A fixed etcd peer port: a member on one chosen at start takes
		// no member (member_address_unusable, the every-code probe's).
		c.EtcdPeerAddr = freeAddr(t)
	})
	tr := &truthRun{name: n.Catalog().Name(), t: t, dc: dc, hc: dc.client(), base: baseURL(n)}
	c, err := client.NewClientWithResponses(tr.base, client.WithHTTPClient(tr.hc))
	if err != nil {
		t.Fatal(err)
	}
	tr.openRoutes()
	tr.jobs(c)
	tr.workerRefusals(c)
	tr.submitRefusals(n)
	tr.views()
	tr.openAI(c)
	tr.access()
	tr.draining()
	if missing := dc.missing(notProvoked); len(missing) > 0 {
		t.Errorf("the document promises answers no exchange showed (provoke them, or add them to notProvoked with a reason):\n%s", strings.Join(missing, "\n"))
	}
	t.Logf("%d exchanges checked against the document", dc.exchanges())
}

// truthRun is one node's exchanges, all through the docCheck.
type truthRun struct {
	name string // the node's id
	t    *testing.T
	dc   *docCheck
	hc   *http.Client
	base string
}

// do sends a request through the check; header is name, value pairs.
func (tr *truthRun) do(method, path, ctype, body string, header ...string) *http.Response {
	tr.t.Helper()
	return send(tr.t, tr.t.Context(), tr.hc, method, tr.base+path, ctype, body, header...)
}

// want sends a request and fails unless it is answered status; it
// returns the body, read whole.
func (tr *truthRun) want(status int, method, path, ctype, body string, header ...string) []byte {
	tr.t.Helper()
	res := tr.do(method, path, ctype, body, header...)
	b := readBody(tr.t, res)
	if res.StatusCode != status {
		tr.t.Errorf("%s %s: %d, want %d: %s", method, path, res.StatusCode, status, b)
	}
	return b
}

func (tr *truthRun) openRoutes() {
	for _, p := range []string{"/", "/docs", "/healthz", "/readyz", "/metrics", "/openapi.json", "/openapi.yaml"} {
		tr.want(200, "GET", p, "", "")
	}
	tr.want(200, "HEAD", "/", "", "")
	tr.want(405, "PUT", "/v1/queues/demo/jobs", "", "")
}

// jobs: a job's life through an HTTP worker, submitted for later and
// streamed, read, resumed, cancelled; and the worker's posts.
func (tr *truthRun) jobs(c *client.ClientWithResponses) {
	t := tr.t
	hw := openHTTPWorkerWith(t, c, "demo", client.WorkerRequest{Name: ptr("truth"), Capabilities: &[]string{"model=demo"}, Concurrency: ptr(4)})
	tr.want(204, "POST", "/v1/workers/"+hw.session+"/heartbeat", "", "")

	// For later (202), then the same key again (200, JSON).
	env := `{"input":"x","ttl_ms":30000}`
	later := jobIDOf(t, tr.do("POST", "/v1/queues/demo/jobs", "application/json", env, "Idempotency-Key", "t1"))
	tr.want(200, "POST", "/v1/queues/demo/jobs", "application/json", env, "Idempotency-Key", "t1")
	o := hw.offer()
	hw.accept(o)
	hw.output(o, map[string]any{"n": 1})
	tr.want(204, "POST", "/v1/workers/"+hw.session+"/jobs/"+o.JobId+"/complete", "application/json", `{"generation":1,"result":{"ok":true}}`)
	tr.want(200, "GET", "/v1/jobs/"+later, "", "")
	tr.want(200, "POST", "/v1/jobs/"+later+"/read-token", "", "")
	// Its stream from the start, then from its last event: 204.
	res := tr.do("GET", "/v1/jobs/"+later+"/events", "", "")
	evs := readAll(t, res.Body)
	res.Body.Close()
	tr.want(204, "GET", "/v1/jobs/"+later+"/events", "", "", "Last-Event-ID", evs[len(evs)-1].LastEventID)
	tr.want(400, "GET", "/v1/jobs/"+later+"/events", "", "", "Last-Event-ID", "forged")
	tr.want(400, "GET", "/v1/jobs/"+later+"/events?slow=sometimes", "", "")

	// Streamed from its POST: the worker fails it (an error event).
	res = tr.do("POST", "/v1/queues/demo/jobs", "application/json", env, "Accept", "text/event-stream")
	o = hw.offer()
	hw.accept(o)
	hw.output(o, "partial")
	tr.want(204, "POST", "/v1/workers/"+hw.session+"/jobs/"+o.JobId+"/fail", "application/json", `{"generation":1,"code":"model_error","message":"no"}`)
	readAll(t, res.Body)
	res.Body.Close()

	// Rejected (no other worker: the job ends rejected).
	res = tr.do("POST", "/v1/queues/demo/jobs", "application/json", env, "Accept", "text/event-stream")
	o = hw.offer()
	tr.want(204, "POST", "/v1/workers/"+hw.session+"/jobs/"+o.JobId+"/reject", "application/json", `{"generation":1,"reason":"busy"}`)
	readAll(t, res.Body)
	res.Body.Close()

	// A rejected job is no longer the worker's: its posts for it are
	// refused job_not_held.
	for _, post := range []string{"accept", "reject", "output", "complete", "fail"} {
		tr.want(409, "POST", "/v1/workers/"+hw.session+"/jobs/"+o.JobId+"/"+post, "application/json", `{"generation":1,"data":"late"}`)
	}

	// Cancelled while running: the worker's session gets a cancel.
	id := jobIDOf(t, tr.do("POST", "/v1/queues/demo/jobs", "application/json", env))
	o = hw.offer()
	hw.accept(o)
	tr.want(200, "DELETE", "/v1/jobs/"+id, "", "")
	hw.recv("cancel")
	tr.want(204, "POST", "/v1/workers/"+hw.session+"/jobs/"+id+"/fail", "application/json", `{"generation":1,"code":"cancelled"}`)
	hw.stop()
	for _, m := range []string{"GET", "DELETE"} {
		tr.want(404, m, "/v1/jobs/j_nope", "", "")
	}
	tr.want(404, "GET", "/v1/jobs/j_nope/events", "", "")
	tr.want(404, "POST", "/v1/jobs/j_nope/read-token", "", "")
}

// workerRefusals: what every worker post and a session's opening refuse.
func (tr *truthRun) workerRefusals(c *client.ClientWithResponses) {
	hw := openHTTPWorkerWith(tr.t, c, "refusals", client.WorkerRequest{Capabilities: &[]string{"model=demo"}})
	big := `{"generation":1,"data":"` + strings.Repeat("z", 70<<10) + `"}`
	for _, post := range []string{"accept", "reject", "output", "complete", "fail"} {
		path := "/v1/workers/" + hw.session + "/jobs/j_nope/" + post
		tr.want(400, "POST", path, "application/json", `{"generation":`)
		tr.want(413, "POST", path, "application/json", big)
		tr.want(415, "POST", path, "text/plain", `{"generation":1}`)
		tr.want(404, "POST", "/v1/workers/ws_nope/jobs/j_nope/"+post, "application/json", `{"generation":1}`)
	}
	tr.want(404, "POST", "/v1/workers/ws_nope/heartbeat", "", "")
	tr.want(400, "POST", "/v1/queues/bad$q/workers", "application/json", `{}`)
	tr.want(400, "POST", "/v1/queues/w/workers", "application/json", `{"capabilities":["no equals"]}`)
	tr.want(413, "POST", "/v1/queues/w/workers", "application/json", `{"name":"`+strings.Repeat("n", 70<<10)+`"}`)
	tr.want(415, "POST", "/v1/queues/w/workers", "text/plain", `{}`)
}

// members: the catalog's membership on a single member, whose learner
// never starts.
func (tr *truthRun) members() {
	tr.want(200, "GET", "/v1/cluster/members", "", "")
	tr.want(400, "POST", "/v1/cluster/members", "application/json", `{"name":"bad name","peer_url":"https://127.0.0.1:1"}`)
	tr.want(400, "POST", "/v1/cluster/members", "application/json", `{"name":`)
	tr.want(415, "POST", "/v1/cluster/members", "text/plain", `{}`)
	var added struct {
		Member struct {
			ID string `json:"id"`
		} `json:"member"`
	}
	if err := json.Unmarshal(tr.want(201, "POST", "/v1/cluster/members", "application/json", `{"name":"learner-1","peer_url":"https://127.0.0.1:1"}`), &added); err != nil || added.Member.ID == "" {
		tr.t.Fatalf("add member: %v, id %q", err, added.Member.ID)
	}
	tr.want(409, "POST", "/v1/cluster/members", "application/json", `{"name":"learner-2","peer_url":"https://127.0.0.1:2"}`)
	// Not started, the learner has no name yet: its id names it.
	tr.want(200, "DELETE", "/v1/cluster/members/"+added.Member.ID, "", "")
	tr.want(404, "DELETE", "/v1/cluster/members/"+added.Member.ID, "", "")
	tr.want(409, "DELETE", "/v1/cluster/members/"+tr.name, "", "")
}

// submitRefusals: what a submission is refused with.
func (tr *truthRun) submitRefusals(n *switchyard.Node) {
	t := tr.t
	// Queue held: a worker holding one job, one job waiting behind it.
	MustStartWorker(t, n, worker.Config{Queue: "held"}, func(ctx context.Context, _ *worker.Job, _ *worker.Output) (any, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	for range 2 {
		tr.want(202, "POST", "/v1/queues/held/jobs", "application/json", `{"input":"x","ttl_ms":60000}`)
	}
	waitFor(t, 5*time.Second, "one job waiting on held", func() bool {
		return metric(t, n, "switchyard_queue_depth", map[string]string{"queue": "held"}) == 1
	})
	for _, tc := range []struct {
		status      int
		queue, body string
		header      []string
	}{
		{400, "held", `{"input":`, nil},
		{400, "held", `{"ttl_ms":100}`, nil},
		{400, "bad$q", `{"input":"x"}`, nil},
		{409, "held", `{"input":"other"}`, []string{"Idempotency-Key", "t1"}},
		{413, "held", `{"input":"` + strings.Repeat("y", 2000) + `"}`, nil},
		{422, "held", `{"input":"x","ttl_ms":99999999}`, nil},
		{429, "held", `{"input":"x","limits":{"max_queue_depth":1}}`, nil},
		{503, "nobody", `{"input":"x"}`, nil},
	} {
		tr.want(tc.status, "POST", "/v1/queues/"+tc.queue+"/jobs", "application/json", tc.body, tc.header...)
	}
	tr.want(415, "POST", "/v1/queues/held/jobs", "text/plain", `{"input":"x"}`)
}

// views: the cluster and queue views, and the live cluster stream.
func (tr *truthRun) views() {
	tr.want(200, "GET", "/v1/cluster/nodes", "", "")
	tr.want(200, "GET", "/v1/queues", "", "")
	tr.want(200, "GET", "/v1/queues/demo", "", "")
	tr.want(404, "GET", "/v1/queues/nothing", "", "")
	tr.want(400, "GET", "/v1/queues/bad$q", "", "")
	tr.want(200, "POST", "/v1/cluster/read-token", "", "")
	tr.members()
	// The live view: its first snapshot, then the client leaves.
	res := tr.do("GET", "/v1/cluster/events", "", "")
	buf := make([]byte, 4096)
	var got bytes.Buffer
	for !bytes.Contains(got.Bytes(), []byte("\n\n")) {
		k, err := res.Body.Read(buf)
		got.Write(buf[:k])
		if err != nil {
			tr.t.Fatalf("cluster events: %v after %q", err, got.Bytes())
		}
	}
	res.Body.Close()
}

// openAI: the OpenAI-compatible front door, answered by an HTTP worker on
// its queue (demo): JSON and streamed, completed and failed, and its
// refusals.
func (tr *truthRun) openAI(c *client.ClientWithResponses) {
	t := tr.t
	hw := openHTTPWorkerWith(t, c, "demo", client.WorkerRequest{Capabilities: &[]string{"model=demo"}, Concurrency: ptr(4)})
	// The models are read from the catalog view, which learns of the
	// session's consumer a moment after it registered.
	waitFor(t, 5*time.Second, "the model listed", func() bool {
		res, err := http.Get(tr.base + "/openai/v1/models/demo")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == 200
	})
	tr.want(200, "GET", "/openai/v1/models", "", "")
	tr.want(200, "GET", "/openai/v1/models/demo", "", "")
	tr.want(404, "GET", "/openai/v1/models/nope", "", "")
	chat := func(stream bool) string {
		return `{"model":"demo","messages":[{"role":"user","content":"hi"}],"stream":` + map[bool]string{true: "true", false: "false"}[stream] + `}`
	}
	run := func(stream bool, end string, ttl string) *http.Response {
		done := make(chan *http.Response, 1)
		go func() {
			done <- tr.do("POST", "/openai/v1/chat/completions", "application/json", chat(stream), "X-Switchyard-TTL-Ms", ttl)
		}()
		o := hw.offer()
		hw.accept(o)
		if end == "expire" {
			return <-done
		}
		hw.output(o, "hel")
		hw.output(o, map[string]any{"content": "lo"})
		switch end {
		case "complete":
			tr.want(204, "POST", "/v1/workers/"+hw.session+"/jobs/"+o.JobId+"/complete", "application/json", `{"generation":1,"result":{"finish_reason":"stop"}}`)
		case "fail":
			tr.want(204, "POST", "/v1/workers/"+hw.session+"/jobs/"+o.JobId+"/fail", "application/json", `{"generation":1,"message":"no"}`)
		case "fail-own-code":
			tr.want(204, "POST", "/v1/workers/"+hw.session+"/jobs/"+o.JobId+"/fail", "application/json", `{"generation":1,"code":"model_error","message":"no"}`)
		}
		return <-done
	}
	for _, tc := range []struct {
		stream   bool
		end, ttl string
		status   int
	}{
		{false, "complete", "30000", 200},
		{true, "complete", "30000", 200},
		{false, "fail", "30000", 502},
		{false, "fail-own-code", "30000", 500},
		{true, "fail", "30000", 200},
		// Long enough for the offer to arrive on a loaded machine, short
		// enough to run out while the worker holds the job.
		{false, "expire", "1500", 504},
	} {
		res := run(tc.stream, tc.end, tc.ttl)
		if b := readBody(t, res); res.StatusCode != tc.status {
			t.Errorf("chat (stream %v, %s): %d, want %d: %s", tc.stream, tc.end, res.StatusCode, tc.status, b)
		}
	}
	tr.want(400, "POST", "/openai/v1/chat/completions", "application/json", `{"model":"demo","messages":[{"role":"user","content":"hi"}],"tools":[{}]}`)
	tr.want(404, "POST", "/openai/v1/chat/completions", "application/json", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`)
	tr.want(413, "POST", "/openai/v1/chat/completions", "application/json", `{"model":"demo","messages":[{"role":"user","content":"`+strings.Repeat("w", 2000)+`"}]}`)
	tr.want(415, "POST", "/openai/v1/chat/completions", "text/plain", chat(false))
	tr.want(422, "POST", "/openai/v1/chat/completions", "application/json", chat(false), "X-Switchyard-TTL-Ms", "99999999")
}

// pathParam fills a document path's parameters.
var pathParam = regexp.MustCompile(`\{[^}]+\}`)

// access: every operation that takes a credential, on a node that checks
// keys: 401 without a valid key, and 403 with a key that lacks the role
// (whichever of the test keys that is for the operation).
func (tr *truthRun) access() {
	k := MustStartSecuredNode(tr.t, func(c *switchyard.Config) { c.HTTP.OpenAIQueue = "chat" })
	kr := &truthRun{t: tr.t, dc: tr.dc, hc: tr.hc, base: baseURL(k)}
	for _, path := range tr.dc.doc.Paths.InMatchingOrder() {
		for method, op := range tr.dc.doc.Paths.Value(path).Operations() {
			if op.Security == nil {
				continue
			}
			url := pathParam.ReplaceAllStringFunc(path, func(p string) string {
				return map[string]string{"{queue}": "demo", "{model}": "demo"}[p] + map[bool]string{true: "x_nope"}[p != "{queue}" && p != "{model}"]
			})
			res := kr.do(method, url, "application/json", `{}`)
			if b := readBody(tr.t, res); res.StatusCode != 401 {
				tr.t.Errorf("%s %s without a key: %d: %s", method, url, res.StatusCode, b)
			}
			forbidden := false
			for _, key := range []string{keyAliceWork, keyBob, keyRoot} {
				res := kr.do(method, url, "application/json", `{}`, "Authorization", bearer(key))
				readBody(tr.t, res)
				if forbidden = res.StatusCode == 403; forbidden {
					break
				}
			}
			if !forbidden {
				tr.t.Errorf("%s %s: no test key is refused 403", method, url)
			}
		}
	}
}

// draining: a node that is shutting down refuses new work 503 and says
// it is not ready; it drains while one of its jobs runs.
func (tr *truthRun) draining() {
	t := tr.t
	d := MustStartNode(t, func(c *switchyard.Config) {
		// The drain lasts this long (its job never ends): the window in
		// which the refusals below are asked, wide for a loaded machine.
		c.DrainTimeout = 5 * time.Second
		c.HTTP.OpenAIQueue = "demo"
	})
	dr := &truthRun{t: t, dc: tr.dc, hc: tr.hc, base: baseURL(d)}
	started := make(chan struct{}, 1)
	MustStartWorker(t, d, worker.Config{Capabilities: []string{"model=demo"}}, func(ctx context.Context, _ *worker.Job, _ *worker.Output) (any, error) {
		started <- struct{}{}
		<-ctx.Done()
		return nil, ctx.Err()
	})
	long := post(t.Context(), t, d, "demo", `{"input":"x","ttl_ms":60000}`, true)
	defer long.Body.Close()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the draining node's job did not start")
	}
	closed := make(chan error, 1)
	go func() { closed <- d.Close(context.Background()) }()
	waitFor(t, 5*time.Second, "the node draining", func() bool {
		res, err := http.Get(baseURL(d) + "/readyz")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == 503
	})
	dr.want(503, "GET", "/readyz", "", "")
	dr.want(503, "POST", "/v1/queues/demo/jobs", "application/json", `{"input":"x"}`)
	dr.want(503, "POST", "/v1/queues/demo/workers", "application/json", `{}`)
	dr.want(503, "POST", "/openai/v1/chat/completions", "application/json", `{"model":"demo","messages":[{"role":"user","content":"hi"}]}`)
	readAll(t, long.Body)
	if err := <-closed; err != nil {
		t.Errorf("close the draining node: %v", err)
	}
}
