package integration_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	sse "github.com/tmaxmax/go-sse"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/apierr"
	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/internal/grpctest"
	"github.com/switchyard/switchyard/openapi/client"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
	"github.com/switchyard/switchyard/worker"
)

// documentedCode is a row of docs/errors.md's table.
type documentedCode struct {
	http int
	grpc codes.Code
}

// needsAFault are the codes the public API of healthy nodes cannot be made
// to answer with: each needs a fault injected below it. They are tested
// where that fault can be made, named here; a code joins this list only
// with a reason.
var needsAFault = map[string]string{
	"internal":               "a server fault: httpapi TestWriteError, apierr TestStatusHidesServerFaults",
	"catalog_unavailable":    "etcd refusing a write: grpcapi TestRegisterRefusals, TestUpdateCapabilitiesCatalogFailure",
	"dispatcher_unavailable": "a dispatcher node that cannot be reached or elected: no test provokes it yet (a fault test's job)",
	"too_large":              "a message over the peer size limit between two nodes: peer TestDeliveryUndeliverableIsNotSentNorRetried",
	"quorum_at_risk":         "a cluster with members down: catalog TestMembership removes a member while a quorum is down",
	"write_failed":           "a gRPC client whose transport stops taking writes (its Submit stream stalls): TestGRPCOwnerIsPaced",
}

// Every code of docs/errors.md is provoked through the public API — HTTP,
// and gRPC where the code exists there — and answered with the document's
// HTTP status and gRPC code. The document must list exactly the codes the
// node can emit (apierr's table: apierr's own tests keep the table and
// core's codes the same), and each must have a case here.
func TestEveryDocumentedCode(t *testing.T) {
	t.Parallel()
	doc := documentedCodes(t)
	var table []string
	for _, c := range apierr.Codes() {
		table = append(table, string(c))
	}
	if documented := slices.Sorted(maps.Keys(doc)); !slices.Equal(documented, table) {
		t.Fatalf("docs/errors.md lists %v, the node can answer with %v", documented, table)
	}
	p := newCodeProbe(t, doc)
	p.refusals()
	p.outcomes()
	p.httpWorkers()
	p.grpcWorkers()
	p.access()
	p.drain()
	p.stalledBody()
	p.openAI()
	p.members()
	for code := range doc {
		if reason, ok := needsAFault[code]; ok {
			if p.seen[code] {
				t.Errorf("%s was provoked here, yet is listed as needing a fault (%s): take it off the list", code, reason)
			}
			continue
		}
		if !p.seen[code] {
			t.Errorf("no case here provokes %s through the public API: add one (or, with a reason, to needsAFault)", code)
		}
	}
	for code := range needsAFault {
		if _, ok := doc[code]; !ok {
			t.Errorf("needsAFault names %s, which docs/errors.md does not list", code)
		}
	}
}

// codeProbe provokes codes on a node and records which it saw, each
// checked against docs/errors.md.
type codeProbe struct {
	t       *testing.T
	ctx     context.Context
	doc     map[string]documentedCode
	seen    map[string]bool
	n       *switchyard.Node
	conn    *grpc.ClientConn
	jobs    pb.JobServiceClient
	cluster pb.ClusterServiceClient
}

// newCodeProbe starts the node the probe provokes: small limits, short
// dispatch and setup timeouts, an output window of 4 outputs.
func newCodeProbe(t *testing.T, doc map[string]documentedCode) *codeProbe {
	n := MustStartNode(t, func(c *switchyard.Config) {
		c.Engine.OutputWindowEvents = probeWindow
		c.Engine.Limits.MaxInputBytes = 1024
		c.Engine.DispatchTimeoutFloor = 100 * time.Millisecond
		c.Engine.DispatchTimeoutCeiling = 300 * time.Millisecond
		c.Workers.SetupTimeout = 300 * time.Millisecond
		c.HTTP.BodyTimeout = 300 * time.Millisecond
	})
	conn := grpctest.Dial(t, n.GRPCAddr())
	return &codeProbe{
		t: t, ctx: t.Context(), doc: doc, seen: map[string]bool{}, n: n, conn: conn,
		jobs: pb.NewJobServiceClient(conn), cluster: pb.NewClusterServiceClient(conn),
	}
}

// probeWindow is the probe node's output window, in outputs.
const probeWindow = 4

