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
	"google.golang.org/protobuf/proto"

	"github.com/switchyard/switchyard/apierr"
	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/stream"
	"github.com/switchyard/switchyard/internal/coretest"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// fakeStream is the send side of a gRPC stream. With a gate, every Send
// blocks until the gate opens (the client reads again) or the stream ends
// (the handler returned), like a Send blocked on flow control. Send encodes
// the message with the server's codec first, as gRPC's does, and keeps it
// decoded once "written", when it frees the encoding.
type fakeStream struct {
	mu      sync.Mutex
	sent    []*pb.JobEvent
	msgs    []int // the events in each message sent
	headers int
	gate    chan struct{}
	sendErr error

	entered chan struct{} // one value each time a Send starts waiting at the gate
	ended   chan struct{} // closed when the stream ends
	endOnce sync.Once
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

// blockThen blocks f's Sends and, once one has started waiting at the
// gate, runs then on a goroutine of its own (not at all if the stream ends
// first); the test's cleanup waits for it (goleak).
func (f *fakeStream) blockThen(t *testing.T, then func()) {
	t.Helper()
	f.block()
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-f.entered:
			then()
		case <-f.ended:
		}
	}()
	t.Cleanup(func() {
		f.end()
		<-done
	})
}

// end ends the stream, as the handler returning does.
func (f *fakeStream) end() { f.endOnce.Do(func() { close(f.ended) }) }

func (f *fakeStream) SendMsg(m any) error {
	f.mu.Lock()
	gate, err := f.gate, f.sendErr
	f.mu.Unlock()
	if err != nil {
		return err
	}
	data, err := newCodec().Marshal(m)
	if err != nil {
		return err
	}
	defer data.Free()
	select {
	case <-f.ended:
		return status.Error(codes.Canceled, "context canceled")
	default:
	}
	if gate != nil {
		f.entered <- struct{}{}
		select {
		case <-gate:
		case <-f.ended:
			return status.Error(codes.Canceled, "context canceled")
		}
	}
	var evs []*pb.JobEvent
	if _, ok := m.(*wireBatch); ok {
		b := &pb.JobEventBatch{}
		if err := proto.Unmarshal(data.Materialize(), b); err != nil {
			return err
		}
		evs = b.Events
	} else {
		ev := &pb.JobEvent{}
		if err := proto.Unmarshal(data.Materialize(), ev); err != nil {
			return err
		}
		evs = []*pb.JobEvent{ev}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sent = append(f.sent, evs...)
	f.msgs = append(f.msgs, len(evs))
	return nil
}

// messages is how many events each message sent held.
func (f *fakeStream) messages() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.msgs)
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

// watched runs write as a stream's writer on a goroutine of its own, under
// the sink's watch, as JobServer.serve does: it returns whether the watch gave
// up on the writer, and when it did, ends the stream as the handler
// returning does. writer is closed when the writer returned; the test's
// cleanup waits for it (goleak).
func watched(t *testing.T, f *fakeStream, s *sink, write func()) (gaveUp bool, writer <-chan struct{}) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		write()
	}()
	t.Cleanup(func() {
		f.end()
		<-done
	})
	gaveUp = s.watch(done)
	if gaveUp {
		f.end()
	}
	return gaveUp, done
}

func testJob(t *testing.T) *core.Job {
	t.Helper()
	return &core.Job{ID: "j_test", History: core.NewHistory(1000, 1<<20)}
}

// sinkWithEvent is a sink over a fake stream, and an output event of its
// job to write.
func sinkWithEvent(t *testing.T) (*sink, *fakeStream, core.Event) {
	t.Helper()
	j := testJob(t)
	f := newFakeStream()
	return newSink(f, j, 42, 0), f, coretest.Append(t, j, core.EventOutput, `{}`)
}

func within(t *testing.T, what string, min, max time.Duration, f func()) {
	t.Helper()
	t0 := time.Now()
	f()
	if d := time.Since(t0); d < min || d > max {
		t.Errorf("%s took %s, want %s..%s", what, d, min, max)
	}
}

