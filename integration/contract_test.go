package integration_test

import (
	"context"
	"encoding/json"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/internal/grpctest"
	"github.com/switchyard/switchyard/openapi"
	"github.com/switchyard/switchyard/openapi/client"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// recorder is an http.RoundTripper that remembers the requests it carried.
type recorder struct {
	mu   sync.Mutex
	seen []string
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	r.mu.Lock()
	r.seen = append(r.seen, req.Method+" "+req.URL.Path)
	r.mu.Unlock()
	return http.DefaultTransport.RoundTrip(req)
}

// jsonOperations are the operations of the document that take or return
// JSON (problems aside), as "METHOD path-regexp".
func jsonOperations(tb testing.TB) map[string]*regexp.Regexp {
	tb.Helper()
	var doc struct {
		Paths map[string]map[string]struct {
			OperationID string `json:"operationId"`
			RequestBody struct {
				Content map[string]any `json:"content"`
			} `json:"requestBody"`
			Responses map[string]struct {
				Content map[string]any `json:"content"`
			} `json:"responses"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(openapi.JSON, &doc); err != nil {
		tb.Fatal(err)
	}
	param := regexp.MustCompile(`\{[^}]+\}`)
	out := map[string]*regexp.Regexp{}
	for path, ops := range doc.Paths {
		for method, op := range ops {
			isJSON := op.RequestBody.Content["application/json"] != nil
			for _, r := range op.Responses {
				isJSON = isJSON || r.Content["application/json"] != nil
			}
			if isJSON && path != "/openapi.json" {
				out[op.OperationID] = regexp.MustCompile("^" + strings.ToUpper(method) + " " + param.ReplaceAllString(path, "[^/]+") + "$")
			}
		}
	}
	return out
}

// The generated client drives every JSON endpoint of the document against a
// real node, and the answers parse as the document says: the proof that
// the document tells the truth. The test fails if the document grows a
// JSON operation this test does not call.
func TestClientDrivesEveryJSONEndpoint(t *testing.T) {
	// The OpenAI-compatible front door posts to the HTTP worker's queue.
	n := MustStartNode(t, func(c *switchyard.Config) {
		c.HTTP.OpenAIQueue = "demo"
		// A fixed etcd peer port: a member on one chosen at start takes
		// no member (member_address_unusable), and the member routes are
		// driven below.
		c.EtcdPeerAddr = freeAddr(t)
	})
	rec := &recorder{}
	c, err := client.NewClientWithResponses(baseURL(n), client.WithHTTPClient(&http.Client{Transport: rec}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()

	// A worker over HTTP, through the client.
	hw := openHTTPWorker(t, n, "demo", client.WorkerRequest{Name: ptr("contract"), Capabilities: &[]string{"model=demo"}, Concurrency: ptr(2)})
	hw.c = c
	r, err := c.OpenWorkerSessionWithResponse(ctx, "bad$queue", client.WorkerRequest{})
	problemOf(t, "open on a bad queue", r.HTTPResponse, r.Body, err, 400, "invalid_queue_name")

	// Submit (202 with links and Location), then the same key again (200).
	env := client.Envelope{Input: "x", TtlMs: ptr(30000), Capabilities: &map[string]string{"model": "demo"}, Limits: &client.EnvelopeLimits{MaxOutputBytes: ptr(1000)}}
	sub, err := c.SubmitJobWithResponse(ctx, "demo", &client.SubmitJobParams{IdempotencyKey: ptr("k1")}, env)
	mustStatus(t, "submit", sub.HTTPResponse, sub.Body, err, 202)
	job := sub.JSON202
	if job.State != "queued" && job.State != "offered" || job.Links.Self != "/v1/jobs/"+job.JobId || job.Links.Events != job.Links.Self+"/events" ||
		sub.HTTPResponse.Header.Get("Location") != job.Links.Self || job.TtlMs != 30000 {
		t.Fatalf("202 %s (Location %q)", sub.Body, sub.HTTPResponse.Header.Get("Location"))
	}
	again, err := c.SubmitJobWithResponse(ctx, "demo", &client.SubmitJobParams{IdempotencyKey: ptr("k1")}, env)
	mustStatus(t, "submit again", again.HTTPResponse, again.Body, err, 200)
	var same client.Job
	if err := json.Unmarshal(again.Body, &same); err != nil || same.JobId != job.JobId {
		t.Fatalf("the retried submit: %s (%v)", again.Body, err)
	}
	bad, err := c.SubmitJobWithResponse(ctx, "demo", nil, client.Envelope{Input: nil})
	problemOf(t, "submit without input", bad.HTTPResponse, bad.Body, err, 400, "missing_input")

	// The worker runs it: accept, output, complete.
	o := hw.offer()
	hw.accept(o)
	hw.output(o, "out")
	cr, err := c.CompleteJobWithResponse(ctx, hw.session, o.JobId, client.CompleteMessage{Generation: o.Generation})
	mustStatus(t, "complete", cr.HTTPResponse, cr.Body, err, 204)
	g, err := c.GetJobWithResponse(ctx, job.JobId)
	mustStatus(t, "get", g.HTTPResponse, g.Body, err, 200)
	if g.JSON200.State != "completed" || g.JSON200.Outcome == nil || *g.JSON200.Outcome != "completed" || g.JSON200.Outputs != 1 ||
		g.JSON200.HandledBy == nil || g.JSON200.EndedAt == nil || g.JSON200.Worker == nil || *g.JSON200.Worker != "contract" {
		t.Fatalf("get %s", g.Body)
	}

	// Two more: one the worker fails, one it rejects (no other worker: the
	// job ends rejected); then a cancel.
	for _, action := range []string{"fail", "reject"} {
		s, err := c.SubmitJobWithResponse(ctx, "demo", nil, client.Envelope{Input: action, TtlMs: ptr(30000)})
		mustStatus(t, "submit", s.HTTPResponse, s.Body, err, 202)
		o := hw.offer()
		if action == "fail" {
			hw.accept(o)
			f, err := c.FailJobWithResponse(ctx, hw.session, o.JobId, client.FailMessage{Generation: o.Generation, Code: ptr("model_error"), Message: ptr("no")})
			mustStatus(t, "fail", f.HTTPResponse, f.Body, err, 204)
		} else {
			rj, err := c.RejectJobWithResponse(ctx, hw.session, o.JobId, client.RejectMessage{Generation: o.Generation})
			mustStatus(t, "reject", rj.HTTPResponse, rj.Body, err, 204)
		}
		want := map[string]string{"fail": "model_error", "reject": "rejected"}[action]
		g, err := c.GetJobWithResponse(ctx, s.JSON202.JobId)
		mustStatus(t, "get", g.HTTPResponse, g.Body, err, 200)
		if g.JSON200.Code == nil || *g.JSON200.Code != want {
			t.Fatalf("after %s: %s", action, g.Body)
		}
	}
	// The OpenAI-compatible front door: the models the HTTP worker offers,
	// and a chat completion it runs (not streamed: one JSON answer).
	ml, err := c.ListModelsWithResponse(ctx)
	mustStatus(t, "models", ml.HTTPResponse, ml.Body, err, 200)
	if len(ml.JSON200.Data) != 1 || ml.JSON200.Data[0].Id != "demo" {
		t.Fatalf("models %s", ml.Body)
	}
	mr, err := c.RetrieveModelWithResponse(ctx, "demo")
	mustStatus(t, "model", mr.HTTPResponse, mr.Body, err, 200)
	mn, err := c.RetrieveModelWithResponse(ctx, "nope")
	if err != nil || mn.StatusCode() != 404 || mn.JSON404 == nil || mn.JSON404.Error.Code != "model_not_found" {
		t.Fatalf("an unknown model: %v %s", err, mn.Body)
	}
	type chatAnswer struct {
		r   *client.CreateChatCompletionResponse
		err error
	}
	answered := make(chan chatAnswer, 1)
	go func() {
		r, err := c.CreateChatCompletionWithResponse(ctx, nil, client.ChatCompletionRequest{
			Model: "demo", Messages: []client.ChatMessage{{Role: "user", Content: "hello"}},
		})
		answered <- chatAnswer{r, err}
	}()
	o = hw.offer()
	hw.accept(o)
	hw.output(o, "out")
	cr, err = c.CompleteJobWithResponse(ctx, hw.session, o.JobId, client.CompleteMessage{Generation: o.Generation})
	mustStatus(t, "complete the chat job", cr.HTTPResponse, cr.Body, err, 204)
	a := <-answered
	mustStatus(t, "chat completion", a.r.HTTPResponse, a.r.Body, a.err, 200)
	if len(a.r.JSON200.Choices) != 1 || a.r.JSON200.Choices[0].Message.Content != "out" || a.r.JSON200.Object != "chat.completion" {
		t.Fatalf("chat completion %s", a.r.Body)
	}

	hb, err := c.WorkerHeartbeatWithResponse(ctx, hw.session)
	mustStatus(t, "heartbeat", hb.HTTPResponse, hb.Body, err, 204)
	s, err := c.SubmitJobWithResponse(ctx, "demo", nil, client.Envelope{Input: "to cancel", TtlMs: ptr(30000)})
	mustStatus(t, "submit", s.HTTPResponse, s.Body, err, 202)
	cancel, err := c.CancelJobWithResponse(ctx, s.JSON202.JobId)
	mustStatus(t, "cancel", cancel.HTTPResponse, cancel.Body, err, 200)
	if cancel.JSON200.State != "cancelled" || *cancel.JSON200.Code != "cancelled" {
		t.Fatalf("cancel %s", cancel.Body)
	}
	nf, err := c.CancelJobWithResponse(ctx, "j_nope")
	problemOf(t, "cancel unknown", nf.HTTPResponse, nf.Body, err, 404, "job_not_found")

	// The views.
	nodes, err := c.ListNodesWithResponse(ctx)
	mustStatus(t, "nodes", nodes.HTTPResponse, nodes.Body, err, 200)
	if len(nodes.JSON200.Nodes) != 1 || nodes.JSON200.Nodes[0].Id != "it-node" || nodes.JSON200.Nodes[0].State != "online" || nodes.JSON200.Nodes[0].HttpAddr == nil {
		t.Fatalf("nodes %s", nodes.Body)
	}
	qs, err := c.ListQueuesWithResponse(ctx)
	mustStatus(t, "queues", qs.HTTPResponse, qs.Body, err, 200)
	if len(qs.JSON200.Queues) != 1 || qs.JSON200.Queues[0].Name != "demo" || len(qs.JSON200.Queues[0].Consumers) != 1 || qs.JSON200.Queues[0].Local == nil {
		t.Fatalf("queues %s", qs.Body)
	}
	q, err := c.GetQueueWithResponse(ctx, "demo")
	mustStatus(t, "queue", q.HTTPResponse, q.Body, err, 200)
	if q.JSON200.Dispatcher == nil || *q.JSON200.Dispatcher != "it-node" || q.JSON200.Consumers[0].Capabilities[0] != "model=demo" {
		t.Fatalf("queue %s", q.Body)
	}
	nq, err := c.GetQueueWithResponse(ctx, "nothing-here")
	problemOf(t, "unknown queue", nq.HTTPResponse, nq.Body, err, 404, "not_found")
	// Read tokens, for an EventSource.
	rt, err := c.JobReadTokenWithResponse(ctx, job.JobId)
	mustStatus(t, "job read token", rt.HTTPResponse, rt.Body, err, 200)
	if rt.JSON200.Token == "" || rt.JSON200.ExpiresAt == "" {
		t.Fatalf("read token %s", rt.Body)
	}
	ct, err := c.ClusterReadTokenWithResponse(ctx)
	mustStatus(t, "cluster read token", ct.HTTPResponse, ct.Body, err, 200)
	rz, err := c.ReadyzWithResponse(ctx)
	mustStatus(t, "readyz", rz.HTTPResponse, rz.Body, err, 200)

	// The catalog's members: this node's single member, a learner added
	// (never started) and removed by its id.
	mem, err := c.ListMembersWithResponse(ctx)
	mustStatus(t, "members", mem.HTTPResponse, mem.Body, err, 200)
	if len(mem.JSON200.Members) != 1 || mem.JSON200.Members[0].Name != "it-node" || !mem.JSON200.Members[0].Healthy || !mem.JSON200.Members[0].Leader {
		t.Fatalf("members %s", mem.Body)
	}
	ma, err := c.AddMemberWithResponse(ctx, client.MemberAddRequest{Name: "contract-learner", PeerUrl: "https://127.0.0.1:1"})
	mustStatus(t, "add member", ma.HTTPResponse, ma.Body, err, 201)
	if !ma.JSON201.Member.Learner || len(ma.JSON201.Members) != 2 || !slices.Contains(ma.JSON201.Flags, "existing") {
		t.Fatalf("add member %s", ma.Body)
	}
	mrm, err := c.RemoveMemberWithResponse(ctx, ma.JSON201.Member.Id)
	mustStatus(t, "remove member", mrm.HTTPResponse, mrm.Body, err, 200)
	mb, err := c.AddMemberWithResponse(ctx, client.MemberAddRequest{Name: "bad name", PeerUrl: "https://127.0.0.1:1"})
	problemOf(t, "add a bad member", mb.HTTPResponse, mb.Body, err, 400, "invalid_member")

	// Every JSON operation of the document was called.
	for id, re := range jsonOperations(t) {
		called := false
		for _, s := range rec.seen {
			called = called || re.MatchString(s)
		}
		if !called {
			t.Errorf("operation %s (%s) was not driven by the generated client", id, re)
		}
	}
}

// The same error on a gateway route and on a chi route is the same problem
// document (only the instance, the path, differs), and gRPC answers it
// with the table's status and the same code.
func TestGatewayAndChiAgreeOnErrors(t *testing.T) {
	n := MustStartNode(t, nil)
	c := apiClient(t, n)
	ctx := t.Context()
	strip := func(b []byte) map[string]any {
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		delete(m, "instance")
		return m
	}
	same := func(what string, a, b []byte) {
		t.Helper()
		if x, y := strip(a), strip(b); !equalJSON(x, y) {
			t.Errorf("%s: gateway %s, chi %s", what, a, b)
		}
	}
	// job_not_found: GET /v1/jobs/{id} (gateway), GET /v1/jobs/{id}/events (chi).
	g, err := c.GetJobWithResponse(ctx, "j_nope")
	problemOf(t, "gateway", g.HTTPResponse, g.Body, err, 404, "job_not_found")
	ev, err := c.JobEvents(ctx, "j_nope", nil)
	if err != nil {
		t.Fatal(err)
	}
	evBody := readBody(t, ev)
	problemOf(t, "chi", ev, evBody, nil, 404, "job_not_found")
	same("job_not_found", g.Body, evBody)
	// invalid_queue_name: GET /v1/queues/{queue} (gateway), POST .../jobs (chi).
	q, err := c.GetQueueWithResponse(ctx, "bad$name")
	problemOf(t, "gateway", q.HTTPResponse, q.Body, err, 400, "invalid_queue_name")
	s, err := c.SubmitJobWithResponse(ctx, "bad$name", nil, client.Envelope{Input: "x"})
	problemOf(t, "chi", s.HTTPResponse, s.Body, err, 400, "invalid_queue_name")
	same("invalid_queue_name", q.Body, s.Body)

	conn := grpctest.Dial(t, n.GRPCAddr())
	for _, tc := range []struct {
		call func(context.Context) error
		code codes.Code
		want string
	}{
		{func(ctx context.Context) error {
			_, err := pb.NewJobServiceClient(conn).Get(ctx, &pb.GetJobRequest{JobId: "j_nope"})
			return err
		}, codes.NotFound, "job_not_found"},
		{func(ctx context.Context) error {
			_, err := pb.NewClusterServiceClient(conn).GetQueue(ctx, &pb.GetQueueRequest{Queue: "bad$name"})
			return err
		}, codes.InvalidArgument, "invalid_queue_name"},
		{func(ctx context.Context) error {
			_, err := pb.NewClusterServiceClient(conn).GetQueue(ctx, &pb.GetQueueRequest{Queue: "nothing"})
			return err
		}, codes.NotFound, "not_found"},
	} {
		st := status.Convert(tc.call(ctx))
		var reason string
		for _, d := range st.Details() {
			if info, ok := d.(*errdetails.ErrorInfo); ok {
				reason = info.GetReason()
			}
		}
		if st.Code() != tc.code || reason != tc.want || !strings.HasPrefix(st.Message(), tc.want+": ") {
			t.Errorf("gRPC: %s %q (reason %q), want %s %s", st.Code(), st.Message(), reason, tc.code, tc.want)
		}
	}
	// The cluster view over gRPC is the gateway's JSON, field for field.
	nodes, err := pb.NewClusterServiceClient(conn).ListNodes(ctx, &pb.ListNodesRequest{})
	if err != nil || len(nodes.GetNodes()) != 1 || nodes.GetNodes()[0].GetId() != "it-node" || nodes.GetNodes()[0].GetHttpAddr() != n.HTTPAddr() {
		t.Fatalf("ListNodes: %v, %v", nodes, err)
	}
}

func equalJSON(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}
