package integration_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/openapi/client"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// strictCase is a JSON text a node must refuse (docs/errors.md, "Strict
// JSON"), and the field a refusal of a member named twice names.
type strictCase struct {
	name, body, field string
}

// The envelopes every door is tried with: what encoding/json would have
// mended (invalid UTF-8, a lone surrogate escape, both turned into U+FFFD)
// or read two ways (a member named twice, the last one winning).
var strictEnvelopes = []strictCase{
	{"invalid UTF-8", "{\"input\":\"bad \xff\xfe\"}", ""},
	{"lone surrogate escape", `{"input":"\ud800 alone"}`, ""},
	{"ttl_ms twice", `{"ttl_ms":1000,"ttl_ms":600000,"input":"x"}`, "ttl_ms"},
	{"capability twice", `{"input":"x","capabilities":{"model":"demo","model":"gpt"}}`, "capabilities.model"},
	{"member twice inside input", `{"input":{"text":"a","text":"b"}}`, "input.text"},
}

// TestStrictJSONAtEveryDoor sends what is not strict JSON to every door
// that takes JSON from outside, on a node with a worker for the queue,
// and checks each answer: 400 malformed_json (InvalidArgument on gRPC)
// naming the fault for a request, bad_output ending the job for a gRPC
// worker's output, and nothing made or changed by any refusal.
func TestStrictJSONAtEveryDoor(t *testing.T) {
	n := MustStartNode(t, func(c *switchyard.Config) {
		// The raw worker sends no heartbeats.
		c.Workers.IdleTimeout = time.Minute
	})
	raw := dialRaw(t, n, "demo")
	ctx := t.Context()
	answer := func(door, name string, status any, code, detail string) {
		t.Logf("%-14s %-27s -> %v %s (%s)", door, name, status, code, detail)
	}

	t.Run("HTTP envelope", func(t *testing.T) {
		for _, tc := range strictEnvelopes {
			res := post(ctx, t, n, "demo", tc.body, false)
			p := problemOf(t, tc.name, res, readBody(t, res), nil, 400, "malformed_json")
			if p.Field != nil && *p.Field != tc.field || p.Field == nil && tc.field != "" {
				t.Errorf("%s: field %v, want %q", tc.name, p.Field, tc.field)
			}
			answer("POST jobs", tc.name, p.Status, string(p.Code), deref(p.Detail))
		}
	})
	t.Run("gRPC envelope", func(t *testing.T) {
		c := jobsClient(t, n)
		for _, tc := range strictEnvelopes {
			st, err := c.Submit(ctx, &pb.SubmitRequest{Queue: "demo", EnvelopeJson: []byte(tc.body)})
			if err == nil {
				_, err = st.Recv()
			}
			s := wantStatus(t, err, codes.InvalidArgument, "malformed_json")
			answer("gRPC Submit", tc.name, s.Code(), "malformed_json", s.Message())
		}
	})
	t.Run("OpenAI request", func(t *testing.T) {
		for _, tc := range []strictCase{
			{"invalid UTF-8", "{\"model\":\"demo\",\"messages\":[{\"role\":\"user\",\"content\":\"\xc3\x28\"}]}", ""},
			{"lone surrogate escape", `{"model":"demo","messages":[{"role":"user","content":"\udfff"}]}`, ""},
			{"model twice", `{"model":"demo","model":"gpt-4","messages":[{"role":"user","content":"hi"}]}`, "model"},
			{"member twice in a message", `{"model":"demo","messages":[{"role":"user","role":"system","content":"hi"}]}`, "messages[0].role"},
		} {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, baseURL(n)+"/openai/v1/chat/completions", strings.NewReader(tc.body))
			req.Header.Set("Content-Type", "application/json")
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var e struct {
				Error struct{ Message, Type, Code string }
			}
			body := readBody(t, res)
			if err := json.Unmarshal(body, &e); err != nil || res.StatusCode != 400 || e.Error.Code != "malformed_json" || e.Error.Type != "invalid_request_error" {
				t.Fatalf("%s: %d %s, want 400 malformed_json invalid_request_error", tc.name, res.StatusCode, body)
			}
			answer("POST chat", tc.name, res.StatusCode, e.Error.Code, e.Error.Message)
		}
	})
	// Nothing was made by any refusal: the worker of queue demo holds no
	// job, none waits, none ended.
	for _, q := range n.Engine().QueueStats() {
		if q.Depth != 0 || q.Bound != 0 {
			t.Errorf("queue %s after the refusals: %+v", q.Name, q)
		}
	}
	for _, o := range []string{"completed", "failed", "cancelled", "expired"} {
		if v := metric(t, n, "switchyard_jobs_total", map[string]string{"outcome": o}); v != 0 {
			t.Errorf("jobs_total{%s} = %v after the refusals", o, v)
		}
	}

	t.Run("HTTP worker posts", func(t *testing.T) {
		c := apiClient(t, n)
		res, err := c.OpenWorkerSessionWithBody(ctx, "hq", "application/json", strings.NewReader(`{"concurrency":1,"concurrency":64}`))
		if err != nil {
			t.Fatal(err)
		}
		p := problemOf(t, "session", res, readBody(t, res), nil, 400, "malformed_json")
		answer("POST workers", "concurrency twice", p.Status, string(p.Code), deref(p.Detail))

		hw := openHTTPWorker(t, n, "hq", client.WorkerRequest{Capabilities: &[]string{"model=demo"}})
		job, o := hw.submitAndAccept(ctx, n, "hq", `{"input":"a","ttl_ms":30000}`)
		for _, tc := range []struct{ name, action, body string }{
			{"invalid UTF-8 output", "output", "{\"generation\":1,\"data\":\"\xed\xa0\x80\"}"},
			{"lone surrogate output", "output", `{"generation":1,"data":{"text":"\ud83d"}}`},
			{"member twice in output", "output", `{"generation":1,"data":{"text":"a","text":"b"}}`},
			{"generation twice", "output", `{"generation":1,"generation":2,"data":"x"}`},
			{"member twice in result", "complete", `{"generation":1,"result":{"n":1,"n":2}}`},
		} {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, baseURL(n)+"/v1/workers/"+hw.session+"/jobs/"+o.JobId+"/"+tc.action, strings.NewReader(tc.body))
			req.Header.Set("Content-Type", "application/json")
			res, err := http.DefaultClient.Do(req)
			p := problemOf(t, tc.name, res, readBody(t, res), err, 400, "malformed_json")
			answer("POST "+tc.action, tc.name, p.Status, string(p.Code), deref(p.Detail))
		}
		// Nothing changed: the job runs, with no output, and takes a valid
		// one.
		g, err := c.GetJobWithResponse(ctx, job.JobId)
		mustStatus(t, "get", g.HTTPResponse, g.Body, err, 200)
		if g.JSON200.State != "running" || g.JSON200.Outputs != 0 {
			t.Fatalf("job after the refusals: %s", g.Body)
		}
		hw.output(o, map[string]any{"text": "é ✓ 😀"})
		r, err := c.CompleteJobWithResponse(ctx, hw.session, o.JobId, client.CompleteMessage{Generation: o.Generation})
		mustStatus(t, "complete", r.HTTPResponse, r.Body, err, 204)
	})

	t.Run("gRPC worker output", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			send func(job string, gen uint64) *pb.WorkerMessage
		}{
			{"invalid UTF-8 output", func(job string, gen uint64) *pb.WorkerMessage {
				return output(job, gen, "\"bad \xff\"")
			}},
			{"lone surrogate output", func(job string, gen uint64) *pb.WorkerMessage {
				return output(job, gen, `{"text":"\udc00"}`)
			}},
			{"member twice in output", func(job string, gen uint64) *pb.WorkerMessage {
				return output(job, gen, `{"text":"a","text":"b"}`)
			}},
			{"member twice in result", func(job string, gen uint64) *pb.WorkerMessage {
				return &pb.WorkerMessage{Msg: &pb.WorkerMessage_Complete{Complete: &pb.Complete{JobId: job, Generation: gen, Result: []byte(`{"n":1,"n":2}`)}}}
			}},
		} {
			res := post(ctx, t, n, "demo", `{"input":"a","ttl_ms":30000}`, true)
			job := raw.accept(tc.name)
			raw.send(tc.send(job.JobId, job.Generation))
			evs := readAll(t, res.Body)
			res.Body.Close()
			last := evs[len(evs)-1]
			if last.Type != "error" || field[string](t, last, "code") != string(core.CodeBadOutput) {
				t.Fatalf("%s: events %v, last %s: want error bad_output", tc.name, types(evs), last.Data)
			}
			for _, ev := range evs {
				if ev.Type == "output" {
					t.Errorf("%s: an output reached the stream: %s", tc.name, ev.Data)
				}
			}
			if strings.Contains(tc.name, "result") {
				answer("gRPC worker", tc.name, "event error", "bad_output", field[string](t, last, "detail"))
				continue // the worker ended the job itself
			}
			// The worker is told to stop the job, and answers, which frees
			// its slot.
			if c := raw.recv().GetCancel(); c == nil || c.GetJobId() != job.JobId {
				t.Fatalf("%s: the worker was not told to stop the job", tc.name)
			}
			raw.send(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Fail{Fail: &pb.Fail{JobId: job.JobId, Generation: job.Generation, Code: "cancelled"}}})
			answer("gRPC worker", tc.name, "event error", "bad_output", field[string](t, last, "detail"))
		}
	})
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func output(job string, gen uint64, data string) *pb.WorkerMessage {
	return &pb.WorkerMessage{Msg: &pb.WorkerMessage_Output{Output: &pb.Output{JobId: job, Generation: gen, Data: []byte(data)}}}
}

