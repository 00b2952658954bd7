package integration_test

import (
	"context"
	"encoding/json"
	"iter"
	"net/http"
	"strings"
	"testing"
	"time"

	sse "github.com/tmaxmax/go-sse"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/openapi/client"
	"github.com/switchyard/switchyard/worker"
)

// httpWorker is a worker session over HTTP driven by hand through the
// generated client, so a test can make it misbehave.
type httpWorker struct {
	tb      testing.TB
	c       *client.ClientWithResponses
	res     *http.Response
	next    func() (sse.Event, error, bool)
	stop    func()
	session string
}

// openHTTPWorker opens a session on queue and reads its registered event.
func openHTTPWorker(tb testing.TB, n *switchyard.Node, queue string, req client.WorkerRequest) *httpWorker {
	tb.Helper()
	return openHTTPWorkerWith(tb, apiClient(tb, n), queue, req)
}

// openHTTPWorkerWith is openHTTPWorker through c, for the session and
// every post.
func openHTTPWorkerWith(tb testing.TB, c *client.ClientWithResponses, queue string, req client.WorkerRequest) *httpWorker {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	res, err := c.OpenWorkerSession(ctx, queue, req)
	if err != nil {
		cancel()
		tb.Fatal(err)
	}
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "text/event-stream" {
		cancel()
		tb.Fatalf("open session: %d %s: %s", res.StatusCode, res.Header.Get("Content-Type"), readBody(tb, res))
	}
	hw := &httpWorker{tb: tb, c: c, res: res}
	next, stopRead := iter.Pull2(sse.Read(res.Body, nil))
	hw.next = next
	stopped := false
	hw.stop = func() {
		if !stopped {
			stopped = true
			cancel()
			res.Body.Close()
			stopRead()
		}
	}
	tb.Cleanup(hw.stop)
	ev := hw.recv("registered")
	var reg client.RegisteredEvent
	if err := json.Unmarshal([]byte(ev.Data), &reg); err != nil || reg.Session == "" || reg.HeartbeatMs <= 0 {
		tb.Fatalf("registered %s: %v", ev.Data, err)
	}
	hw.session = reg.Session
	return hw
}

// recv returns the next event, failing unless it is of type want.
func (hw *httpWorker) recv(want string) sse.Event {
	hw.tb.Helper()
	ev, err, ok := hw.next()
	if !ok || err != nil {
		hw.tb.Fatalf("session stream ended waiting for %s: %v", want, err)
	}
	if ev.Type != want {
		hw.tb.Fatalf("event %s %s, want %s", ev.Type, ev.Data, want)
	}
	return ev
}

// offer reads the next job offer.
func (hw *httpWorker) offer() client.JobOffer {
	hw.tb.Helper()
	var o client.JobOffer
	if err := json.Unmarshal([]byte(hw.recv("job").Data), &o); err != nil {
		hw.tb.Fatal(err)
	}
	return o
}

// submitAndAccept submits env to n's queue (no stream), and accepts the
// offer of it that hw reads next.
func (hw *httpWorker) submitAndAccept(ctx context.Context, n *switchyard.Node, queue, env string) (client.Job, client.JobOffer) {
	hw.tb.Helper()
	var job client.Job
	if err := json.Unmarshal(readBody(hw.tb, post(ctx, hw.tb, n, queue, env, false)), &job); err != nil {
		hw.tb.Fatal(err)
	}
	o := hw.offer()
	hw.accept(o)
	return job, o
}

func (hw *httpWorker) accept(o client.JobOffer) {
	hw.tb.Helper()
	r, err := hw.c.AcceptJobWithResponse(context.Background(), hw.session, o.JobId, client.JobMessage{Generation: o.Generation})
	mustStatus(hw.tb, "accept", r.HTTPResponse, r.Body, err, 204)
}

func (hw *httpWorker) output(o client.JobOffer, data any) {
	hw.tb.Helper()
	r, err := hw.c.JobOutputWithResponse(context.Background(), hw.session, o.JobId, client.OutputMessage{Generation: o.Generation, Data: data})
	mustStatus(hw.tb, "output", r.HTTPResponse, r.Body, err, 204)
}

