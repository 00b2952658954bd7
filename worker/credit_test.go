package worker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
	"github.com/switchyard/switchyard/worker"
)

func outputCredit(job string, events, bytes uint64) *pb.NodeMessage {
	return &pb.NodeMessage{Msg: &pb.NodeMessage_OutputCredit{OutputCredit: &pb.OutputCredit{JobId: job, Generation: 1, Events: events, Bytes: bytes}}}
}

// Output.Send sends within the job's output credit and waits past it: the
// offer's credit lets two outputs go, a larger credit two more, an older
// (smaller) one nothing, and a cancel ends a send that waits.
func TestSendWaitsForCredit(t *testing.T) {
	sendErr := make(chan error, 1)
	_, _, s := startOnFake(t, worker.Config{}, func(ctx context.Context, _ *worker.Job, out *worker.Output) (any, error) {
		for i := range 10 {
			if err := out.Send(ctx, i); err != nil {
				sendErr <- err
				return nil, err
			}
		}
		return nil, nil
	})
	s.sendJob(t, &pb.Job{JobId: "j", Generation: 1, OutputCredit: &pb.OutputCredit{JobId: "j", Generation: 1, Events: 2, Bytes: 1000}})
	s.expectAccept(t, "j", 1)
	outputs := func(n int) {
		t.Helper()
		for range n {
			if o := s.next(t).GetOutput(); o == nil {
				t.Fatal("want an output")
			}
		}
	}
	nothing := func(what string) {
		t.Helper()
		select {
		case m := <-s.msgs:
			t.Fatalf("%s: the worker sent %v", what, m)
		case <-time.After(100 * time.Millisecond):
		}
	}
	outputs(2)
	nothing("past the offer's credit")
	s.send(t, outputCredit("j", 4, 1000))
	outputs(2)
	nothing("past the second credit")
	s.send(t, outputCredit("j", 3, 1000)) // older: changes nothing
	s.send(t, outputCredit("other", 100, 100000))
	nothing("after an older credit and another job's")
	s.sendCancel(t, "j", 1, "cancelled")
	if err := recv(t, sendErr, "the waiting send to return"); !errors.Is(err, worker.ErrJobEnded) {
		t.Fatalf("waiting send returned %v, want ErrJobEnded", err)
	}
	if f := s.expectFail(t, "j", 1); f.Code != "cancelled" {
		t.Fatalf("fail %v, want cancelled", f)
	}
}

// One output may end past the bytes of the credit: a chunk larger than the
// whole window goes alone; then the worker waits. A job offered with no
// credit is not paced. A send waiting for credit gives up with its own
// context.
func TestSendCreditBytes(t *testing.T) {
	sendErr := make(chan error, 2)
	_, _, s := startOnFake(t, worker.Config{Concurrency: 2}, func(ctx context.Context, job *worker.Job, out *worker.Output) (any, error) {
		if job.ID == "free" {
			for i := range 50 {
				if err := out.Send(ctx, i); err != nil {
					return nil, err
				}
			}
			return nil, nil
		}
		if err := out.Send(ctx, "a chunk larger than ten bytes"); err != nil {
			return nil, err
		}
		sctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		err := out.Send(sctx, "b")
		sendErr <- err
		return nil, err
	})
	s.sendJob(t, &pb.Job{JobId: "big", Generation: 1, OutputCredit: &pb.OutputCredit{JobId: "big", Generation: 1, Events: 10, Bytes: 10}})
	s.expectAccept(t, "big", 1)
	if o := s.next(t).GetOutput(); o == nil || len(o.Data) <= 10 {
		t.Fatalf("want the large output, got %v", o)
	}
	if err := recv(t, sendErr, "the second send"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second send returned %v, want its context's deadline", err)
	}
	if f := s.expectFail(t, "big", 1); f.Code != "worker_error" {
		t.Fatalf("fail %v", f)
	}
	s.sendJob(t, &pb.Job{JobId: "free", Generation: 1})
	s.expectAccept(t, "free", 1)
	for range 50 {
		if o := s.next(t).GetOutput(); o == nil {
			t.Fatal("a job with no credit was held")
		}
	}
}