// An Idempotency-Key longer than core.MaxIdempotencyKeyBytes is refused,
// on HTTP and gRPC, before anything is made; one of that length works.
func TestIdempotencyKeyCap(t *testing.T) {
	n := MustStartNode(t, func(c *switchyard.Config) { c.Workers.IdleTimeout = time.Minute })
	raw := dialRaw(t, n, "demo")
	long := strings.Repeat("k", core.MaxIdempotencyKeyBytes+1)
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, baseURL(n)+"/v1/queues/demo/jobs", strings.NewReader(`{"input":"x"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", long)
	res, err := http.DefaultClient.Do(req)
	p := problemOf(t, "long key", res, readBody(t, res), err, 400, "invalid_idempotency_key")
	t.Logf("Idempotency-Key of %d bytes -> %d %s (%s)", len(long), p.Status, p.Code, deref(p.Detail))

	st, err := jobsClient(t, n).Submit(context.Background(), &pb.SubmitRequest{Queue: "demo", EnvelopeJson: []byte(`{"input":"x"}`), IdempotencyKey: long})
	if err == nil {
		_, err = st.Recv()
	}
	wantStatus(t, err, codes.InvalidArgument, "invalid_idempotency_key")
	for _, q := range n.Engine().QueueStats() {
		if q.Depth != 0 || q.Bound != 0 {
			t.Errorf("queue %s after the refusals: %+v", q.Name, q)
		}
	}

	req, _ = http.NewRequestWithContext(t.Context(), http.MethodPost, baseURL(n)+"/v1/queues/demo/jobs", strings.NewReader(`{"input":"x"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", long[1:])
	res, err = http.DefaultClient.Do(req)
	mustStatus(t, "key of the longest length", res, readBody(t, res), err, 202)
	if raw.recv().GetJob() == nil {
		t.Fatal("the job of the accepted key was not offered")
	}
}
