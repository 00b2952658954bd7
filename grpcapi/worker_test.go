package grpcapi

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/switchyard/switchyard/apierr"
	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/internal/coretest"
	"github.com/switchyard/switchyard/internal/grpctest"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

func TestWorkerConfigValidate(t *testing.T) {
	ok := DefaultWorkerConfig()
	for _, tc := range []struct {
		name  string
		mut   func(*WorkerConfig)
		field string
	}{
		{"default", func(*WorkerConfig) {}, ""},
		{"no setup", func(c *WorkerConfig) { c.SetupTimeout = 0 }, "worker-setup-timeout"},
		{"no heartbeat", func(c *WorkerConfig) { c.HeartbeatInterval = 0 }, "heartbeat-interval"},
		{"idle below two heartbeats", func(c *WorkerConfig) { c.IdleTimeout = c.HeartbeatInterval*2 - time.Millisecond }, "worker-idle-timeout"},
		{"idle at two heartbeats", func(c *WorkerConfig) { c.IdleTimeout = c.HeartbeatInterval * 2 }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.mut(&c)
			coretest.WantConfigError(t, c.Validate(), tc.field)
		})
	}
}

// A registration the engine refuses ends the session with the code's
// status from apierr's table: InvalidArgument for a bad declaration (the
// worker SDK gives up), Unavailable for what may work later (it retries).
// A catalog that cannot be written is catalog_unavailable; its cause stays
// in the node's log.
func TestRegisterRefusals(t *testing.T) {
	n := startTestNode(t)
	for _, tc := range []struct {
		name  string
		msg   *pb.WorkerMessage
		setup func()
		want  codes.Code
		code  core.Code
		field string
	}{
		{"not register first", &pb.WorkerMessage{Msg: &pb.WorkerMessage_Heartbeat{Heartbeat: &pb.Heartbeat{}}}, nil, codes.InvalidArgument, core.CodeUnexpectedMessage, ""},
		{"a batch first, register in it", batch(register("q")), nil, codes.InvalidArgument, core.CodeUnexpectedMessage, ""},
		{"bad queue", register("a/b"), nil, codes.InvalidArgument, core.CodeInvalidQueueName, "queue"},
		{"bad capability", register("q", "model"), nil, codes.InvalidArgument, core.CodeInvalidWorker, "capabilities"},
		// Refused, not a send queue sized for four billion credits.
		{"huge concurrency", &pb.WorkerMessage{Msg: &pb.WorkerMessage_Register{Register: &pb.Register{Queue: "q", Concurrency: 4_000_000_000}}}, nil, codes.InvalidArgument, core.CodeInvalidWorker, "concurrency"},
		{"catalog down", register("q"), func() {
			n.cat.SetPublish(func(context.Context, core.ConsumerInfo) error { return errors.New("etcd unreachable") })
		}, codes.Unavailable, core.CodeCatalogUnavailable, ""},
		{"draining", register("q"), func() {
			n.cat.SetPublish(nil)
			n.e.Drain(context.Background())
		}, codes.Unavailable, core.CodeDraining, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.setup != nil {
				tc.setup()
			}
			st := status.Convert(n.refused(t, tc.msg))
			if st.Code() != tc.want || !strings.HasPrefix(st.Message(), string(tc.code)+": ") || strings.Contains(st.Message(), "etcd") {
				t.Fatalf("got %s %q, want %s %s", st.Code(), st.Message(), tc.want, tc.code)
			}
			if f := apierr.FromStatus(st); f.Code != tc.code || f.Field != tc.field {
				t.Fatalf("the status carries %+v, want code %s field %q", f, tc.code, tc.field)
			}
		})
	}
}

func register(queue string, caps ...string) *pb.WorkerMessage {
	return &pb.WorkerMessage{Msg: &pb.WorkerMessage_Register{Register: &pb.Register{Queue: queue, Capabilities: caps}}}
}

// refused opens a session, sends m and returns the error the session ends
// with; it fails the test if the node registers it instead.
func (n *testNode) refused(t *testing.T, m *pb.WorkerMessage) error {
	t.Helper()
	conn := grpctest.Dial(t, n.addr)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	stream, err := pb.NewWorkerServiceClient(conn).Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(m); err != nil {
		t.Fatal(err)
	}
	got, err := stream.Recv()
	if err == nil {
		t.Fatalf("the node answered %v, want the session refused", got)
	}
	return err
}

// heldStream is a worker stream whose Send blocks until release is closed:
// a worker that stopped reading, as far as the writer can tell.
type heldStream struct {
	pb.WorkerService_ConnectServer
	entered chan struct{} // gets a value when Send is first entered
	release chan struct{}
	sent    chan *pb.NodeMessage
}

func (s *heldStream) Send(m *pb.NodeMessage) error {
	select {
	case s.entered <- struct{}{}:
	default:
	}
	<-s.release
	s.sent <- m
	return nil
}

