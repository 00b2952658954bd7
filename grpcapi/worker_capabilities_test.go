package grpcapi

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/internal/coretest"
	"github.com/switchyard/switchyard/internal/grpctest"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// wait bounds every wait for something that should happen promptly.
const wait = 5 * time.Second

// recordCaps returns the published capabilities of consumer id.
func recordCaps(cat *coretest.Catalog, id string) string {
	ci, _ := cat.Consumer(id)
	return strings.Join(ci.Capabilities.Strings(), ",")
}

// testNode is an engine with a fake catalog behind a WorkerService on
// loopback.
type testNode struct {
	e    *core.Engine
	cat  *coretest.Catalog
	srv  *WorkerServer
	addr string
}

func startTestNode(t *testing.T) *testNode {
	t.Helper()
	cat := &coretest.Catalog{}
	cfg := core.DefaultConfig()
	cfg.Node = "n1"
	cfg.Catalog = cat
	e, err := core.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewWorkerServer(e, WorkerConfig{SetupTimeout: time.Second, HeartbeatInterval: time.Second, IdleTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// After the gRPC server stops (grpctest's cleanup, registered later,
	// runs first): the sessions' goroutines, then the engine.
	t.Cleanup(func() {
		srv.Wait()
		e.Close()
	})
	// The session reads through the server's codec (newCodec), as on
	// NewServer's server.
	gs := grpc.NewServer(grpc.ForceServerCodecV2(newCodec()))
	pb.RegisterWorkerServiceServer(gs, srv)
	return &testNode{e: e, cat: cat, srv: srv, addr: grpctest.Serve(t, gs)}
}

// testWorker is a worker session spoken by hand. A reader goroutine moves
// every non-heartbeat message to msgs and the stream's end to ended.
type testWorker struct {
	t      *testing.T
	stream pb.WorkerService_ConnectClient
	id     string
	// batches is what the node's Registered said of batches.
	batches bool
	msgs    chan *pb.NodeMessage
	ended   chan error
}

func (n *testNode) connect(t *testing.T, caps ...string) *testWorker {
	t.Helper()
	conn := grpctest.Dial(t, n.addr)
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := pb.NewWorkerServiceClient(conn).Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w := &testWorker{t: t, stream: stream, msgs: make(chan *pb.NodeMessage, 64), ended: make(chan error, 1)}
	read := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		<-read
	})
	w.send(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Register{Register: &pb.Register{Queue: "q", Capabilities: caps, Concurrency: 2}}})
	m, err := stream.Recv()
	if err != nil || m.GetRegistered() == nil {
		t.Fatalf("want Registered, got %v, %v", m, err)
	}
	w.id, w.batches = m.GetRegistered().GetConsumerId(), m.GetRegistered().GetAcceptsBatches()
	go func() {
		defer close(read)
		for {
			m, err := stream.Recv()
			if err != nil {
				w.ended <- err
				return
			}
			if m.GetHeartbeat() == nil {
				w.msgs <- m
			}
		}
	}()
	return w
}

func (w *testWorker) send(m *pb.WorkerMessage) {
	w.t.Helper()
	if err := w.stream.Send(m); err != nil {
		w.t.Fatalf("send: %v", err)
	}
}

func (w *testWorker) update(caps ...string) {
	w.t.Helper()
	w.send(&pb.WorkerMessage{Msg: &pb.WorkerMessage_UpdateCapabilities{UpdateCapabilities: &pb.UpdateCapabilities{Capabilities: caps}}})
}

func (w *testWorker) next() *pb.NodeMessage {
	w.t.Helper()
	select {
	case m := <-w.msgs:
		return m
	case err := <-w.ended:
		w.t.Fatalf("session ended: %v", err)
	case <-time.After(wait):
		w.t.Fatal("no message from the node")
	}
	return nil
}

// answer returns the next message, which must be a CapabilitiesUpdated.
func (w *testWorker) answer() *pb.CapabilitiesUpdated {
	w.t.Helper()
	m := w.next()
	a := m.GetCapabilitiesUpdated()
	if a == nil {
		w.t.Fatalf("want CapabilitiesUpdated, got %v", m)
	}
	return a
}

func submit(t *testing.T, e *core.Engine, caps map[string]string) *core.Job {
	t.Helper()
	j, _, err := e.Submit(context.Background(), "q", &core.Envelope{
		Version: 1, TTL: time.Minute, Capabilities: caps, Input: json.RawMessage(`"x"`),
	}, core.SubmitOptions{})
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	return j
}

func waitState(t *testing.T, e *core.Engine, id string, want core.State) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		v, err := e.View(id)
		if err == nil && v.State == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s: state %v (%v), want %s", id, v.State, err, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// An invalid list is answered invalid_worker and changes nothing; a valid