func TestGRPCSinkWritesInOrder(t *testing.T) {
	j := testJob(t)
	f := newFakeStream()
	s := newSink(f, j, 42, 0)
	_ = s.SetWriteDeadline(time.Now().Add(time.Second))
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	ev := coretest.Append(t, j, core.EventOutput, `{"data":"hi"}`)
	ev2 := coretest.Append(t, j, core.EventOutput, `{"data":"there"}`)
	for _, err := range []error{
		s.Event(ev, []byte("tok-1")),
		s.Event(ev2, []byte("tok-2")),
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
	if got := f.kinds(); !slices.Equal(got, []string{"output", "output", "heartbeat", "terminated"}) {
		t.Fatalf("sent %v", got)
	}
	sent := f.events()
	// The sink reuses its message and data buffer: each event sent must
	// still be its own.
	for i, want := range []struct {
		ev   core.Event
		tok  string
		data string
	}{
		{ev, "tok-1", `{"job_id":"j_test","gen":1,"seq":1,"snap":42,"attempt":1,"data":"hi"}`},
		{ev2, "tok-2", `{"job_id":"j_test","gen":1,"seq":2,"snap":42,"attempt":1,"data":"there"}`},
	} {
		out := sent[i]
		if out.GetJobId() != j.ID || out.GetSeq() != want.ev.Seq || out.GetGeneration() != 1 || out.GetSnapshot() != 42 ||
			out.GetAttempt() != 1 || out.GetResumeToken() != want.tok {
			t.Errorf("event %d: %v", i, out)
		}
		if string(out.GetDataJson()) != want.data {
			t.Errorf("event %d data %s, want %s", i, out.GetDataJson(), want.data)
		}
	}
	if hb := sent[2]; hb.GetJobId() != j.ID || hb.GetSeq() != 0 || hb.GetResumeToken() != "" || hb.GetDataJson() != nil || hb.GetSnapshot() != 0 {
		t.Errorf("heartbeat %v carries more than liveness", hb)
	}
	if c := sent[3]; c.GetSeq() != 0 || c.GetResumeToken() != "" || c.GetSnapshot() != 0 || string(c.GetDataJson()) != `{"job_id":"j_test","reason":"idle"}` {
		t.Errorf("control %v", c)
	}
}

// A Send blocked on a client that does not read cannot be interrupted;
// the watch gives up on it at the write deadline, and ending the stream
// then ends the Send.
func TestGRPCSinkWatchGivesUpOnABlockedSend(t *testing.T) {
	s, f, ev := sinkWithEvent(t)
	f.block()
	var sendErr error
	var writer <-chan struct{}
	within(t, "a watch over a blocked Send", 70*time.Millisecond, time.Second, func() {
		var gaveUp bool
		gaveUp, writer = watched(t, f, s, func() {
			_ = s.SetWriteDeadline(time.Now().Add(80 * time.Millisecond))
			sendErr = s.Event(ev, nil)
		})
		if !gaveUp {
			t.Error("the watch did not give up on a blocked Send")
		}
	})
	// The stream ended (watched): the blocked Send fails. Writes after it
	// fail at once, and none reaches the stream.
	select {
	case <-writer:
	case <-time.After(time.Second):
		t.Fatal("the blocked Send did not end with the stream")
	}
	if sendErr == nil {
		t.Error("the blocked Send succeeded after the stream ended")
	}
	within(t, "writes after the watch gave up", 0, 20*time.Millisecond, func() {
		if err := s.Flush(); err == nil {
			t.Error("flush after the watch gave up succeeded")
		}
		if err := s.Heartbeat(); err == nil {
			t.Error("heartbeat after the watch gave up succeeded")
		}
	})
	if !s.lastWriteFailed() {
		t.Error("lastWriteFailed is false after a failed write")
	}
	if len(f.events()) != 0 {
		t.Errorf("sent %v", f.kinds())
	}
}

// A watch with no deadline to wait for (the writer waits for the job) wakes
// for the deadline the writer sets before its next write, and gives up on
// that write when it blocks past it.
func TestGRPCSinkIdleWatchTakesTheNextDeadline(t *testing.T) {
	s, f, ev := sinkWithEvent(t)
	_ = s.SetWriteDeadline(time.Now().Add(-time.Second)) // passed, no Send in progress: idle
	f.block()
	within(t, "a watch over a write after an idle spell", 90*time.Millisecond, time.Second, func() {
		if gaveUp, _ := watched(t, f, s, func() {
			time.Sleep(40 * time.Millisecond)
			_ = s.SetWriteDeadline(time.Now().Add(60 * time.Millisecond))
			_ = s.Event(ev, nil)
		}); !gaveUp {
			t.Error("the watch did not give up on the blocked write")
		}
	})
}

// A Send that returns in time is not given up on: the watch ends with the
// writer.
func TestGRPCSinkWatchWaitsForASendThatReturns(t *testing.T) {
	s, f, ev := sinkWithEvent(t)
	f.blockThen(t, func() {
		time.Sleep(50 * time.Millisecond)
		f.unblock()
	})
	var err error
	within(t, "a watch over a Send that completes", 40*time.Millisecond, 900*time.Millisecond, func() {
		if gaveUp, _ := watched(t, f, s, func() {
			_ = s.SetWriteDeadline(time.Now().Add(time.Second))
			err = s.Event(ev, nil)
		}); gaveUp {
			t.Error("the watch gave up on a Send that returned in time")
		}
	})
	if err != nil || len(f.events()) != 1 || s.lastWriteFailed() {
		t.Errorf("event: %v, sent %v", err, f.kinds())
	}
}

// A write that starts past its deadline fails without being sent, however
// ready the stream is.
func TestGRPCSinkWritePastItsDeadlineFails(t *testing.T) {
	s, f, ev := sinkWithEvent(t)
	_ = s.SetWriteDeadline(time.Now().Add(-time.Millisecond))
	if err := s.Event(ev, nil); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("event: %v, want a deadline error", err)
	}
	if err := s.Flush(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("flush: %v, want a deadline error", err)
	}
	if !s.lastWriteFailed() || len(f.events()) != 0 || f.headersSent() != 0 {
		t.Errorf("sent %v, headers %d", f.kinds(), f.headersSent())
	}
	// A deadline moved on lets writes through again, as on a connection.
	_ = s.SetWriteDeadline(time.Now().Add(time.Second))
	if err := s.Event(ev, nil); err != nil || len(f.events()) != 1 {
		t.Errorf("event under a new deadline: %v", err)
	}
}

