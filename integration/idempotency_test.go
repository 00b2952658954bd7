package integration_test

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sse "github.com/tmaxmax/go-sse"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/switchyard/switchyard"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
	"github.com/switchyard/switchyard/worker"
)

// An Idempotency-Key holds across the cluster: two streamed POSTs with one
// key through different nodes make one job, and both stream it (the second
// node relays to the job's ingress node); so does a gRPC Submit through the
// third, and its SubmitBatched; the same key with another body is refused
// with 409 on any node; another subject's same key is another key.
func TestIdempotencyAcrossNodes(t *testing.T) {
	keys := writeKeys(t, accessKeys())
	nodes := startCluster(t, 3, func(_ int, c *switchyard.Config) { c.Auth.File = keys })
	n1, n2, n3 := nodes[0], nodes[1], nodes[2]
	MustStartWorker(t, n3, worker.Config{Name: "w3", Queue: "demo", Concurrency: 4, DialOptions: []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()), worker.APIKey(keyAliceWork)}}, worker.Tokens(100*time.Millisecond))
	for _, n := range nodes {
		waitFor(t, 10*time.Second, "n3 dispatching demo", func() bool { return dispatcherOf(n, "demo") == "n3" })
	}
	const body = `{"input":"one two three four five six","ttl_ms":20000}`
	stream := func(n *switchyard.Node, key, idem, body string) (string, []sse.Event, int) {
		res := keyed(t, t.Context(), "POST", baseURL(n)+"/v1/queues/demo/jobs", key, "application/json", body,
			"Accept", "text/event-stream", "Idempotency-Key", idem)
		defer res.Body.Close()
		if res.StatusCode != 200 {
			return "", nil, res.StatusCode
		}
		return res.Header.Get("X-Job-Id"), readAll(t, res.Body), 200
	}

	var wg sync.WaitGroup
	var id1, id2 string
	var evs1, evs2 []sse.Event
	wg.Go(func() { id1, evs1, _ = stream(n1, keyAlice, "order-42", body) })
	// The retry reaches n2 while the job streams on n1.
	waitFor(t, 10*time.Second, "the job running on n1", func() bool {
		return metric(t, n1, "switchyard_stream_open", map[string]string{"transport": "sse"}) == 1
	})
	wg.Go(func() {
		id2, evs2, _ = stream(n2, keyAlice, "order-42", strings.Replace(body, `"input"`, ` "input" `, 1))
	})
	// And through the third, over gRPC.
	conn := grpcConn(t, n3)
	st, err := pb.NewJobServiceClient(conn).Submit(withKey(t.Context(), keyAlice),
		&pb.SubmitRequest{Queue: "demo", EnvelopeJson: []byte(body), IdempotencyKey: "order-42"})
	if err != nil {
		t.Fatal(err)
	}
	gevs, err := recvAll(st)
	wg.Wait()
	if err != nil || len(gevs) == 0 {
		t.Fatalf("gRPC through n3: %v", err)
	}
	if id1 == "" || id2 != id1 || gevs[0].GetJobId() != id1 {
		t.Fatalf("one key, three nodes: jobs %q, %q, %q", id1, id2, gevs[0].GetJobId())
	}
	outputs := func(evs []sse.Event) string {
		var b strings.Builder
		for _, ev := range evs {
			if ev.Type == "output" {
				b.WriteString(field[string](t, ev, "data"))
			}
		}
		return b.String()
	}
	for name, evs := range map[string][]sse.Event{"n1": evs1, "n2": evs2} {
		if last := evs[len(evs)-1]; last.Type != "done" || outputs(evs) != "one two three four five six" {
			t.Errorf("the stream through %s: %v %q", name, types(evs), outputs(evs))
		}
	}
	if last := gevs[len(gevs)-1]; last.GetKind() != "done" {
		t.Errorf("the gRPC stream through n3 ended %s", last.GetKind())
	}
	// SubmitBatched through n3 is relayed the same way: the other node's
	// Submit, each event in a batch of its own.
	bst, err := pb.NewJobServiceClient(conn).SubmitBatched(withKey(t.Context(), keyAlice),
		&pb.SubmitRequest{Queue: "demo", EnvelopeJson: []byte(body), IdempotencyKey: "order-42"})
	if err != nil {
		t.Fatal(err)
	}
	bs, err := recvBatches(bst, 0)
	if bevs := flatten(bs); err != nil || len(bevs) != len(gevs) || bevs[0].GetJobId() != id1 || bevs[len(bevs)-1].GetKind() != "done" {
		t.Fatalf("SubmitBatched through n3: %v %v, %v", kinds(bevs), len(bs), err)
	}
	for i, b := range bs {
		if len(b.GetEvents()) != 1 {
			t.Errorf("relayed batch %d holds %d events", i, len(b.GetEvents()))
		}
	}

	// Another body with the key: 409 on every node.
	for _, n := range nodes {
		res := keyed(t, t.Context(), "POST", baseURL(n)+"/v1/queues/demo/jobs", keyAlice, "application/json",
			`{"input":"another order","ttl_ms":20000}`, "Idempotency-Key", "order-42")
		problemOf(t, "another body through "+n.Catalog().Name(), res, readBody(t, res), nil, 409, "idempotency_key_reused")
	}
	// bob's order-42 is his own.
	bobID, bobEvs, status := stream(n2, keyBob, "order-42", body)
	if status != 200 || bobID == id1 || bobEvs[len(bobEvs)-1].Type != "done" {
		t.Fatalf("bob's key: %d %q", status, bobID)
	}
	// Two jobs ran in all, on the one worker.
	var ended float64
	for _, n := range nodes {
		ended += metric(t, n, "switchyard_jobs_total", map[string]string{"outcome": "completed"})
	}
	if ended != 2 {
		t.Errorf("%v jobs completed across the cluster, want 2 (alice's one, bob's one)", ended)
	}
	if !slices.Contains(types(evs2), "accepted") {
		t.Errorf("the relayed stream: %v", types(evs2))
	}
}
