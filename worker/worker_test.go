package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/switchyard/switchyard/internal/syncbuf"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
	"github.com/switchyard/switchyard/worker"
)

func TestRegisterHandshake(t *testing.T) {
	f, _, s := startOnFake(t, worker.Config{
		Queue: "render", Capabilities: []string{"model=demo", "gpu=no"}, Concurrency: 3, Name: "w1",
	}, blockUntilCancelled(nil, nil))
	r := s.reg
	if r.Queue != "render" || r.Concurrency != 3 || r.Name != "w1" || strings.Join(r.Capabilities, ",") != "model=demo,gpu=no" {
		t.Fatalf("register = %v", r)
	}
	if n := f.registers.Load(); n != 1 {
		t.Fatalf("registers = %d, want 1", n)
	}
}

func TestJobOutputsInOrderThenComplete(t *testing.T) {
	jobs := make(chan *worker.Job, 1)
	_, _, s := startOnFake(t, worker.Config{}, func(ctx context.Context, job *worker.Job, out *worker.Output) (any, error) {
		jobs <- job
		for i := range 5 {
			if err := out.Send(ctx, i); err != nil {
				return nil, err
			}
		}
		if err := out.SendRaw(ctx, json.RawMessage(`{"raw":true}`)); err != nil {
			return nil, err
		}
		return map[string]int{"n": 6}, nil
	})
	before := time.Now()
	s.sendJob(t, &pb.Job{
		JobId: "j1", Generation: 2, Queue: "q", Input: []byte(`"hi"`), Options: []byte(`{"o":1}`),
		Capabilities: []string{"model=demo"}, TtlMs: 30_000, MaxOutputBytes: 1000,
	})
	s.expectAccept(t, "j1", 2)
	var got []string
	for range 6 {
		o := s.next(t).GetOutput()
		if o == nil || o.JobId != "j1" || o.Generation != 2 {
			t.Fatalf("want Output of j1/2, got %v", o)
		}
		got = append(got, string(o.Data))
	}
	if want := `0 1 2 3 4 {"raw":true}`; strings.Join(got, " ") != want {
		t.Fatalf("outputs = %q, want %q", got, want)
	}
	c := s.next(t).GetComplete()
	if c == nil || c.JobId != "j1" || c.Generation != 2 || string(c.Result) != `{"n":6}` {
		t.Fatalf("want Complete{j1, 2, {\"n\":6}}, got %v", c)
	}
	after := time.Now()

	job := recv(t, jobs, "the job")
	if job.ID != "j1" || job.Generation != 2 || job.Queue != "q" || string(job.Input) != `"hi"` ||
		string(job.Options) != `{"o":1}` || strings.Join(job.Capabilities, ",") != "model=demo" || job.MaxOutputBytes != 1000 {
		t.Fatalf("job = %+v", job)
	}
	// The deadline is the local receive time plus the TTL.
	if job.Deadline.Before(before.Add(30*time.Second)) || job.Deadline.After(after.Add(30*time.Second)) {
		t.Fatalf("deadline %v not within receive window [%v, %v] + 30s", job.Deadline, before, after)
	}
}

func TestNilResultCompletesWithoutResult(t *testing.T) {
	_, _, s := startOnFake(t, worker.Config{}, func(context.Context, *worker.Job, *worker.Output) (any, error) {
		return nil, nil
	})
	s.sendJob(t, &pb.Job{JobId: "j", Generation: 1, Input: []byte(`1`)})
	s.expectAccept(t, "j", 1)
	c := s.next(t).GetComplete()
	if c == nil || c.JobId != "j" || len(c.Result) != 0 {
		t.Fatalf("want Complete without result, got %v", c)
	}
}

func TestDecideRejects(t *testing.T) {
	called := make(chan struct{}, 1)
	_, _, s := startOnFake(t, worker.Config{
		Decide: func(j *worker.Job) error {
			if string(j.Input) == `"big"` {
				return errors.New("input too big for this worker")
			}
			return nil
		},
	}, func(context.Context, *worker.Job, *worker.Output) (any, error) {
		called <- struct{}{}
		return nil, nil
	})
	s.sendJob(t, &pb.Job{JobId: "big", Generation: 1, Input: []byte(`"big"`)})
	r := s.next(t).GetReject()
	if r == nil || r.JobId != "big" || r.Generation != 1 || r.Reason != "input too big for this worker" {
		t.Fatalf("want Reject{big, 1, reason}, got %v", r)
	}
	// The worker stays registered and takes the next job.
	s.sendJob(t, &pb.Job{JobId: "small", Generation: 1, Input: []byte(`"small"`)})
	s.expectAccept(t, "small", 1)
	if c := s.next(t).GetComplete(); c == nil || c.JobId != "small" {
		t.Fatalf("want Complete of small, got %v", c)
	}
	if len(called) != 1 {
		t.Fatalf("handler ran %d times, want 1 (only for the accepted job)", len(called))
	}
}

