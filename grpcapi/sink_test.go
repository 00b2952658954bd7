package grpcapi

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/switchyard/switchyard/apierr"
	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/stream"
	"github.com/switchyard/switchyard/internal/coretest"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// fakeStream is the send side of a gRPC stream. With a gate, every Send
// blocks until the gate opens (the client reads again) or the stream ends
// (the handler returned), like a Send blocked on flow control.
type fakeStream struct {
	mu      sync.Mutex
	sent    []*pb.JobEvent
	headers int
	gate    chan struct{}
	sendErr error

	entered chan struct{} // one value each time a Send starts waiting at the gate
	ended   chan struct{} // closed when the stream ends
}

func newFakeStream() *fakeStream {
	return &fakeStream{entered: make(chan struct{}, 64), ended: make(chan struct{})}
}

func (f *fakeStream) block() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gate = make(chan struct{})
}

func (f *fakeStream) unblock() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.gate != nil {
		close(f.gate)
		f.gate = nil
	}
}

func (f *fakeStream) Send(ev *pb.JobEvent) error {
	f.mu.Lock()
	gate, err := f.gate, f.sendErr
	f.mu.Unlock()
	if err != nil {
		return err
	}
	if gate != nil {
		f.entered <- struct{}{}
		select {
		case <-gate:
		case <-f.ended:
			return status.Error(codes.Canceled, "context canceled")
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sent = append(f.sent, ev)
	return nil
}

func (f *fakeStream) SendHeader(metadata.MD) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.headers++
	return nil
}

func (f *fakeStream) headersSent() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.headers
}

func (f *fakeStream) events() []*pb.JobEvent {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.sent)
}

func (f *fakeStream) kinds() []string {
	var out []string
	for _, ev := range f.events() {
		out = append(out, ev.GetKind())
	}
	return out
}

// startSink starts a sink's sender the way streamJob does, and at the end
// of the test ends it the way the handler returning does.
func startSink(t *testing.T, f *fakeStream, j *core.Job) *sink {
	t.Helper()
	s := newSink(f, j, 42)
	var wg sync.WaitGroup
	wg.Go(s.send)
	t.Cleanup(func() {
		select {
		case <-s.quit:
		default:
			s.stop()
		}
		close(f.ended)
		wg.Wait()
	})
	return s
}

func testJob(t *testing.T) *core.Job {
	t.Helper()
	return &core.Job{ID: "j_test", History: core.NewHistory(1000, 1<<20)}
}

// sinkInSend starts a sink whose sender is blocked in Send on a first
// output event, ev, taken under a write deadline of now plus deadline.
func sinkInSend(t *testing.T, deadline time.Duration) (*sink, *fakeStream, core.Event) {
	t.Helper()
	j := testJob(t)
	f := newFakeStream()
	s := startSink(t, f, j)
	ev := coretest.Append(t, j, core.EventOutput, `{}`)
	f.block()
	_ = s.SetWriteDeadline(time.Now().Add(deadline))
	if err := s.Event(ev, ""); err != nil {
		t.Fatalf("first event: %v (the idle sender takes it at once)", err)
	}
	<-f.entered
	return s, f, ev
}

func within(t *testing.T, what string, min, max time.Duration, f func()) {
	t.Helper()
	t0 := time.Now()
	f()
	if d := time.Since(t0); d < min || d > max {
		t.Errorf("%s took %s, want %s..%s", what, d, min, max)
	}
}