// unread submits a streamed job to queue and leaves its stream at once,
// asking for a grace window: the job goes on with no reader, so its worker
// gets no credit past its window. It returns once the node saw the stream
// end.
func (p *codeProbe) unread(queue string) string {
	p.t.Helper()
	before := metric(p.t, p.n, "switchyard_stream_ended_total", map[string]string{"transport": "sse", "reason": "client_gone"})
	res := p.submit(queue, `{"input":"x","ttl_ms":20000,"grace_ms":20000}`, "Accept", "text/event-stream")
	id := res.Header.Get("X-Job-Id")
	res.Body.Close()
	waitFor(p.t, 5*time.Second, "the stream of "+id+" to end", func() bool {
		return metric(p.t, p.n, "switchyard_stream_ended_total", map[string]string{"transport": "sse", "reason": "client_gone"}) > before
	})
	return id
}

// check records code, answered with an HTTP status and/or a gRPC code (0
// and OK: not checked), and compares them with the document.
func (p *codeProbe) check(code string, httpStatus int, grpcCode codes.Code) {
	p.t.Helper()
	d, ok := p.doc[code]
	if !ok {
		p.t.Errorf("the node answered %s, which docs/errors.md does not list", code)
		return
	}
	if httpStatus != 0 && httpStatus != d.http {
		p.t.Errorf("%s: HTTP %d, docs/errors.md says %d", code, httpStatus, d.http)
	}
	if grpcCode != codes.OK && grpcCode != d.grpc {
		p.t.Errorf("%s: gRPC %s, docs/errors.md says %s", code, grpcCode, d.grpc)
	}
	p.seen[code] = true
}

// problem checks an HTTP answer is the problem for code.
func (p *codeProbe) problem(code string, res *http.Response) {
	p.t.Helper()
	b := readBody(p.t, res)
	var pr apierr.Problem
	if err := json.Unmarshal(b, &pr); err != nil || pr.Code != code || pr.Status != res.StatusCode {
		p.t.Errorf("want problem %s, got %d %s", code, res.StatusCode, b)
		return
	}
	p.check(code, res.StatusCode, codes.OK)
}

// grpcErr checks a gRPC call ended with the status for code.
func (p *codeProbe) grpcErr(code string, err error) {
	p.t.Helper()
	st := status.Convert(err)
	reason := ""
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			reason = info.GetReason()
		}
	}
	if reason != code {
		p.t.Errorf("want gRPC %s, got %s %q", code, st.Code(), st.Message())
		return
	}
	p.check(code, 0, st.Code())
}

// ended checks a job stream's last event is an error with code.
func (p *codeProbe) ended(code string, evs []sse.Event) {
	p.t.Helper()
	if last := evs[len(evs)-1]; last.Type != "error" || field[string](p.t, last, "code") != code {
		p.t.Errorf("want a job ended %s, got %v %s", code, types(evs), last.Data)
		return
	}
	p.check(code, 0, codes.OK)
}

// closed checks an HTTP worker session ended with a closed event for code.
func (p *codeProbe) closed(code string, hw *httpWorker) {
	p.t.Helper()
	for {
		ev, err, ok := hw.next()
		if !ok || err != nil {
			p.t.Errorf("want a session closed %s: the stream ended (%v)", code, err)
			return
		}
		if ev.Type == "closed" {
			if !strings.Contains(ev.Data, `"code":"`+code+`"`) {
				p.t.Errorf("want a session closed %s, got %s", code, ev.Data)
				return
			}
			p.check(code, 0, codes.OK)
			return
		}
	}
}

// raw sends a request to the probe's node; header is name, value pairs.
func (p *codeProbe) raw(method, path, ctype, body string, header ...string) *http.Response {
	p.t.Helper()
	return send(p.t, p.ctx, http.DefaultClient, method, baseURL(p.n)+path, ctype, body, header...)
}

func (p *codeProbe) submit(queue, env string, header ...string) *http.Response {
	return p.raw("POST", "/v1/queues/"+queue+"/jobs", "application/json", env, header...)
}

// submitErr is a gRPC Submit's error: at the call or at its first Recv.
func (p *codeProbe) submitErr(queue, env, key string) error {
	return streamErr(p.jobs.Submit(p.ctx, &pb.SubmitRequest{Queue: queue, EnvelopeJson: []byte(env), IdempotencyKey: key}))
}