func TestOverConcurrencyRejected(t *testing.T) {
	_, _, s := startOnFake(t, worker.Config{Concurrency: 1}, blockUntilCancelled(nil, nil))
	s.sendJob(t, &pb.Job{JobId: "a", Generation: 1, Input: []byte(`1`)})
	s.expectAccept(t, "a", 1)
	s.sendJob(t, &pb.Job{JobId: "b", Generation: 1, Input: []byte(`1`)})
	r := s.next(t).GetReject()
	if r == nil || r.JobId != "b" || r.Reason != "over concurrency" {
		t.Fatalf("want Reject{b, over concurrency}, got %v", r)
	}
}

func TestCancelStopsHandlerAndAcknowledges(t *testing.T) {
	var logs syncbuf.Buffer
	outs := make(chan *worker.Output, 1)
	ctxErr := make(chan error, 1)
	_, _, s := startOnFake(t, worker.Config{Logger: textLogger(&logs)}, func(ctx context.Context, job *worker.Job, out *worker.Output) (any, error) {
		outs <- out
		<-ctx.Done()
		ctxErr <- ctx.Err()
		return "finished anyway", nil
	})
	s.sendJob(t, &pb.Job{JobId: "j7", Generation: 3, Input: []byte(`1`)})
	s.expectAccept(t, "j7", 3)
	out := recv(t, outs, "handler start")

	// A cancel for another generation is stale and changes nothing.
	s.sendCancel(t, "j7", 2, "cancelled")
	start := time.Now()
	s.sendCancel(t, "j7", 3, "cancelled")
	if err := recv(t, ctxErr, "handler context cancelled"); !errors.Is(err, context.Canceled) {
		t.Fatalf("handler ctx err = %v, want Canceled", err)
	}
	fl := s.expectFail(t, "j7", 3)
	if fl.Code != "cancelled" {
		t.Fatalf("fail code = %q, want cancelled (whatever the handler returned)", fl.Code)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("cancel took %s", d)
	}
	if err := out.Send(context.Background(), "late"); !errors.Is(err, worker.ErrJobEnded) {
		t.Fatalf("Send after cancel = %v, want ErrJobEnded", err)
	}
	l := logs.String()
	if !strings.Contains(l, `msg="job cancelled"`) || !strings.Contains(l, "job=j7") || !strings.Contains(l, "reason=cancelled") {
		t.Fatalf("log has no clear job cancelled line:\n%s", l)
	}
	select {
	case m := <-s.msgs:
		t.Fatalf("unexpected message after the cancel ack: %v", m)
	case <-time.After(50 * time.Millisecond):
	}
}

func TestDeadlineExpires(t *testing.T) {
	ctxErr := make(chan error, 1)
	_, _, s := startOnFake(t, worker.Config{}, blockUntilCancelled(nil, ctxErr))
	start := time.Now()
	s.sendJob(t, &pb.Job{JobId: "e", Generation: 1, Input: []byte(`1`), TtlMs: 80})
	s.expectAccept(t, "e", 1)
	if err := recv(t, ctxErr, "handler deadline"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("handler ctx err = %v, want DeadlineExceeded", err)
	}
	if fl := s.expectFail(t, "e", 1); fl.Code != "expired" {
		t.Fatalf("fail code = %q, want expired", fl.Code)
	}
	if d := time.Since(start); d < 80*time.Millisecond {
		t.Fatalf("expired after %s, before the 80ms TTL", d)
	}
}