// A job runs on an HTTP worker exactly as on a gRPC one: offer, accept,
// output in order, complete with a result.
func TestHTTPWorkerRunsAJob(t *testing.T) {
	n := MustStartNode(t, nil)
	hw := openHTTPWorker(t, n, "demo", client.WorkerRequest{Name: ptr("by-hand"), Capabilities: &[]string{"model=demo"}, Concurrency: ptr(2)})
	c := apiClient(t, n)
	res, err := c.SubmitJob(t.Context(), "demo", &client.SubmitJobParams{Accept: ptr("text/event-stream")},
		client.Envelope{Input: map[string]any{"words": []string{"a", "b"}}, TtlMs: ptr(20000), Options: &map[string]any{"k": "v"},
			AffinityKey: ptr("session-9"), Priority: ptr(3)})
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("submit: %v %v", res, err)
	}
	defer res.Body.Close()
	o := hw.offer()
	if o.Queue != "demo" || o.TtlMs <= 0 || o.TtlMs > 20000 || o.Generation != 1 || (*o.Options)["k"] != "v" || o.MaxOutputBytes <= 0 ||
		o.AffinityKey == nil || *o.AffinityKey != "session-9" || o.Priority == nil || *o.Priority != 3 {
		t.Fatalf("offer %+v", o)
	}
	if in, _ := json.Marshal(o.Input); string(in) != `{"words":["a","b"]}` {
		t.Fatalf("input %s", in)
	}
	hw.accept(o)
	hw.output(o, "a")
	hw.output(o, map[string]any{"b": 2})
	r, err := hw.c.CompleteJobWithResponse(t.Context(), hw.session, o.JobId, client.CompleteMessage{Generation: o.Generation, Result: map[string]any{"n": 2}})
	mustStatus(t, "complete", r.HTTPResponse, r.Body, err, 204)
	evs := readAll(t, res.Body)
	if got := strings.Join(types(evs), ","); got != "accepted,output,output,done" {
		t.Fatalf("events %s", got)
	}
	if evs[2].Data == "" || !strings.Contains(evs[2].Data, `"data":{"b":2}`) || !strings.Contains(evs[3].Data, `"result":{"n":2}`) {
		t.Fatalf("events %v", evs)
	}
	// The queue view shows the consumer with what it declared.
	q, err := c.GetQueueWithResponse(t.Context(), "demo")
	mustStatus(t, "queue", q.HTTPResponse, q.Body, err, 200)
	if len(q.JSON200.Consumers) != 1 || q.JSON200.Consumers[0].Concurrency != 2 || *q.JSON200.Consumers[0].Name != "by-hand" {
		t.Fatalf("queue %s", q.Body)
	}
}

// A worker that rejects a job keeps its session; the job goes to another
// worker. One that does not answer in time is dropped as stalled, with a
// closed event that says so.
func TestHTTPWorkerRejectAndStall(t *testing.T) {
	n := MustStartNode(t, func(c *switchyard.Config) {
		c.Engine.DispatchTimeoutFloor = 100 * time.Millisecond
		c.Engine.DispatchTimeoutCeiling = 300 * time.Millisecond
	})
	hw := openHTTPWorker(t, n, "demo", client.WorkerRequest{Capabilities: &[]string{"model=demo"}})
	res := post(t.Context(), t, n, "demo", `{"input":"a b","ttl_ms":20000}`, true)
	defer res.Body.Close()
	o := hw.offer()
	// Another capable worker is there when it rejects.
	stopSDK := MustStartWorker(t, n, worker.Config{}, worker.Tokens(0))
	r, err := hw.c.RejectJobWithResponse(t.Context(), hw.session, o.JobId, client.RejectMessage{Generation: o.Generation, Reason: ptr("not today")})
	mustStatus(t, "reject", r.HTTPResponse, r.Body, err, 204)
	evs := readAll(t, res.Body)
	if last := evs[len(evs)-1]; last.Type != "done" || field[uint64](t, last, "attempt") != 2 {
		t.Fatalf("events %v, last %s", types(evs), last.Data)
	}
	if got := metric(t, n, "switchyard_dispatch_stalls_total", nil); got != 0 {
		t.Fatalf("a reject counted as a stall: %v", got)
	}

	// The rejecting worker kept its session: with the other one gone, it is
	// offered the next job; it does not answer, and is dropped.
	stopSDK()
	waitFor(t, 5*time.Second, "the SDK worker gone", func() bool {
		return metric(t, n, "switchyard_workers_connected", nil) == 1
	})
	res2 := post(t.Context(), t, n, "demo", `{"input":"c","ttl_ms":20000}`, false)
	res2.Body.Close()
	hw.offer()
	ev := hw.recv("closed")
	if !strings.Contains(ev.Data, `"code":"session_closed"`) {
		t.Fatalf("closed %s", ev.Data)
	}
	if got := metric(t, n, "switchyard_dispatch_stalls_total", nil); got != 1 {
		t.Fatalf("stalls %v", got)
	}
}

