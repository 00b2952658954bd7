package worker_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/switchyard/switchyard/internal/grpctest"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
	"github.com/switchyard/switchyard/worker"
)

// wait bounds every wait for something that should happen promptly.
const wait = 5 * time.Second

// fakeNode is the test's node: a WorkerService that records what workers
// send and lets the test push Job and Cancel messages. Its fields are set
// before the server starts and only read afterwards.
type fakeNode struct {
	pb.UnimplementedWorkerServiceServer
	// heartbeatMS goes in Registered; the node heartbeats every half of it.
	heartbeatMS int64
	// silent: never send heartbeats (a node that vanished without a FIN).
	silent bool
	// registerErr, if set, is returned instead of Registered.
	registerErr error
	// batches: announce batches in Registered. A node that does not gets
	// none, or a test fails (fakeSession.batches).
	batches bool

	registers atomic.Int32
	sessions  chan *fakeSession
}

// fakeSession is one Connect call as the node sees it.
type fakeSession struct {
	reg        *pb.Register
	msgs       chan *pb.WorkerMessage // everything but heartbeats, in order, batches unpacked
	heartbeats atomic.Int32
	// batches and batched count the batches received and the messages
	// they held.
	batches, batched atomic.Int32
	push             chan *pb.NodeMessage
	drop             chan struct{} // close to end the stream with Unavailable
	endWith          chan error    // send an error to end the stream with it
	ended            chan struct{} // closed when Connect has returned
}

func newFakeNode() *fakeNode {
	return &fakeNode{heartbeatMS: 1000, sessions: make(chan *fakeSession, 16)}
}