func TestGRPCSinkWritesInOrderThroughOneSender(t *testing.T) {
	j := testJob(t)
	f := newFakeStream()
	s := startSink(t, f, j)
	_ = s.SetWriteDeadline(time.Now().Add(time.Second))
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	ev := coretest.Append(t, j, core.EventOutput, `{"data":"hi"}`)
	for _, err := range []error{
		s.Event(ev, "tok-1"),
		s.Heartbeat(),
		s.Control(stream.Terminated, map[string]any{"reason": "idle", "job_id": j.ID}),
		s.Flush(),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if f.headersSent() != 1 {
		t.Errorf("headers sent %d times, want once, by the first flush", f.headersSent())
	}
	if got := f.kinds(); !slices.Equal(got, []string{"output", "heartbeat", "terminated"}) {
		t.Fatalf("sent %v", got)
	}
	sent := f.events()
	out := sent[0]
	if out.GetJobId() != j.ID || out.GetSeq() != ev.Seq || out.GetGeneration() != 1 || out.GetSnapshot() != 42 ||
		out.GetAttempt() != 1 || out.GetResumeToken() != "tok-1" {
		t.Errorf("event %v", out)
	}
	if want := `{"job_id":"j_test","gen":1,"seq":1,"snap":42,"attempt":1,"data":"hi"}`; string(out.GetDataJson()) != want {
		t.Errorf("data %s, want %s", out.GetDataJson(), want)
	}
	if hb := sent[1]; hb.GetJobId() != j.ID || hb.GetSeq() != 0 || hb.GetResumeToken() != "" || hb.GetDataJson() != nil {
		t.Errorf("heartbeat %v carries more than liveness", hb)
	}
	if c := sent[2]; c.GetSeq() != 0 || c.GetResumeToken() != "" || string(c.GetDataJson()) != `{"job_id":"j_test","reason":"idle"}` {
		t.Errorf("control %v", c)
	}
	within(t, "stop with an idle sender", 0, 100*time.Millisecond, s.stop)
	select {
	case <-s.exited:
	default:
		t.Error("stop returned before the idle sender ended")
	}
}

// A Send blocked on a client that does not read cannot be interrupted;
// the writer's wait for the handoff can, and fails at the write deadline.
func TestGRPCSinkWriteDeadlineWhileSendBlocks(t *testing.T) {
	s, _, ev := sinkInSend(t, 80*time.Millisecond)
	within(t, "a write behind a blocked Send", 70*time.Millisecond, time.Second, func() {
		if err := s.Event(ev, ""); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("second event: %v, want a deadline error", err)
		}
	})
	within(t, "writes past the deadline", 0, 20*time.Millisecond, func() {
		if err := s.Flush(); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("flush: %v", err)
		}
	})
	if !s.lastWriteFailed() {
		t.Error("lastWriteFailed is false after a failed flush")
	}
	// The handler does not wait for a sender stuck in Send...
	within(t, "stop with a blocked sender", 0, 50*time.Millisecond, s.stop)
	select {
	case <-s.exited:
		t.Fatal("sender ended while its Send was blocked")
	default:
	}
	// ...which ends when the stream does (startSink's cleanup; goleak).
}

// Flush waits for what was handed over to be sent, under the deadline.
func TestGRPCSinkFlushWaitsForTheSend(t *testing.T) {
	s, f, _ := sinkInSend(t, time.Second)
	go func() {
		time.Sleep(50 * time.Millisecond)
		f.unblock()
	}()
	within(t, "a flush behind a Send that completes", 40*time.Millisecond, 900*time.Millisecond, func() {
		if err := s.Flush(); err != nil {
			t.Errorf("flush: %v", err)
		}
	})
	if len(f.events()) != 1 {
		t.Errorf("flush returned before the event was sent")
	}
}

// Abort, from another goroutine, bounds the wait in progress by its
// deadline, and every later one whatever SetWriteDeadline says.
func TestGRPCSinkAbortBoundsTheWriteInProgress(t *testing.T) {
	s, _, ev := sinkInSend(t, time.Hour)
	go func() {
		time.Sleep(20 * time.Millisecond)
		s.Abort(time.Now().Add(50 * time.Millisecond))
	}()
	within(t, "an aborted write", 60*time.Millisecond, time.Second, func() {
		if err := s.Event(ev, ""); !errors.Is(err, errAborted) {
			t.Errorf("event: %v, want aborted", err)
		}
	})
	_ = s.SetWriteDeadline(time.Now().Add(time.Hour))
	within(t, "a write after the abort deadline", 0, 20*time.Millisecond, func() {
		if err := s.Heartbeat(); !errors.Is(err, errAborted) {
			t.Errorf("heartbeat: %v, want aborted", err)
		}
	})
	s.Abort(time.Now().Add(time.Hour)) // later calls change nothing
	if err := s.Flush(); !errors.Is(err, errAborted) {
		t.Errorf("flush after a second Abort: %v", err)
	}
	within(t, "stop after the abort deadline", 0, 50*time.Millisecond, s.stop)
}