// Abort, from another goroutine, bounds the write in progress by its
// deadline, and every later one whatever SetWriteDeadline says.
func TestGRPCSinkAbortBoundsTheWriteInProgress(t *testing.T) {
	s, f, ev := sinkWithEvent(t)
	f.blockThen(t, func() {
		time.Sleep(20 * time.Millisecond)
		s.Abort(time.Now().Add(50 * time.Millisecond))
	})
	within(t, "a watch over an aborted write", 60*time.Millisecond, time.Second, func() {
		if gaveUp, _ := watched(t, f, s, func() {
			_ = s.SetWriteDeadline(time.Now().Add(time.Hour))
			_ = s.Event(ev, nil)
		}); !gaveUp {
			t.Error("the watch did not give up on the aborted write")
		}
	})
}

// Once aborted, a write past the abort deadline fails at once, whatever
// SetWriteDeadline says; a second Abort changes nothing.
func TestGRPCSinkAbortDeadlineOutlivesSetWriteDeadline(t *testing.T) {
	s, f, ev := sinkWithEvent(t)
	s.Abort(time.Now().Add(-time.Millisecond))
	_ = s.SetWriteDeadline(time.Now().Add(time.Hour))
	if err := s.Event(ev, nil); !errors.Is(err, errAborted) {
		t.Errorf("event: %v, want aborted", err)
	}
	s.Abort(time.Now().Add(time.Hour))
	if err := s.Heartbeat(); !errors.Is(err, errAborted) {
		t.Errorf("heartbeat after a second Abort: %v, want aborted", err)
	}
	if len(f.events()) != 0 {
		t.Errorf("sent %v", f.kinds())
	}
	// An idle watch (no Send in progress) does not give up: it waits for
	// the writer.
	if gaveUp, _ := watched(t, f, s, func() { time.Sleep(30 * time.Millisecond) }); gaveUp {
		t.Error("the watch gave up with no Send in progress")
	}
}