func TestHandlerErrorCodes(t *testing.T) {
	for _, tc := range []struct {
		name      string
		h         worker.Handler
		code, msg string
	}{
		{"plain error", func(context.Context, *worker.Job, *worker.Output) (any, error) {
			return nil, errors.New("boom")
		}, "worker_error", "boom"},
		{"Fail", func(context.Context, *worker.Job, *worker.Output) (any, error) {
			return nil, worker.Fail("model_error", "out of memory")
		}, "model_error", "out of memory"},
		{"wrapped Fail", func(context.Context, *worker.Job, *worker.Output) (any, error) {
			return nil, fmt.Errorf("step 2: %w", worker.Fail("limit", "too long"))
		}, "limit", "too long"},
		{"panic", func(context.Context, *worker.Job, *worker.Output) (any, error) {
			panic("kaboom")
		}, "worker_error", "handler panicked: kaboom"},
		{"unmarshalable result", func(context.Context, *worker.Job, *worker.Output) (any, error) {
			return func() {}, nil
		}, "worker_error", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, s := startOnFake(t, worker.Config{}, tc.h)
			s.sendJob(t, &pb.Job{JobId: "h", Generation: 1, Input: []byte(`1`)})
			s.expectAccept(t, "h", 1)
			fl := s.expectFail(t, "h", 1)
			if fl.Code != tc.code || (tc.msg != "" && fl.Message != tc.msg) {
				t.Fatalf("Fail = {%q, %q}, want {%q, %q}", fl.Code, fl.Message, tc.code, tc.msg)
			}
		})
	}
}

// The SDK sends output past Job.MaxOutputBytes: the node, which counts
// the job's output, is the one to end it (output_too_large).
func TestOutputAfterEndAndLimits(t *testing.T) {
	outs := make(chan *worker.Output, 1)
	errs := make(chan error, 2)
	_, _, s := startOnFake(t, worker.Config{}, func(ctx context.Context, job *worker.Job, out *worker.Output) (any, error) {
		outs <- out
		errs <- out.SendRaw(ctx, json.RawMessage(`{not json`))
		if err := out.Send(ctx, "12345678"); err != nil { // 10 bytes with quotes
			return nil, err
		}
		errs <- out.Send(ctx, "x") // 3 more bytes: over the 12-byte limit, sent all the same
		return nil, nil
	})
	s.sendJob(t, &pb.Job{JobId: "o", Generation: 1, Input: []byte(`1`), MaxOutputBytes: 12})
	s.expectAccept(t, "o", 1)
	if o := s.next(t).GetOutput(); o == nil || string(o.Data) != `"12345678"` {
		t.Fatalf("want the output within the limit, got %v", o)
	}
	if o := s.next(t).GetOutput(); o == nil || string(o.Data) != `"x"` {
		t.Fatalf("want the output past the limit sent for the node to judge, got %v", o)
	}
	if c := s.next(t).GetComplete(); c == nil {
		t.Fatal("want Complete")
	}
	if err := recv(t, errs, "invalid JSON error"); err == nil {
		t.Fatal("SendRaw of invalid JSON succeeded")
	}
	if err := recv(t, errs, "send past the limit"); err != nil {
		t.Fatalf("Send past the limit = %v, want it sent", err)
	}
	out := recv(t, outs, "output")
	if err := out.Send(context.Background(), "late"); !errors.Is(err, worker.ErrJobEnded) {
		t.Fatalf("Send after Complete = %v, want ErrJobEnded", err)
	}
}

func TestSessionDropCancelsJobsAndReconnects(t *testing.T) {
	ctxErr := make(chan error, 1)
	f, _, s1 := startOnFake(t, worker.Config{}, blockUntilCancelled(nil, ctxErr))
	s1.sendJob(t, &pb.Job{JobId: "d", Generation: 1, Input: []byte(`1`)})
	s1.expectAccept(t, "d", 1)
	close(s1.drop)
	if err := recv(t, ctxErr, "running job cancelled by the session drop"); !errors.Is(err, context.Canceled) {
		t.Fatalf("handler ctx err = %v, want Canceled", err)
	}
	s2 := f.nextSession(t)
	if n := f.registers.Load(); n != 2 {
		t.Fatalf("registers = %d, want 2", n)
	}
	// The new session works.
	s2.sendJob(t, &pb.Job{JobId: "d2", Generation: 1, Input: []byte(`1`)})
	s2.expectAccept(t, "d2", 1)
}