// one is republished and answered with the normalized set, and jobs needing
// it are taken from then on; a later change leaves the job bound under the
// old set running to completion.
func TestUpdateCapabilitiesMessage(t *testing.T) {
	n := startTestNode(t)
	w := n.connect(t, "model=a")
	if got := recordCaps(n.cat, w.id); got != "model=a" {
		t.Fatalf("record = %q, want model=a", got)
	}
	needB := map[string]string{"model": "b"}
	refused := func() {
		t.Helper()
		_, _, err := n.e.Submit(context.Background(), "q", &core.Envelope{
			Version: 1, TTL: time.Minute, Capabilities: needB, Input: json.RawMessage(`"x"`),
		}, core.SubmitOptions{})
		var ce *core.Error
		if !errors.As(err, &ce) || ce.Code != core.CodeNoCapableWorker {
			t.Fatalf("Submit(model=b) = %v, want no_capable_worker", err)
		}
	}
	refused()

	w.update("model=b", "no-equals-sign")
	a := w.answer()
	if a.Code != string(core.CodeInvalidWorker) || a.Message == "" || len(a.Capabilities) != 0 {
		t.Fatalf("invalid list answered %v, want invalid_worker", a)
	}
	if got := recordCaps(n.cat, w.id); got != "model=a" {
		t.Fatalf("record after a refused update = %q, want model=a", got)
	}
	refused()

	// The session is still up: the next update succeeds.
	w.update("model=b", "model=b", "gpu=x")
	a = w.answer()
	if got := strings.Join(a.Capabilities, ","); a.Code != "" || got != "gpu=x,model=b" {
		t.Fatalf("answer = %v, want gpu=x,model=b in effect", a)
	}
	if got := recordCaps(n.cat, w.id); got != "gpu=x,model=b" {
		t.Fatalf("record = %q, want gpu=x,model=b", got)
	}
	j := submit(t, n.e, needB)
	offer := w.next().GetJob()
	if offer == nil || offer.JobId != j.ID {
		t.Fatalf("want an offer of %s, got %v", j.ID, offer)
	}
	w.send(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Accept{Accept: &pb.Accept{JobId: offer.JobId, Generation: offer.Generation}}})
	waitState(t, n.e, j.ID, core.StateRunning)

	// Dropping model=b does not touch the job bound under it.
	w.update("model=a")
	if a := w.answer(); a.Code != "" || !slices.Equal(a.Capabilities, []string{"model=a"}) {
		t.Fatalf("answer = %v, want model=a in effect", a)
	}
	refused()
	waitState(t, n.e, j.ID, core.StateRunning)
	w.send(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Complete{Complete: &pb.Complete{JobId: offer.JobId, Generation: offer.Generation}}})
	waitState(t, n.e, j.ID, core.StateCompleted)
}

// A job waiting for a busy capable worker is offered at once to a worker
// that gains the capability, possibly before the update's answer.
func TestUpdateCapabilitiesOffersWaitingJob(t *testing.T) {
	n := startTestNode(t)
	busy := n.connect(t, "model=b")
	needB := map[string]string{"model": "b"}
	for range 2 { // busy's concurrency
		submit(t, n.e, needB)
		o := busy.next().GetJob()
		if o == nil {
			t.Fatal("want an offer to the busy worker")
		}
		busy.send(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Accept{Accept: &pb.Accept{JobId: o.JobId, Generation: o.Generation}}})
	}
	j := submit(t, n.e, needB)
	waitState(t, n.e, j.ID, core.StateQueued)

	w := n.connect(t, "model=a")
	w.update("model=b")
	var offer *pb.Job
	var a *pb.CapabilitiesUpdated
	for offer == nil || a == nil {
		switch m := w.next(); {
		case m.GetJob() != nil:
			offer = m.GetJob()
		case m.GetCapabilitiesUpdated() != nil:
			a = m.GetCapabilitiesUpdated()
		default:
			t.Fatalf("unexpected %v", m)
		}
	}
	if offer.JobId != j.ID || a.Code != "" {
		t.Fatalf("offer %v, answer %v: want %s offered and the update in effect", offer, a, j.ID)
	}
}

// A catalog write that fails is answered catalog_unavailable (its cause
// stays in the node's log) and the session goes on with its old set; the
// same list succeeds once the catalog is back.
func TestUpdateCapabilitiesCatalogFailure(t *testing.T) {
	n := startTestNode(t)
	w := n.connect(t, "model=a")
	n.cat.SetPublish(func(context.Context, core.ConsumerInfo) error { return errors.New("etcd unreachable") })
	w.update("model=b")
	a := w.answer()
	if a.Code != string(core.CodeCatalogUnavailable) || strings.Contains(a.Message, "etcd unreachable") {
		t.Fatalf("answer = %v, want catalog_unavailable without the cause", a)
	}
	n.cat.SetPublish(nil)
	w.update("model=b")
	if a := w.answer(); a.Code != "" || !slices.Equal(a.Capabilities, []string{"model=b"}) {
		t.Fatalf("answer = %v, want model=b in effect", a)
	}
	if got := recordCaps(n.cat, w.id); got != "model=b" {
		t.Fatalf("record = %q, want model=b", got)
	}
}

// A worker that piles up updates without waiting for the answers breaks the
// protocol: its session ends ResourceExhausted (too_many_updates).
func TestUpdateCapabilitiesFlood(t *testing.T) {
	n := startTestNode(t)
	w := n.connect(t, "model=a")
	n.cat.SetPublish(func(ctx context.Context, _ core.ConsumerInfo) error {
		<-ctx.Done() // a catalog that never answers
		return ctx.Err()
	})
	for range maxPendingUpdates + 2 {
		w.update("model=b")
	}
	select {
	case err := <-w.ended:
		if status.Code(err) != codes.ResourceExhausted || !strings.HasPrefix(status.Convert(err).Message(), "too_many_updates: ") {
			t.Fatalf("session ended with %v, want ResourceExhausted too_many_updates", err)
		}
	case m := <-w.msgs:
		t.Fatalf("unexpected %v", m)
	case <-time.After(wait):
		t.Fatal("session did not end")
	}
}
