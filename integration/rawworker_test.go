package integration_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/internal/grpctest"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
	"github.com/switchyard/switchyard/worker"
)

// rawWorker speaks the worker protocol by hand, so a test can make it
// misbehave in ways the SDK never would: stall, vanish mid-job.
type rawWorker struct {
	tb     testing.TB
	conn   *grpc.ClientConn
	stream pb.WorkerService_ConnectClient
	cancel context.CancelFunc
}

func dialRaw(tb testing.TB, n *switchyard.Node, queue string) *rawWorker {
	tb.Helper()
	conn := grpctest.Dial(tb, n.GRPCAddr())
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := pb.NewWorkerServiceClient(conn).Connect(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	w := &rawWorker{tb: tb, conn: conn, stream: stream, cancel: cancel}
	tb.Cleanup(w.close)
	w.send(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Register{Register: &pb.Register{Queue: queue, Capabilities: []string{"model=demo"}, Concurrency: 1}}})
	if m := w.recv(); m.GetRegistered() == nil {
		tb.Fatalf("want registered, got %v", m)
	}
	return w
}

func (w *rawWorker) send(m *pb.WorkerMessage) {
	w.tb.Helper()
	if err := w.stream.Send(m); err != nil {
		w.tb.Fatalf("raw send: %v", err)
	}
}

// accept takes the job the node offers next (what names it) and accepts it.
func (w *rawWorker) accept(what string) *pb.Job {
	w.tb.Helper()
	job := w.recv().GetJob()
	if job == nil {
		w.tb.Fatalf("%s: the raw worker was not offered the job", what)
	}
	w.send(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Accept{Accept: &pb.Accept{JobId: job.JobId, Generation: job.Generation}}})
	return job
}

// recv returns the next non-heartbeat message.
func (w *rawWorker) recv() *pb.NodeMessage {
	w.tb.Helper()
	for {
		m, err := w.stream.Recv()
		if err != nil {
			w.tb.Fatalf("raw recv: %v", err)
		}
		if m.GetHeartbeat() == nil {
			return m
		}
	}
}

// recvErr waits for the session to end and returns its status.
func (w *rawWorker) recvErr() error {
	for {
		if _, err := w.stream.Recv(); err != nil {
			return err
		}
	}
}

func (w *rawWorker) close() {
	w.cancel()
	_ = w.conn.Close()
}

// A worker that does not answer an offer within the dispatch timeout is
// dropped (stall); the job, which produced nothing, goes to the next worker.
func TestStalledWorkerIsDropped(t *testing.T) {
	n := MustStartNode(t, func(c *switchyard.Config) {
		c.Engine.DispatchTimeoutFloor = 100 * time.Millisecond
		c.Engine.DispatchTimeoutCeiling = 300 * time.Millisecond
	})
	raw := dialRaw(t, n, "demo")
	res := post(t.Context(), t, n, "demo", `{"input":"a b","ttl_ms":20000}`, true)
	defer res.Body.Close()
	job := raw.recv().GetJob()
	if job == nil {
		t.Fatal("the raw worker was not offered the job")
	}
	start := time.Now()
	err := raw.recvErr()
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("stalled session ended with %v, want Unavailable", err)
	}
	t.Logf("stalled worker dropped after %s", time.Since(start))
	if got := metric(t, n, "switchyard_dispatch_stalls_total", nil); got != 1 {
		t.Errorf("stalls = %v", got)
	}
	MustStartWorker(t, n, worker.Config{}, worker.Tokens(0))
	evs := readAll(t, res.Body)
	if last := evs[len(evs)-1]; last.Type != "done" || field[uint64](t, last, "attempt") != 2 {
		t.Fatalf("events %v, last %s (want done at attempt 2)", types(evs), last.Data)
	}
}

// A worker that vanishes before producing output gives its job back.
func TestWorkerLostBeforeOutputRequeues(t *testing.T) {
	n := MustStartNode(t, nil)
	raw := dialRaw(t, n, "demo")
	res := post(t.Context(), t, n, "demo", `{"input":"a b"}`, true)
	defer res.Body.Close()
	raw.accept("the job")
	raw.close()
	waitFor(t, 2*time.Second, "raw worker withdrawn", func() bool {
		return metric(t, n, "switchyard_workers_connected", nil) == 0
	})
	MustStartWorker(t, n, worker.Config{}, worker.Tokens(0))
	evs := readAll(t, res.Body)
	if last := evs[len(evs)-1]; last.Type != "done" {
		t.Fatalf("events %v, last %s", types(evs), last.Data)
	}
	if got := metric(t, n, "switchyard_dispatch_reclaims_total", nil); got != 1 {
		t.Errorf("reclaims = %v", got)
	}
}

// After output, a lost worker fails the job: no silent restart.
func TestWorkerLostAfterOutputFails(t *testing.T) {
	n := MustStartNode(t, nil)
	raw := dialRaw(t, n, "demo")
	res := post(t.Context(), t, n, "demo", `{"input":"a b"}`, true)
	defer res.Body.Close()
	job := raw.accept("the job")
	raw.send(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Output{Output: &pb.Output{JobId: job.JobId, Generation: job.Generation, Data: []byte(`"a "`)}}})
	// A stale generation is refused, not appended.
	raw.send(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Output{Output: &pb.Output{JobId: job.JobId, Generation: job.Generation + 7, Data: []byte(`"forged"`)}}})
	waitFor(t, 2*time.Second, "output recorded", func() bool {
		return metric(t, n, "switchyard_dispatch_stale_messages_total", map[string]string{"kind": "output"}) == 1
	})
	raw.close()
	evs := readAll(t, res.Body)
	want := []string{"accepted", "output", "error"}
	if got := types(evs); len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("events %v", got)
	}
	if code := field[string](t, evs[2], "code"); code != "worker_lost" {
		t.Fatalf("code %q, want worker_lost", code)
	}
}

// A session that never registers ends with DeadlineExceeded; a bad
// declaration is InvalidArgument and registers nothing.
func TestWorkerRegistrationErrors(t *testing.T) {
	n := MustStartNode(t, func(c *switchyard.Config) { c.Workers.SetupTimeout = 200 * time.Millisecond })
	conn := grpctest.Dial(t, n.GRPCAddr())
	c := pb.NewWorkerServiceClient(conn)
	for _, tc := range []struct {
		name string
		msg  *pb.WorkerMessage
		want codes.Code
	}{
		{"silent", nil, codes.DeadlineExceeded},
		{"not register first", &pb.WorkerMessage{Msg: &pb.WorkerMessage_Heartbeat{Heartbeat: &pb.Heartbeat{}}}, codes.InvalidArgument},
		{"bad queue", &pb.WorkerMessage{Msg: &pb.WorkerMessage_Register{Register: &pb.Register{Queue: "a/b"}}}, codes.InvalidArgument},
		{"bad capability", &pb.WorkerMessage{Msg: &pb.WorkerMessage_Register{Register: &pb.Register{Queue: "q", Capabilities: []string{"model"}}}}, codes.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			s, err := c.Connect(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if tc.msg != nil {
				if err := s.Send(tc.msg); err != nil {
					t.Fatal(err)
				}
			}
			_, err = s.Recv()
			if status.Code(err) != tc.want {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
	if got := metric(t, n, "switchyard_workers_connected", nil); got != 0 {
		t.Fatalf("workers connected = %v after refused registrations", got)
	}
	_ = http.StatusOK
}