// A client that reads again within the abort's grace gets the blocked
// write through, and the terminated event after it.
func TestGRPCSinkAbortGraceLetsTheTerminatedEventThrough(t *testing.T) {
	s, f, ev := sinkWithEvent(t)
	f.blockThen(t, func() {
		s.Abort(time.Now().Add(2 * time.Second))
		time.Sleep(30 * time.Millisecond)
		f.unblock()
	})
	var errs []error
	if gaveUp, _ := watched(t, f, s, func() {
		_ = s.SetWriteDeadline(time.Now().Add(time.Hour))
		errs = append(errs, s.Event(ev, nil), s.Control(stream.Terminated, map[string]any{"reason": "slow_consumer"}), s.Flush())
	}); gaveUp {
		t.Fatal("the watch gave up within the grace")
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if got := f.kinds(); !slices.Equal(got, []string{"output", "terminated"}) {
		t.Fatalf("sent %v", got)
	}
	if s.lastWriteFailed() {
		t.Error("lastWriteFailed after a successful flush")
	}
}

func TestGRPCSinkSendErrorFailsLaterWrites(t *testing.T) {
	j := testJob(t)
	f := newFakeStream()
	s := newSink(f, j, 42, 0)
	boom := errors.New("transport is closing")
	f.mu.Lock()
	f.sendErr = boom
	f.mu.Unlock()
	ev := coretest.Append(t, j, core.EventOutput, `{}`)
	_ = s.SetWriteDeadline(time.Now().Add(time.Hour))
	if err := s.Event(ev, nil); !errors.Is(err, boom) {
		t.Fatalf("event: %v, want %v", err, boom)
	}
	f.mu.Lock()
	f.sendErr = nil
	f.mu.Unlock()
	if err := s.Flush(); !errors.Is(err, boom) {
		t.Errorf("flush: %v, want %v", err, boom)
	}
	if err := s.Event(ev, nil); !errors.Is(err, boom) {
		t.Errorf("event: %v, want %v", err, boom)
	}
	if len(f.events()) != 0 || f.headersSent() != 0 {
		t.Errorf("sent %v after a failed Send", f.kinds())
	}
}

func policy() stream.Policy {
	p := stream.DefaultPolicy()
	p.Setup = 500 * time.Millisecond
	p.WriteTimeout = 200 * time.Millisecond
	p.Heartbeat = time.Second
	p.Idle = 5 * time.Second
	return p
}

// runSink runs j's stream over a sink of maxBatch (0: per event) whose
// buffers come from a counting pool, and checks that every buffer returned.
func runSink(t *testing.T, j *core.Job, maxBatch int, f *fakeStream) stream.Result {
	t.Helper()
	s := newSink(f, j, 42, maxBatch)
	pool := newCountingPool()
	s.msg.pool, s.batch.pool = pool, pool
	var res stream.Result
	if gaveUp, _ := watched(t, f, s, func() {
		res = stream.Run(context.Background(), stream.Request{
			Job: j, Policy: policy(), Token: func(dst []byte, ev core.Event, _ time.Time) []byte {
				return append(dst, "t"+string(rune('0'+ev.Seq))...)
			},
		}, s)
		s.close()
	}); gaveUp {
		t.Fatal("the watch gave up")
	}
	if n := pool.outstanding(); n != 0 {
		t.Errorf("%d encoding buffers never returned to the pool", n)
	}
	if s.lastWriteFailed() {
		t.Error("lastWriteFailed after a stream that ended with its terminal event")
	}
	return res
}

func TestGRPCRunOverTheSink(t *testing.T) {
	j := testJob(t)
	coretest.Append(t, j, core.EventAccepted, `{"queue":"q"}`)
	coretest.Append(t, j, core.EventOutput, `{"data":"a"}`)
	coretest.Append(t, j, core.EventDone, `{"outcome":"completed"}`)
	f := newFakeStream()
	res := runSink(t, j, 0, f)
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
	// runSink checked that the last write did not fail.
	if err := apierr.Status(endError(context.Background(), res.End, false)); err != nil {
		t.Errorf("a stream that ended with its terminal event ends %v", err)
	}
}

// runOnStoppedClient runs, with policy p, the stream of a job with an
// accepted event over a sink whose client stops reading at its first Send;
// outputs more events follow once that Send blocks. The watch must give up
// on the writer within min..max, as JobServer.serve's does; the stream then ends
// (the handler returned), and so does Run. maxBatch is the sink's framing.
func runOnStoppedClient(t *testing.T, what string, p stream.Policy, outputs int, min, max time.Duration, maxBatch int) (stream.Result, *sink) {
	t.Helper()
	j := testJob(t)
	coretest.Append(t, j, core.EventAccepted, `{"queue":"q"}`)
	f := newFakeStream()
	s := newSink(f, j, 42, maxBatch)
	f.blockThen(t, func() {
		for range outputs {
			coretest.Append(t, j, core.EventOutput, `{"data":"a"}`)
		}
	})
	res := make(chan stream.Result, 1)
	within(t, what, min, max, func() {
		if gaveUp, _ := watched(t, f, s, func() { res <- stream.Run(context.Background(), stream.Request{Job: j, Policy: p}, s) }); !gaveUp {
			t.Error("the watch did not give up on the blocked writer")
		}
	})
	select {
	case r := <-res:
		return r, s
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not end with the stream")
		return stream.Result{}, s
	}
}

// A client that stopped reading: the writer fails at the write timeout
// (no bound passed), and the call says write_failed.
func TestGRPCRunWriteTimeoutOnABlockedClient(t *testing.T) {
	forEachFraming(t, func(t *testing.T, maxBatch int) {
		res, s := runOnStoppedClient(t, "Run on a client that stopped reading", policy(), 1, 150*time.Millisecond, 2*time.Second, maxBatch)
		if res.End != stream.EndWriteFailed {
			t.Fatalf("result %+v, want write_failed", res)
		}
		err := apierr.Status(endError(context.Background(), res.End, s.lastWriteFailed()))
		if status.Code(err) != codes.Unavailable {
			t.Errorf("status %v", err)
		}
	})
}

// forEachFraming runs f as a subtest for each framing of a stream's
// events: a JobEvent per message (maxBatch 0), and batches.
func forEachFraming(t *testing.T, f func(t *testing.T, maxBatch int)) {
	t.Run("per-event", func(t *testing.T) { f(t, 0) })
	t.Run("batched", func(t *testing.T) { f(t, 64<<10) })
}

// The lag watcher aborts a writer blocked on a client that stopped reading
// as soon as the stream's queue passes its bound; the stream ends slow.
func TestGRPCRunWatcherAbortsABlockedWriter(t *testing.T) {
	p := policy()
	p.WriteTimeout = 4 * time.Second // the watcher, not the write timeout, must end it
	p.MaxLagEvents = 3
	forEachFraming(t, func(t *testing.T, maxBatch int) {
		res, s := runOnStoppedClient(t, "Run with a watcher", p, 5, 0, 3*time.Second, maxBatch)
		if res.End != stream.EndSlow || res.LagEvents <= 3 {
			t.Fatalf("result %+v, want slow past 3 events", res)
		}
		if !s.lastWriteFailed() {
			t.Fatal("the terminated event cannot have got through a blocked Send")
		}
		if err := apierr.Status(endError(context.Background(), res.End, true)); status.Code(err) != codes.Unavailable {
			t.Errorf("status %v", err)
		}
	})
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