// refusals: a request refused before anything is enqueued, over HTTP and
// over gRPC.
func (p *codeProbe) refusals() {
	// Queue "held": one worker that holds its job until cancelled, and one
	// job waiting behind it (3 bytes of input).
	MustStartWorker(p.t, p.n, worker.Config{Queue: "held"}, func(ctx context.Context, _ *worker.Job, _ *worker.Output) (any, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	for range 2 {
		res := p.submit("held", `{"input":"x","ttl_ms":60000}`, "Idempotency-Key", "")
		mustStatus(p.t, "fill held", res, readBody(p.t, res), nil, 202)
	}
	waitFor(p.t, 5*time.Second, "one job waiting on held", func() bool {
		return metric(p.t, p.n, "switchyard_queue_depth", map[string]string{"queue": "held"}) == 1
	})

	// The envelope's refusals, over HTTP and over gRPC.
	for _, tc := range []struct{ code, queue, env string }{
		{"malformed_json", "held", `{"input":`},
		{"invalid_field", "held", `{"input":"x","ttl_ms":"soon"}`},
		{"unsupported_version", "held", `{"version":9,"input":"x"}`},
		{"missing_input", "held", `{"ttl_ms":100}`},
		{"invalid_queue_name", "bad$q", `{"input":"x"}`},
		{"input_too_large", "held", `{"input":"` + strings.Repeat("y", 2000) + `"}`},
		{"ttl_out_of_range", "held", `{"input":"x","ttl_ms":99999999}`},
		{"limit_above_ceiling", "held", `{"input":"x","limits":{"max_input_bytes":999999}}`},
		{"invalid_affinity_key", "held", `{"input":"x","affinity_key":42}`},
		{"priority_out_of_range", "held", `{"input":"x","priority":6}`},
		{"queue_full", "held", `{"input":"x","limits":{"max_queue_depth":1}}`},
		{"queue_bytes_full", "held", `{"input":"xx","limits":{"max_queue_bytes":4}}`},
		{"no_capable_worker", "nobody", `{"input":"x"}`},
	} {
		p.problem(tc.code, p.submit(tc.queue, tc.env))
		p.grpcErr(tc.code, p.submitErr(tc.queue, tc.env, ""))
	}
	res := p.submit("held", `{"input":"x","ttl_ms":60000}`, "Idempotency-Key", "k1")
	mustStatus(p.t, "keyed", res, readBody(p.t, res), nil, 202)
	MustStartWorker(p.t, p.n, worker.Config{Queue: "other"}, worker.Tokens(0))
	p.problem("idempotency_key_reused", p.submit("other", `{"input":"x"}`, "Idempotency-Key", "k1"))
	p.grpcErr("idempotency_key_reused", p.submitErr("other", `{"input":"x"}`, "k1"))
	long := strings.Repeat("k", core.MaxIdempotencyKeyBytes+1)
	p.problem("invalid_idempotency_key", p.submit("held", `{"input":"x"}`, "Idempotency-Key", long))
	p.grpcErr("invalid_idempotency_key", p.submitErr("held", `{"input":"x"}`, long))
	p.problem("unsupported_media_type", p.raw("POST", "/v1/queues/held/jobs", "text/plain", `{"input":"x"}`))
	p.problem("body_too_large", p.submit("held", `{"input":"`+strings.Repeat("z", 200<<10)+`"}`))
	p.problem("not_found", p.raw("GET", "/v1/nothing", "", ""))
	p.problem("not_found", p.raw("GET", "/v1/queues/nothing", "", ""))
	_, err := p.cluster.GetQueue(p.ctx, &pb.GetQueueRequest{Queue: "nothing"})
	p.grpcErr("not_found", err)
	p.problem("method_not_allowed", p.raw("PUT", "/v1/queues/held/jobs", "", ""))
	p.problem("job_not_found", p.raw("GET", "/v1/jobs/j_nope", "", ""))
	_, err = p.jobs.Get(p.ctx, &pb.GetJobRequest{JobId: "j_nope"})
	p.grpcErr("job_not_found", err)

	// A bad resume token.
	keyed := jobIDOf(p.t, p.submit("held", `{"input":"x","ttl_ms":60000}`, "Idempotency-Key", "k1"))
	p.problem("invalid_resume_token", p.raw("GET", "/v1/jobs/"+keyed+"/events", "", "", "Last-Event-ID", "forged"))
	p.grpcErr("invalid_resume_token", streamErr(p.jobs.Resume(p.ctx, &pb.ResumeRequest{JobId: keyed, ResumeToken: "forged"})))
}

// outcomes: a job's own ends that need no worker.
func (p *codeProbe) outcomes() {
	// Outcomes: expired in the queue, cancelled by a DELETE.
	exp := p.submit("held", `{"input":"x","ttl_ms":100}`, "Accept", "text/event-stream")
	p.ended("expired", readAll(p.t, exp.Body))
	exp.Body.Close()
	cancelled := p.submit("held", `{"input":"x","ttl_ms":60000}`, "Accept", "text/event-stream")
	id := cancelled.Header.Get("X-Job-Id")
	res := p.raw("DELETE", "/v1/jobs/"+id, "", "")
	mustStatus(p.t, "cancel", res, readBody(p.t, res), nil, 200)
	p.ended("cancelled", readAll(p.t, cancelled.Body))
	cancelled.Body.Close()
}

// httpWorkers: what an HTTP worker can make a job end with, the refusals
// of its posts, and its session's own ends.
func (p *codeProbe) httpWorkers() {
	// HTTP workers: each outcome a worker can cause, and the refusals of
	// its posts.
	c := apiClient(p.t, p.n)
	stream := func(queue, env string) (*http.Response, *httpWorker, client.JobOffer) {
		hw := openHTTPWorker(p.t, p.n, queue, client.WorkerRequest{Capabilities: &[]string{"model=demo"}})
		res := p.submit(queue, env, "Accept", "text/event-stream")
		return res, hw, hw.offer()
	}
	res, hw, o := stream("w1", `{"input":"x","ttl_ms":20000}`)
	r, err := c.RejectJobWithResponse(p.ctx, hw.session, o.JobId, client.RejectMessage{Generation: o.Generation})
	mustStatus(p.t, "reject", r.HTTPResponse, r.Body, err, 204)
	p.ended("rejected", readAll(p.t, res.Body))
	r2, err := c.AcceptJobWithBody(p.ctx, hw.session, o.JobId, "application/json", strings.NewReader(`{"generation":1}`))
	if err != nil {
		p.t.Fatal(err)
	}
	p.problem("job_not_held", r2)
	r3, err := c.WorkerHeartbeat(p.ctx, "ws_nope")
	if err != nil {
		p.t.Fatal(err)
	}
	p.problem("session_not_found", r3)
	hw.stop()

	res, hw, o = stream("w2", `{"input":"x","ttl_ms":20000}`)
	hw.accept(o)
	f, err := c.FailJobWithResponse(p.ctx, hw.session, o.JobId, client.FailMessage{Generation: o.Generation})
	mustStatus(p.t, "fail", f.HTTPResponse, f.Body, err, 204)
	p.ended("worker_error", readAll(p.t, res.Body))
	hw.stop()

	res, hw, o = stream("w3", `{"input":"x","ttl_ms":20000,"limits":{"max_output_bytes":3}}`)
	hw.accept(o)
	hw.output(o, "four")
	p.ended("output_too_large", readAll(p.t, res.Body))
	hw.stop()

	res, hw, o = stream("w4", `{"input":"x","ttl_ms":20000}`)
	hw.accept(o)
	hw.output(o, "a")
	hw.stop()
	p.ended("worker_lost", readAll(p.t, res.Body))

	// An output past the window of a job nobody reads waits for credit,
	// then is refused: nothing taken, post it again later.
	hw = openHTTPWorker(p.t, p.n, "w8", client.WorkerRequest{Capabilities: &[]string{"model=demo"}})
	p.unread("w8")
	o = hw.offer()
	hw.accept(o)
	for i := range probeWindow {
		hw.output(o, i)
	}
	behind, err := c.JobOutput(p.ctx, hw.session, o.JobId, client.OutputMessage{Generation: o.Generation, Data: "past the window"})
	if err != nil {
		p.t.Fatal(err)
	}
	if behind.Header.Get("Retry-After") == "" {
		p.t.Error("reader_behind without Retry-After")
	}
	p.problem("reader_behind", behind)
	hw.stop()

	// The session's own ends: a stall, silence.
	res, hw, _ = stream("w5", `{"input":"x","ttl_ms":20000}`)
	p.closed("session_closed", hw)
	res.Body.Close()
	hw = openHTTPWorker(p.t, p.n, "w6", client.WorkerRequest{Capabilities: &[]string{"model=demo"}})
	p.closed("idle_timeout", hw)
	p.problem("invalid_worker", p.raw("POST", "/v1/queues/w7/workers", "application/json", `{"capabilities":["no equals"]}`))
}

// grpcWorkers: the ends of gRPC worker sessions, and bad output.
func (p *codeProbe) grpcWorkers() {
	// gRPC worker sessions: the same ends, and those only a stream of
	// messages can have.
	workers := pb.NewWorkerServiceClient(p.conn)
	connect := func() pb.WorkerService_ConnectClient {
		s, err := workers.Connect(p.ctx)
		if err != nil {
			p.t.Fatal(err)
		}
		return s
	}
	register := func(s pb.WorkerService_ConnectClient, queue string) {
		if err := s.Send(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Register{Register: &pb.Register{Queue: queue, Capabilities: []string{"model=demo"}}}}); err != nil {
			p.t.Fatal(err)
		}
		if m, err := s.Recv(); err != nil || m.GetRegistered() == nil {
			p.t.Fatalf("register: %v %v", m, err)
		}
	}
	ends := func(s pb.WorkerService_ConnectClient) error {
		for {
			if _, err := s.Recv(); err != nil {
				return err
			}
		}
	}
	s := connect()
	_ = s.Send(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Register{Register: &pb.Register{Queue: "g1", Capabilities: []string{"no equals"}}}})
	p.grpcErr("invalid_worker", ends(s))
	s = connect()
	_ = s.Send(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Heartbeat{Heartbeat: &pb.Heartbeat{}}})
	p.grpcErr("unexpected_message", ends(s))
	p.grpcErr("setup_timeout", ends(connect()))
	s = connect()
	register(s, "g2")
	p.grpcErr("idle_timeout", ends(s))
	s = connect()
	register(s, "g3")
	for range 200 {
		if s.Send(&pb.WorkerMessage{Msg: &pb.WorkerMessage_UpdateCapabilities{UpdateCapabilities: &pb.UpdateCapabilities{Capabilities: []string{"model=demo"}}}}) != nil {
			break
		}
	}
	p.grpcErr("too_many_updates", ends(s))
	s = connect()
	register(s, "g4")
	bad := p.submit("g4", `{"input":"x","ttl_ms":20000}`, "Accept", "text/event-stream")
	offer := nextOf(p.t, s, (*pb.NodeMessage).GetJob)
	_ = s.Send(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Output{Output: &pb.Output{JobId: offer.JobId, Generation: offer.Generation, Data: []byte("not json")}}})
	p.ended("bad_output", readAll(p.t, bad.Body))
	bad.Body.Close()

	// A worker that sends past its job's output credit: the job fails
	// credit_exceeded and is cancelled on the worker; the session goes on.
	g5 := connect()
	register(g5, "g5")
	id := p.unread("g5")
	job := nextOf(p.t, g5, (*pb.NodeMessage).GetJob)
	if c := job.GetOutputCredit(); c.GetEvents() != probeWindow || c.GetJobId() != id {
		p.t.Fatalf("offer's output credit %v, want the window of %d outputs for %s", c, probeWindow, id)
	}
	for range probeWindow + 1 {
		_ = g5.Send(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Output{Output: &pb.Output{JobId: job.JobId, Generation: job.Generation, Data: []byte(`"x"`)}}})
	}
	cancel := nextOf(p.t, g5, (*pb.NodeMessage).GetCancel)
	if cancel.GetReason() != "credit_exceeded" {
		p.t.Errorf("cancel %v, want reason credit_exceeded", cancel)
	}
	ev := p.raw("GET", "/v1/jobs/"+id+"/events", "", "")
	p.ended("credit_exceeded", readAll(p.t, ev.Body))
	ev.Body.Close()
	_ = g5.CloseSend()
	stall := p.submit("g4", `{"input":"y","ttl_ms":20000}`, "Accept", "text/event-stream")
	p.grpcErr("session_closed", ends(s))
	stall.Body.Close()
}