// The writer's queue is bounded by bytes as well as by count: offers carry
// job inputs, so behind a worker that stopped reading, big offers fill the
// byte bound long before the count bound, and the next one fails the way a
// full queue does (the engine then drops the session). The writer gives
// back what it takes: once it drains the queue, offers fit again.
func TestSendQueueBounds(t *testing.T) {
	big := core.Offer{JobID: "j", Gen: 1, Queue: "q", Input: bytes.Repeat([]byte("x"), 100<<10), TTL: time.Second}
	for _, tc := range []struct {
		name     string
		capacity int
		maxBytes int64
		send     func(*session) error
		// byBytes: the failure must come from the byte bound, with the
		// count bound out of reach; otherwise from the count bound.
		byBytes bool
	}{
		{"byte bound", 1000, 1 << 20, func(ss *session) error { return ss.SendOffer(big) }, true},
		{"count bound", 8, 1 << 20, func(ss *session) error { return ss.SendCancel("j", 1, core.CodeCancelled) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultWorkerConfig()
			cfg.HeartbeatInterval = time.Hour
			st := &heldStream{entered: make(chan struct{}, 1), release: make(chan struct{}), sent: make(chan *pb.NodeMessage, 2*tc.capacity)}
			ss := &session{s: &WorkerServer{cfg: cfg}, stream: st, done: make(chan struct{})}
			ss.out = core.NewOutbox[*pb.NodeMessage](tc.capacity, tc.maxBytes, ss.done)
			var wg sync.WaitGroup
			wg.Go(ss.write)
			released := false
			defer func() {
				if !released {
					close(st.release)
				}
				close(ss.done)
				wg.Wait()
			}()

			// The writer takes the first message and is held in Send.
			if err := tc.send(ss); err != nil {
				t.Fatal(err)
			}
			<-st.entered
			accepted := 1 + coretest.FillOutbox(t, ss.out, tc.capacity, tc.maxBytes, tc.byBytes, func() error { return tc.send(ss) })

			// The worker reads again: the writer sends everything, in
			// order, and gives its bytes back.
			close(st.release)
			released = true
			for i := range accepted {
				select {
				case <-st.sent:
				case <-time.After(10 * time.Second):
					t.Fatalf("writer sent %d of %d messages", i, accepted)
				}
			}
			if n, b := ss.out.Len(), ss.out.Bytes(); n != 0 || b != 0 {
				t.Fatalf("after the writer drained the queue: %d messages, %d bytes accounted", n, b)
			}
			if err := tc.send(ss); err != nil {
				t.Fatalf("after the drain: %v", err)
			}
		})
	}
}

// Output credits bypass the writer's queue, one per binding: a credit not
// yet sent is replaced by a newer one (credits are cumulative), so a
// worker that reads slowly gets the newest of each job's, and a full queue
// never refuses one. The offer, with its first credit, goes before them.
func TestCreditsReplaceUnsent(t *testing.T) {
	cfg := DefaultWorkerConfig()
	cfg.HeartbeatInterval = time.Hour
	st := &heldStream{entered: make(chan struct{}, 1), release: make(chan struct{}), sent: make(chan *pb.NodeMessage, 8)}
	ss := &session{s: &WorkerServer{cfg: cfg}, stream: st,
		credits: map[creditKey]core.OutputCredit{}, creditc: make(chan struct{}, 1), done: make(chan struct{})}
	ss.out = core.NewOutbox[*pb.NodeMessage](1, 1<<20, ss.done)
	var wg sync.WaitGroup
	wg.Go(ss.write)
	defer func() { close(ss.done); wg.Wait() }()

	if err := ss.SendOffer(core.Offer{JobID: "j", Gen: 1, Queue: "q", TTL: time.Second, Credit: core.OutputCredit{Events: 2, Bytes: 100}}); err != nil {
		t.Fatal(err)
	}
	<-st.entered // the writer holds the offer
	if err := ss.SendCancel("x", 1, core.CodeCancelled); err != nil {
		t.Fatal(err) // fills the queue
	}
	for _, c := range []struct {
		job     string
		credits int64
	}{{"j", 3}, {"k", 5}, {"j", 4}} {
		if err := ss.SendCredit(c.job, 1, core.OutputCredit{Events: c.credits, Bytes: 100 * c.credits}); err != nil {
			t.Fatalf("a credit behind a full queue: %v", err)
		}
	}
	close(st.release)
	offer := (<-st.sent).GetJob()
	if c := offer.GetOutputCredit(); offer == nil || c.GetEvents() != 2 || c.GetBytes() != 100 || c.GetJobId() != "j" {
		t.Fatalf("first message %v, want the offer with its credit of 2 outputs, 100 bytes", offer)
	}
	got := map[string]uint64{}
	for range 3 { // the cancel and two credits, in either order
		m := <-st.sent
		if c := m.GetOutputCredit(); c != nil {
			if _, dup := got[c.GetJobId()]; dup {
				t.Fatalf("two credits of %s sent: the newer should have replaced the older", c.GetJobId())
			}
			got[c.GetJobId()] = c.GetEvents()
		}
	}
	if got["j"] != 4 || got["k"] != 5 || len(got) != 2 {
		t.Fatalf("credits sent %v, want the newest of each: j 4, k 5", got)
	}
}