// A client that reads again within the abort's grace gets the blocked
// write through, and the terminated event after it.
func TestGRPCSinkAbortGraceLetsTheTerminatedEventThrough(t *testing.T) {
	s, f, ev := sinkInSend(t, time.Hour)
	s.Abort(time.Now().Add(2 * time.Second))
	go func() {
		time.Sleep(30 * time.Millisecond)
		f.unblock()
	}()
	if err := s.Event(ev, ""); err != nil {
		t.Fatalf("write within the grace: %v", err)
	}
	if err := s.Control(stream.Terminated, map[string]any{"reason": "slow_consumer"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := f.kinds(); !slices.Equal(got, []string{"output", "output", "terminated"}) {
		t.Fatalf("sent %v", got)
	}
	if s.lastWriteFailed() {
		t.Error("lastWriteFailed after a successful flush")
	}
}

func TestGRPCSinkSendErrorFailsLaterWrites(t *testing.T) {
	j := testJob(t)
	f := newFakeStream()
	s := startSink(t, f, j)
	boom := errors.New("transport is closing")
	f.mu.Lock()
	f.sendErr = boom
	f.mu.Unlock()
	ev := coretest.Append(t, j, core.EventOutput, `{}`)
	_ = s.SetWriteDeadline(time.Now().Add(time.Hour))
	if err := s.Event(ev, ""); err != nil {
		t.Fatalf("handoff: %v", err)
	}
	within(t, "writes after the sender failed", 0, 100*time.Millisecond, func() {
		if err := s.Flush(); !errors.Is(err, boom) {
			t.Errorf("flush: %v, want %v", err, boom)
		}
		if err := s.Event(ev, ""); !errors.Is(err, boom) {
			t.Errorf("event: %v, want %v", err, boom)
		}
	})
}

func policy() stream.Policy {
	p := stream.DefaultPolicy()
	p.Setup = 500 * time.Millisecond
	p.WriteTimeout = 200 * time.Millisecond
	p.Heartbeat = time.Second
	p.Idle = 5 * time.Second
	return p
}

func TestGRPCRunOverTheSink(t *testing.T) {
	j := testJob(t)
	coretest.Append(t, j, core.EventAccepted, `{"queue":"q"}`)
	coretest.Append(t, j, core.EventOutput, `{"data":"a"}`)
	coretest.Append(t, j, core.EventDone, `{"outcome":"completed"}`)
	f := newFakeStream()
	s := startSink(t, f, j)
	res := stream.Run(context.Background(), stream.Request{
		Job: j, Policy: policy(), Token: func(ev core.Event) string { return "t" + string(rune('0'+ev.Seq)) },
	}, s)
	if res.End != stream.EndTerminal || res.LastSeq != 3 {
		t.Fatalf("result %+v", res)
	}
	// The history had events when the stream opened: the headers go with
	// the first of them, not on their own (stream.Run).
	if got := f.kinds(); !slices.Equal(got, []string{"accepted", "output", "done"}) || f.headersSent() != 0 {
		t.Fatalf("sent %v, headers %d", got, f.headersSent())
	}
	for i, ev := range f.events() {
		if ev.GetResumeToken() != "t"+string(rune('1'+i)) {
			t.Errorf("event %d token %q", i, ev.GetResumeToken())
		}
		var m map[string]any
		if err := json.Unmarshal(ev.GetDataJson(), &m); err != nil || m["seq"] != float64(i+1) {
			t.Errorf("event %d data %s: %v", i, ev.GetDataJson(), err)
		}
	}
	if err := apierr.Status(endError(context.Background(), res.End, s.lastWriteFailed())); err != nil {
		t.Errorf("a stream that ended with its terminal event ends %v", err)
	}
}

// runOnStoppedClient runs, with policy p, the stream of a job with an
// accepted event over a sink whose client stops reading at its first Send;
// outputs more events follow once that Send blocks. Run must end within
// min..max.
func runOnStoppedClient(t *testing.T, what string, p stream.Policy, outputs int, min, max time.Duration) (stream.Result, *sink) {
	t.Helper()
	j := testJob(t)
	coretest.Append(t, j, core.EventAccepted, `{"queue":"q"}`)
	f := newFakeStream()
	s := startSink(t, f, j)
	f.block()
	var res stream.Result
	within(t, what, min, max, func() {
		go func() {
			<-f.entered
			for range outputs {
				coretest.Append(t, j, core.EventOutput, `{"data":"a"}`)
			}
		}()
		res = stream.Run(context.Background(), stream.Request{Job: j, Policy: p}, s)
	})
	return res, s
}

// A client that stopped reading: the writer fails at the write timeout
// (no bound passed), and the call says write_failed.
func TestGRPCRunWriteTimeoutOnABlockedClient(t *testing.T) {
	res, s := runOnStoppedClient(t, "Run on a client that stopped reading", policy(), 1, 150*time.Millisecond, 2*time.Second)
	if res.End != stream.EndWriteFailed {
		t.Fatalf("result %+v, want write_failed", res)
	}
	err := apierr.Status(endError(context.Background(), res.End, s.lastWriteFailed()))
	if status.Code(err) != codes.Unavailable {
		t.Errorf("status %v", err)
	}
}

// The lag watcher aborts a writer blocked on a client that stopped reading
// as soon as the stream's queue passes its bound; the stream ends slow.
func TestGRPCRunWatcherAbortsABlockedWriter(t *testing.T) {
	p := policy()
	p.WriteTimeout = 4 * time.Second // the watcher, not the write timeout, must end it
	p.MaxLagEvents = 3
	res, s := runOnStoppedClient(t, "Run with a watcher", p, 5, 0, 3*time.Second)
	if res.End != stream.EndSlow || res.LagEvents <= 3 {
		t.Fatalf("result %+v, want slow past 3 events", res)
	}
	if !s.lastWriteFailed() {
		t.Fatal("the terminated event cannot have got through a blocked Send")
	}
	if err := apierr.Status(endError(context.Background(), res.End, true)); status.Code(err) != codes.Unavailable {
		t.Errorf("status %v", err)
	}
}

func TestGRPCEndError(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		ctx    context.Context
		end    stream.End
		failed bool
		want   codes.Code
	}{
		{context.Background(), stream.EndTerminal, false, codes.OK},
		{context.Background(), stream.EndSlow, false, codes.OK},
		{context.Background(), stream.EndIdle, false, codes.OK},
		{context.Background(), stream.EndMaxDuration, false, codes.OK},
		{context.Background(), stream.EndResync, false, codes.OK},
		{context.Background(), stream.EndSlow, true, codes.Unavailable},
		{context.Background(), stream.EndTerminal, true, codes.Unavailable},
		{context.Background(), stream.EndWriteFailed, true, codes.Unavailable},
		{cancelled, stream.EndClientGone, false, codes.Canceled},
		{cancelled, stream.EndWriteFailed, true, codes.Canceled},
	} {
		if got := status.Code(apierr.Status(endError(tc.ctx, tc.end, tc.failed))); got != tc.want {
			t.Errorf("endError(%s, failed=%v): status %s, want %s", tc.end, tc.failed, got, tc.want)
		}
	}
}