func (f *fakeNode) Connect(stream pb.WorkerService_ConnectServer) error {
	ctx := stream.Context()
	m, err := stream.Recv()
	if err != nil {
		return err
	}
	reg := m.GetRegister()
	if reg == nil {
		return status.Error(codes.InvalidArgument, "first message must be register")
	}
	n := f.registers.Add(1)
	if f.registerErr != nil {
		return f.registerErr
	}
	if err := stream.Send(&pb.NodeMessage{Msg: &pb.NodeMessage_Registered{Registered: &pb.Registered{
		ConsumerId: fmt.Sprintf("c%d", n), Node: "fake", HeartbeatMs: f.heartbeatMS, AcceptsBatches: f.batches,
	}}}); err != nil {
		return err
	}
	s := &fakeSession{
		reg:     reg,
		msgs:    make(chan *pb.WorkerMessage, 1024),
		push:    make(chan *pb.NodeMessage),
		drop:    make(chan struct{}),
		endWith: make(chan error, 1),
		ended:   make(chan struct{}),
	}
	defer close(s.ended)
	f.sessions <- s

	recvErr := make(chan error, 1)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			ms := []*pb.WorkerMessage{m}
			if b := m.GetBatch(); b != nil {
				s.batches.Add(1)
				s.batched.Add(int32(len(b.GetMessages())))
				ms = b.GetMessages()
			}
			for _, m := range ms {
				if m.GetHeartbeat() != nil {
					s.heartbeats.Add(1)
					continue
				}
				select {
				case s.msgs <- m:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	var tick <-chan time.Time
	if !f.silent {
		t := time.NewTicker(time.Duration(f.heartbeatMS) * time.Millisecond / 2)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case m := <-s.push:
			if err := stream.Send(m); err != nil {
				return err
			}
		case <-tick:
			if err := stream.Send(&pb.NodeMessage{Msg: &pb.NodeMessage_Heartbeat{Heartbeat: &pb.Heartbeat{}}}); err != nil {
				return err
			}
		case <-s.drop:
			return status.Error(codes.Unavailable, "dropped by the test")
		case err := <-s.endWith:
			return err
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// start serves f on loopback and returns its address.
func (f *fakeNode) start(t *testing.T) string {
	t.Helper()
	srv := grpc.NewServer()
	pb.RegisterWorkerServiceServer(srv, f)
	return grpctest.Serve(t, srv)
}

func (f *fakeNode) nextSession(t *testing.T) *fakeSession {
	t.Helper()
	return recv(t, f.sessions, "a worker session")
}

// next returns the next non-heartbeat message the worker sent.
func (s *fakeSession) next(t *testing.T) *pb.WorkerMessage {
	t.Helper()
	return recv(t, s.msgs, "a message from the worker")
}

func (s *fakeSession) send(t *testing.T, m *pb.NodeMessage) {
	t.Helper()
	select {
	case s.push <- m:
	case <-s.ended:
		t.Fatal("session ended before the node could send")
	case <-time.After(wait):
		t.Fatal("node could not send")
	}
}

func (s *fakeSession) sendJob(t *testing.T, j *pb.Job) {
	t.Helper()
	if j.TtlMs == 0 {
		j.TtlMs = 60_000
	}
	if j.Queue == "" {
		j.Queue = "q"
	}
	s.send(t, &pb.NodeMessage{Msg: &pb.NodeMessage_Job{Job: j}})
}

func (s *fakeSession) sendCancel(t *testing.T, id string, gen uint64, reason string) {
	t.Helper()
	s.send(t, &pb.NodeMessage{Msg: &pb.NodeMessage_Cancel{Cancel: &pb.Cancel{JobId: id, Generation: gen, Reason: reason}}})
}

func (s *fakeSession) expectAccept(t *testing.T, id string, gen uint64) {
	t.Helper()
	a := s.next(t).GetAccept()
	if a == nil || a.JobId != id || a.Generation != gen {
		t.Fatalf("want Accept{%s, %d}, got %v", id, gen, a)
	}
}

func (s *fakeSession) expectFail(t *testing.T, id string, gen uint64) *pb.Fail {
	t.Helper()
	m := s.next(t)
	f := m.GetFail()
	if f == nil || f.JobId != id || f.Generation != gen {
		t.Fatalf("want Fail{%s, %d}, got %v", id, gen, m)
	}
	return f
}

// runningWorker is a Run in a goroutine.
type runningWorker struct {
	cancel context.CancelFunc
	done   chan error
}

// startWorker runs worker.Run against addr; the test's cleanup stops it.
func startWorker(t *testing.T, addr string, cfg worker.Config, h worker.Handler) *runningWorker {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &runningWorker{cancel: cancel, done: make(chan error, 1)}
	cfg = testConfig(cfg, addr)
	go func() { w.done <- worker.Run(ctx, cfg, h) }()
	t.Cleanup(func() {
		if err := w.stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return w
}

// startOnFake starts a fake node and, against it, a worker with cfg and h
// (startWorker); it returns the node, the worker and the worker's first
// session.
func startOnFake(t *testing.T, cfg worker.Config, h worker.Handler) (*fakeNode, *runningWorker, *fakeSession) {
	t.Helper()
	f := newFakeNode()
	w := startWorker(t, f.start(t), cfg, h)
	return f, w, f.nextSession(t)
}

// testConfig is cfg for a test's worker on addr: queue "q" and a short
// reconnect backoff unless cfg says otherwise.
func testConfig(cfg worker.Config, addr string) worker.Config {
	cfg.Server = addr
	if cfg.Queue == "" {
		cfg.Queue = "q"
	}
	if cfg.MaxBackoff == 0 {
		cfg.MaxBackoff = 20 * time.Millisecond
	}
	return cfg
}

// cancelledPromptly runs job, which h keeps busy for seconds, cancels it,
// and checks that its end comes at once, as cancelled.
func cancelledPromptly(t *testing.T, h worker.Handler, job *pb.Job) {
	t.Helper()
	_, _, s := startOnFake(t, worker.Config{}, h)
	s.sendJob(t, job)
	s.expectAccept(t, job.JobId, job.Generation)
	start := time.Now()
	s.sendCancel(t, job.JobId, job.Generation, "cancelled")
	if fl := s.expectFail(t, job.JobId, job.Generation); fl.Code != "cancelled" {
		t.Fatalf("code = %q, want cancelled", fl.Code)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("cancel took %s: the handler's wait was not interrupted", d)
	}
}

// stop cancels Run and returns its result.
func (w *runningWorker) stop() error {
	w.cancel()
	return w.wait()
}

func (w *runningWorker) wait() error {
	select {
	case err, ok := <-w.done:
		if !ok {
			return nil
		}
		close(w.done)
		return err
	case <-time.After(wait):
		return errors.New("Run did not return")
	}
}

// blockUntilCancelled is a handler that waits for its context and reports
// the context's error on ctxErr.
func blockUntilCancelled(started chan<- *worker.Job, ctxErr chan<- error) worker.Handler {
	return func(ctx context.Context, job *worker.Job, out *worker.Output) (any, error) {
		if started != nil {
			started <- job
		}
		<-ctx.Done()
		if ctxErr != nil {
			ctxErr <- ctx.Err()
		}
		// Claim success: a cancelled job must be reported cancelled anyway.
		return "done anyway", nil
	}
}

func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(wait):
		t.Fatalf("timed out waiting for %s", what)
		var zero T
		return zero
	}
}

// textLogger logs at info and above to w, as text.
func textLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}