// stalledBody: a POST whose body stops arriving is answered 408
// request_timeout once the node's body timeout passes (HTTP only; the edge
// cases, trickled and stalled, are TestHTTPEdge's).
// access: the refusals of a node that checks keys, over HTTP and gRPC.
func (p *codeProbe) access() {
	const limited, capped = "limited-key-000000000001", "capped-key-0000000000001"
	n := MustStartNode(p.t, func(c *switchyard.Config) {
		c.Auth.Inline = accessKeys() + "  - subject: limited\n    key: " + limited + "\n    roles: [submit, work]\n    queues: [demo]\n    rate: 0.01\n    burst: 1\n" +
			"  - subject: capped\n    key: " + capped + "\n    roles: [submit]\n    queues: [demo]\n    max_priority: 0\n"
	})
	MustStartWorker(p.t, n, worker.Config{Queue: "demo", DialOptions: []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()), worker.APIKey(limited)}}, worker.Tokens(0))
	jobs := pb.NewJobServiceClient(grpcConn(p.t, n))
	var res *http.Response
	submit := func(key, queue string) (*http.Response, error) {
		res := keyed(p.t, p.ctx, "POST", baseURL(n)+"/v1/queues/"+queue+"/jobs", key, "application/json", `{"input":"x"}`)
		return res, streamErr(jobs.Submit(withKey(p.ctx, key), &pb.SubmitRequest{Queue: queue, EnvelopeJson: []byte(`{"input":"x"}`)}))
	}
	// The front door's unknown model (OpenAI's error shape).
	res = p.raw("POST", "/openai/v1/chat/completions", "application/json", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`)
	if body := readBody(p.t, res); problemCode(body) == "model_not_found" {
		p.check("model_not_found", res.StatusCode, codes.OK)
	} else {
		p.t.Errorf("want model_not_found, got %d %s", res.StatusCode, body)
	}

	res, err := submit("", "demo")
	p.problem("unauthenticated", res)
	p.grpcErr("unauthenticated", err)
	res, err = submit(keyAlice, "forbidden")
	p.problem("permission_denied", res)
	p.grpcErr("permission_denied", err)
	// A priority above the key's max_priority.
	res = keyed(p.t, p.ctx, "POST", baseURL(n)+"/v1/queues/demo/jobs", capped, "application/json", `{"input":"x","priority":1}`)
	p.problem("priority_not_allowed", res)
	p.grpcErr("priority_not_allowed", streamErr(jobs.Submit(withKey(p.ctx, capped), &pb.SubmitRequest{Queue: "demo", EnvelopeJson: []byte(`{"input":"x","priority":1}`)})))
	// The limited key's one job of its burst, then its rate.
	res = keyed(p.t, p.ctx, "POST", baseURL(n)+"/v1/queues/demo/jobs", limited, "application/json", `{"input":"x"}`)
	mustStatus(p.t, "the burst", res, readBody(p.t, res), nil, 202)
	res, err = submit(limited, "demo")
	p.problem("rate_limited", res)
	p.grpcErr("rate_limited", err)
}

// members: the member routes' refusals on the probe's single member (HTTP
// only: there is no gRPC membership service).
func (p *codeProbe) members() {
	p.problem("invalid_member", p.raw("POST", "/v1/cluster/members", "application/json", `{"name":"n2","peer_url":"http://127.0.0.1:1"}`))
	p.problem("member_exists", p.raw("POST", "/v1/cluster/members", "application/json", `{"name":"`+p.n.Catalog().Name()+`","peer_url":"https://127.0.0.1:1"}`))
	// The probe's member listens on an etcd peer port chosen at start.
	p.problem("member_address_unusable", p.raw("POST", "/v1/cluster/members", "application/json", `{"name":"n2","peer_url":"https://127.0.0.1:1"}`))
	p.problem("member_not_found", p.raw("DELETE", "/v1/cluster/members/nobody", "", ""))
	p.problem("member_running", p.raw("DELETE", "/v1/cluster/members/"+p.n.Catalog().Name(), "", ""))
}

func (p *codeProbe) stalledBody() {
	c, err := net.Dial("tcp", p.n.HTTPAddr())
	if err != nil {
		p.t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	body := `{"input":"the rest never comes`
	if _, err := fmt.Fprintf(c, "POST /v1/queues/held/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body)+100, body); err != nil {
		p.t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		p.t.Fatalf("stalled body: no answer: %v", err)
	}
	p.problem("request_timeout", res)
}

// openAI: the OpenAI-compatible front door answers a model no worker
// offers with model_not_found, in OpenAI's error shape (HTTP only).
func (p *codeProbe) openAI() {
	body := `{"model":"nobody-offers-this","messages":[{"role":"user","content":"hi"}]}`
	req, err := http.NewRequestWithContext(p.ctx, http.MethodPost, baseURL(p.n)+"/openai/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		p.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		p.t.Fatal(err)
	}
	var e apierr.OpenAIErrorResponse
	if err := json.Unmarshal(readBody(p.t, res), &e); err != nil || e.Error.Code != "model_not_found" {
		p.t.Errorf("an unknown model: %d %+v (%v)", res.StatusCode, e, err)
		return
	}
	p.check("model_not_found", res.StatusCode, codes.OK)
}

// drain: a node that drains refuses new work (draining) and ends what it
// could not finish in its drain timeout (node_shutdown).
func (p *codeProbe) drain() {
	d := MustStartNode(p.t, func(c *switchyard.Config) { c.DrainTimeout = 500 * time.Millisecond })
	started := make(chan struct{}, 1)
	MustStartWorker(p.t, d, worker.Config{}, func(ctx context.Context, _ *worker.Job, _ *worker.Output) (any, error) {
		started <- struct{}{}
		<-ctx.Done()
		return nil, ctx.Err()
	})
	longJob := post(p.ctx, p.t, d, "demo", `{"input":"x","ttl_ms":60000}`, true)
	select {
	case <-started:
	case <-time.After(5 * time.Second):
		p.t.Fatal("the draining node's job did not start")
	}
	closeDone := make(chan error, 1)
	go func() { closeDone <- d.Close(context.Background()) }()
	dconn := grpctest.Dial(p.t, d.GRPCAddr())
	waitFor(p.t, 5*time.Second, "the node draining", func() bool {
		res, err := http.Get(baseURL(d) + "/readyz")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == 503
	})
	res, err := http.Get(baseURL(d) + "/readyz")
	if err != nil {
		p.t.Fatal(err)
	}
	p.problem("draining", res)
	req, _ := http.NewRequest("POST", baseURL(d)+"/v1/queues/demo/jobs", strings.NewReader(`{"input":"x"}`))
	req.Header.Set("Content-Type", "application/json")
	if res, err = http.DefaultClient.Do(req); err != nil {
		p.t.Fatal(err)
	}
	p.problem("draining", res)
	err = streamErr(pb.NewJobServiceClient(dconn).Submit(p.ctx, &pb.SubmitRequest{Queue: "demo", EnvelopeJson: []byte(`{"input":"x"}`)}))
	p.grpcErr("draining", err)
	p.ended("node_shutdown", readAll(p.t, longJob.Body))
	longJob.Body.Close()
	if err := <-closeDone; err != nil {
		p.t.Errorf("close the draining node: %v", err)
	}
}

// docRow is a row of docs/errors.md's code table.
var docRow = regexp.MustCompile("^\\| `([a-z_]+)` \\| ([0-9]{3}) \\| `([A-Za-z]+)` \\|")

func documentedCodes(tb testing.TB) map[string]documentedCode {
	tb.Helper()
	b, err := os.ReadFile("../docs/errors.md")
	if err != nil {
		tb.Fatal(err)
	}
	byName := map[string]codes.Code{}
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		byName[c.String()] = c
	}
	out := map[string]documentedCode{}
	for line := range strings.Lines(string(b)) {
		m := docRow.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		st, _ := strconv.Atoi(m[2])
		out[m[1]] = documentedCode{http: st, grpc: byName[m[3]]}
	}
	if len(out) < 30 {
		tb.Fatalf("read only %d codes from docs/errors.md: has the table's shape changed?", len(out))
	}
	return out
}

func jobIDOf(tb testing.TB, res *http.Response) string {
	tb.Helper()
	defer res.Body.Close()
	var j struct {
		JobID string `json:"job_id"`
	}
	b, _ := io.ReadAll(res.Body)
	if err := json.Unmarshal(b, &j); err != nil || j.JobID == "" {
		tb.Fatalf("no job id in %d %s", res.StatusCode, b)
	}
	return j.JobID
}

// nextOf reads a worker session until a message that get finds something
// in (an offer, a cancel), and returns that.
func nextOf[T any](tb testing.TB, s pb.WorkerService_ConnectClient, get func(*pb.NodeMessage) *T) *T {
	tb.Helper()
	for {
		m, err := s.Recv()
		if err != nil {
			tb.Fatal(err)
		}
		if v := get(m); v != nil {
			return v
		}
	}
}