// batch is a WorkerMessage holding a Batch of msgs.
func batch(msgs ...*pb.WorkerMessage) *pb.WorkerMessage {
	return &pb.WorkerMessage{Msg: &pb.WorkerMessage_Batch{Batch: &pb.Batch{Messages: msgs}}}
}

// A node announces batches, and handles a batch's messages as if each had
// come alone, in order: an accept, outputs and the complete of one job in
// one batch complete it with its outputs; an empty batch changes nothing.
func TestBatchHandledAsItsMessages(t *testing.T) {
	n := startTestNode(t)
	w := n.connect(t)
	if !w.batches {
		t.Fatal("Registered does not announce batches")
	}
	j := submit(t, n.e, nil)
	offer := w.next().GetJob()
	if offer == nil || offer.GetJobId() != j.ID {
		t.Fatalf("want the offer of %s, got %v", j.ID, offer)
	}
	id, gen := offer.GetJobId(), offer.GetGeneration()
	output := func(data string) *pb.WorkerMessage {
		return &pb.WorkerMessage{Msg: &pb.WorkerMessage_Output{Output: &pb.Output{JobId: id, Generation: gen, Data: []byte(data)}}}
	}
	w.send(batch())
	w.send(batch(
		&pb.WorkerMessage{Msg: &pb.WorkerMessage_Accept{Accept: &pb.Accept{JobId: id, Generation: gen}}},
		output(`"a"`), output(`"b"`),
		&pb.WorkerMessage{Msg: &pb.WorkerMessage_Heartbeat{Heartbeat: &pb.Heartbeat{}}},
		output(`"c"`),
		&pb.WorkerMessage{Msg: &pb.WorkerMessage_Complete{Complete: &pb.Complete{JobId: id, Generation: gen}}},
	))
	waitState(t, n.e, j.ID, core.StateCompleted)
	if v, _ := n.e.View(j.ID); v.Outputs != 3 {
		t.Fatalf("the job completed with %d outputs, want 3", v.Outputs)
	}
	if got := testutil.ToFloat64(n.srv.batched); got != 6 {
		t.Fatalf("batched messages counted %v, want 6", got)
	}
	if got := testutil.ToFloat64(n.srv.batches); got != 2 {
		t.Fatalf("batches counted %v, want 2", got)
	}
}

// A register or a batch inside a batch ends the session with
// unexpected_message, as any message out of place does; the messages
// before it in the batch were handled.
func TestBatchRefusals(t *testing.T) {
	for _, tc := range []struct {
		name   string
		inside *pb.WorkerMessage
	}{
		{"register in a batch", register("q")},
		{"batch in a batch", batch(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Heartbeat{Heartbeat: &pb.Heartbeat{}}})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := startTestNode(t)
			w := n.connect(t)
			j := submit(t, n.e, nil)
			offer := w.next().GetJob()
			id, gen := offer.GetJobId(), offer.GetGeneration()
			w.send(batch(
				&pb.WorkerMessage{Msg: &pb.WorkerMessage_Accept{Accept: &pb.Accept{JobId: id, Generation: gen}}},
				&pb.WorkerMessage{Msg: &pb.WorkerMessage_Output{Output: &pb.Output{JobId: id, Generation: gen, Data: []byte(`1`)}}},
				tc.inside,
				&pb.WorkerMessage{Msg: &pb.WorkerMessage_Complete{Complete: &pb.Complete{JobId: id, Generation: gen}}},
			))
			var err error
			select {
			case err = <-w.ended:
			case <-time.After(wait):
				t.Fatal("the session goes on")
			}
			st := status.Convert(err)
			if st.Code() != codes.InvalidArgument || !strings.HasPrefix(st.Message(), string(core.CodeUnexpectedMessage)+": ") {
				t.Fatalf("the session ended with %s %q, want InvalidArgument unexpected_message", st.Code(), st.Message())
			}
			// The output before the refusal reached the job, the complete
			// after it did not: the job, with output, failed with its
			// worker.
			waitState(t, n.e, j.ID, core.StateFailed)
			if v, _ := n.e.View(j.ID); v.Outputs != 1 || v.Code != core.CodeWorkerLost {
				t.Fatalf("the job ended %s with %d outputs, want worker_lost with 1", v.Code, v.Outputs)
			}
		})
	}
}