// A worker that stops reading its stream (and posting) loses its jobs as a
// gRPC worker does: after the idle timeout the session ends; a job that
// produced no output goes back to the queue and runs elsewhere, one that
// did ends worker_lost. A worker whose stream drops loses them at once.
func TestHTTPWorkerLostLosesItsJobs(t *testing.T) {
	for _, tc := range []struct {
		name     string
		output   bool
		drop     bool
		wantLast string
	}{
		{"stops reading, no output", false, false, "done"},
		{"stops reading, after output", true, false, "error"},
		{"drops its stream, no output", false, true, "done"},
		{"drops its stream, after output", true, true, "error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := MustStartNode(t, nil)
			hw := openHTTPWorker(t, n, "demo", client.WorkerRequest{Capabilities: &[]string{"model=demo"}})
			res := post(t.Context(), t, n, "demo", `{"input":"a b","ttl_ms":30000}`, true)
			defer res.Body.Close()
			o := hw.offer()
			hw.accept(o)
			if tc.output {
				hw.output(o, "a ")
			}
			start := time.Now()
			if tc.drop {
				hw.stop()
			}
			// Stopped reading: nothing more is read or posted.
			waitFor(t, 5*time.Second, "session ended", func() bool {
				return metric(t, n, "switchyard_workers_connected", nil) == 0
			})
			took := time.Since(start)
			if tc.drop && took > 500*time.Millisecond {
				t.Errorf("a dropped stream took %s to end its session", took)
			}
			t.Logf("session ended after %s", took)
			if !tc.output {
				MustStartWorker(t, n, worker.Config{}, worker.Tokens(0))
			}
			evs := readAll(t, res.Body)
			last := evs[len(evs)-1]
			if last.Type != tc.wantLast {
				t.Fatalf("events %v, last %s", types(evs), last.Data)
			}
			if tc.output && field[string](t, last, "code") != "worker_lost" {
				t.Fatalf("last %s, want worker_lost", last.Data)
			}
			if !tc.output && field[uint64](t, last, "attempt") != 2 {
				t.Fatalf("last %s, want attempt 2", last.Data)
			}
		})
	}
}