func TestRunReturnsOnCancel(t *testing.T) {
	ctxErr := make(chan error, 1)
	_, w, s := startOnFake(t, worker.Config{}, blockUntilCancelled(nil, ctxErr))
	s.sendJob(t, &pb.Job{JobId: "r", Generation: 1, Input: []byte(`1`)})
	s.expectAccept(t, "r", 1)
	if err := w.stop(); err != nil {
		t.Fatalf("Run = %v, want nil on shutdown", err)
	}
	// Run returned only after the handler did.
	select {
	case err := <-ctxErr:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("handler ctx err = %v", err)
		}
	default:
		t.Fatal("Run returned before the running handler ended")
	}
	recv(t, s.ended, "session end on the node")
}

func TestRunReturnsWhileNodeDown(t *testing.T) {
	// Nothing listens here: Run keeps retrying until it is cancelled.
	w := startWorker(t, "127.0.0.1:1", worker.Config{}, blockUntilCancelled(nil, nil))
	time.Sleep(100 * time.Millisecond)
	if err := w.stop(); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
}

func TestPermanentRegisterErrorNotRetried(t *testing.T) {
	f := newFakeNode()
	f.registerErr = status.Error(codes.InvalidArgument, "invalid_queue_name: bad queue")
	addr := f.start(t)
	w := startWorker(t, addr, worker.Config{Queue: "bad queue!"}, blockUntilCancelled(nil, nil))
	err := w.wait()
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Run = %v, want InvalidArgument", err)
	}
	if n := f.registers.Load(); n != 1 {
		t.Fatalf("registers = %d, want 1 (no retry)", n)
	}
}

func TestTransientRegisterErrorRetried(t *testing.T) {
	f := newFakeNode()
	f.registerErr = status.Error(codes.Unavailable, "draining")
	addr := f.start(t)
	startWorker(t, addr, worker.Config{}, blockUntilCancelled(nil, nil))
	deadline := time.Now().Add(wait)
	for f.registers.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("registers = %d, want retries", f.registers.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestInvalidConfig(t *testing.T) {
	h := blockUntilCancelled(nil, nil)
	for name, cfg := range map[string]worker.Config{
		"no server":        {Queue: "q"},
		"no queue":         {Server: "127.0.0.1:1"},
		"negative conc":    {Server: "127.0.0.1:1", Queue: "q", Concurrency: -1},
		"negative backoff": {Server: "127.0.0.1:1", Queue: "q", MaxBackoff: -time.Second},
	} {
		if err := worker.Run(context.Background(), cfg, h); !errors.Is(err, worker.ErrInvalidConfig) {
			t.Errorf("%s: Run = %v, want ErrInvalidConfig", name, err)
		}
	}
	if err := worker.Run(context.Background(), worker.Config{Server: "x:1", Queue: "q"}, nil); !errors.Is(err, worker.ErrInvalidConfig) {
		t.Errorf("nil handler: Run = %v, want ErrInvalidConfig", err)
	}
}

func TestHeartbeatsWhenIdle(t *testing.T) {
	f := newFakeNode()
	// The node heartbeats every 10ms, so the worker's 60ms silence limit
	// (3 × its 20ms interval) never fires and the session stays up.
	f.heartbeatMS = 20
	addr := f.start(t)
	startWorker(t, addr, worker.Config{HeartbeatInterval: 20 * time.Millisecond}, blockUntilCancelled(nil, nil))
	s := f.nextSession(t)
	deadline := time.Now().Add(wait)
	for s.heartbeats.Load() < 5 {
		if time.Now().After(deadline) {
			t.Fatalf("heartbeats = %d, want >= 5", s.heartbeats.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := f.registers.Load(); n != 1 {
		t.Fatalf("registers = %d: a session with a talking node was ended", n)
	}
}

func TestSilentNodeEndsSessionAndReconnects(t *testing.T) {
	f := newFakeNode()
	f.silent = true
	f.heartbeatMS = 50 // the worker gives up after 3 × 50ms of silence
	addr := f.start(t)
	startWorker(t, addr, worker.Config{}, blockUntilCancelled(nil, nil))
	s1 := f.nextSession(t)
	start := time.Now()
	// The test never drops s1: the worker must end it on its own.
	recv(t, s1.ended, "worker ending the silent session")
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Fatalf("session ended after %s, before the silence timeout", d)
	}
	f.nextSession(t)
	if n := f.registers.Load(); n < 2 {
		t.Fatalf("registers = %d, want a reconnect", n)
	}
}