// Every bad post is answered with its problem code and changes nothing.
func TestHTTPWorkerBadInput(t *testing.T) {
	n := MustStartNode(t, func(c *switchyard.Config) {
		c.Engine.Limits.MaxInputBytes = 1024
	})
	c := apiClient(t, n)
	ctx := t.Context()
	open := func(queue, ctype, body string) (*client.OpenWorkerSessionResponse, error) {
		res, err := c.OpenWorkerSessionWithBody(ctx, queue, ctype, strings.NewReader(body))
		if err != nil {
			return nil, err
		}
		return client.ParseOpenWorkerSessionResponse(res)
	}
	for _, tc := range []struct {
		name, queue, ctype, body string
		status                   int
		code                     string
	}{
		{"malformed json", "demo", "application/json", `{"capabilities":`, 400, "malformed_json"},
		{"wrong type", "demo", "application/json", `{"concurrency":"x"}`, 400, "invalid_field"},
		{"bad capability", "demo", "application/json", `{"capabilities":["no equals"]}`, 400, "invalid_worker"},
		{"bad concurrency", "demo", "application/json", `{"concurrency":-1}`, 400, "invalid_worker"},
		{"huge concurrency", "demo", "application/json", `{"concurrency":2000000000}`, 400, "invalid_worker"},
		{"bad queue", "bad$q", "application/json", `{}`, 400, "invalid_queue_name"},
		{"wrong content type", "demo", "text/plain", `{}`, 415, "unsupported_media_type"},
		{"body too large", "demo", "application/json", `{"name":"` + strings.Repeat("x", 100<<10) + `"}`, 413, "body_too_large"},
	} {
		r, err := open(tc.queue, tc.ctype, tc.body)
		if err != nil {
			t.Fatal(err)
		}
		problemOf(t, "open: "+tc.name, r.HTTPResponse, r.Body, err, tc.status, tc.code)
	}
	if got := metric(t, n, "switchyard_workers_connected", nil); got != 0 {
		t.Fatalf("a refused session registered: %v workers", got)
	}

	hw := openHTTPWorker(t, n, "demo", client.WorkerRequest{Capabilities: &[]string{"model=demo"}})
	job, o := hw.submitAndAccept(ctx, n, "demo", `{"input":"a","ttl_ms":30000}`)
	postRaw := func(session, job, action, ctype, body string) (*http.Response, []byte, error) {
		req, err := http.NewRequestWithContext(ctx, "POST", baseURL(n)+"/v1/workers/"+session+"/jobs/"+job+"/"+action, strings.NewReader(body))
		if err != nil {
			return nil, nil, err
		}
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, nil, err
		}
		return res, readBody(t, res), nil
	}
	gen := `{"generation":1,"data":"x"}`
	for _, tc := range []struct {
		name, session, job, action, ctype, body string
		status                                  int
		code                                    string
	}{
		{"unknown session", "ws_nope", o.JobId, "output", "application/json", gen, 404, "session_not_found"},
		{"unknown job", hw.session, "j_nope", "output", "application/json", gen, 409, "job_not_held"},
		{"another generation", hw.session, o.JobId, "output", "application/json", `{"generation":7,"data":"x"}`, 409, "job_not_held"},
		{"complete another generation", hw.session, o.JobId, "complete", "application/json", `{"generation":2}`, 409, "job_not_held"},
		{"malformed json", hw.session, o.JobId, "output", "application/json", `{"generation":1,"data":`, 400, "malformed_json"},
		{"no generation", hw.session, o.JobId, "output", "application/json", `{"data":"x"}`, 400, "invalid_field"},
		{"no data", hw.session, o.JobId, "output", "application/json", `{"generation":1}`, 400, "invalid_field"},
		{"generation not a number", hw.session, o.JobId, "accept", "application/json", `{"generation":"one"}`, 400, "invalid_field"},
		{"wrong content type", hw.session, o.JobId, "output", "text/plain", gen, 415, "unsupported_media_type"},
		{"no content type", hw.session, o.JobId, "fail", "", `{"generation":1}`, 415, "unsupported_media_type"},
		{"output too large a body", hw.session, o.JobId, "output", "application/json", `{"generation":1,"data":"` + strings.Repeat("y", 100<<10) + `"}`, 413, "body_too_large"},
	} {
		res, body, err := postRaw(tc.session, tc.job, tc.action, tc.ctype, tc.body)
		problemOf(t, tc.name, res, body, err, tc.status, tc.code)
	}
	// Nothing changed: the job runs, bound to the session, with no output.
	g, err := c.GetJobWithResponse(ctx, job.JobId)
	mustStatus(t, "get", g.HTTPResponse, g.Body, err, 200)
	if g.JSON200.State != "running" || g.JSON200.Outputs != 0 || g.JSON200.Generation != 1 {
		t.Fatalf("job after the refusals: %s", g.Body)
	}
	if got := metric(t, n, "switchyard_workers_connected", nil); got != 1 {
		t.Fatalf("workers %v after the refusals", got)
	}
	// The heartbeat of an unknown session is refused too.
	hb, err := c.WorkerHeartbeatWithResponse(ctx, "ws_nope")
	problemOf(t, "heartbeat", hb.HTTPResponse, hb.Body, err, 404, "session_not_found")
	hb, err = c.WorkerHeartbeatWithResponse(ctx, hw.session)
	mustStatus(t, "heartbeat", hb.HTTPResponse, hb.Body, err, 204)
}
