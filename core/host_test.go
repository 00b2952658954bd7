package core_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/switchyard/switchyard/core"
)

func TestStalledWorkerIsDropped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, shortDispatch) // floor 50ms, ceiling 200ms, fraction 0.25
		w1, f1 := h.attach("q", 1)
		j := h.submit("q", env(2*time.Second))
		o1 := f1.lastOffer(t)
		w2, f2 := h.attach("q", 1)
		if len(f2.Offers()) != 0 {
			t.Fatal("a bound job was offered to a second worker")
		}
		// min(max(2s×0.25, 50ms), 200ms, 1s) = 200ms.
		f1.wantStalledAt(t, 200*time.Millisecond, "dispatch")
		w1.Detach(context.Background()) // what the transport does next
		o2 := f2.lastOffer(t)
		if o2.JobID != j.ID || o2.Gen != o1.Gen+1 {
			t.Fatalf("offer to the second worker = %+v, want %s gen %d", o2, j.ID, o1.Gen+1)
		}
		if o2.TTL != o1.TTL-200*time.Millisecond {
			t.Errorf("second offer TTL = %v, want %v", o2.TTL, o1.TTL-200*time.Millisecond)
		}
		v := h.view(j.ID)
		if v.HandledBy != w2.ID || v.Generation != o2.Gen || v.State != core.StateOffered {
			t.Fatalf("view = %+v", v)
		}
		// The stalled worker's late accept is stale.
		w1.Accept(j.ID, o1.Gen)
		if v := h.view(j.ID); v.HandledBy != w2.ID || v.State != core.StateOffered {
			t.Fatalf("a dropped worker's accept took the job: %+v", v)
		}
		for name, want := range map[string]float64{
			"switchyard_dispatch_stalls_total":   1,
			"switchyard_dispatch_reclaims_total": 1,
			"switchyard_workers_connected":       1,
		} {
			if got := h.metric(name); got != want {
				t.Errorf("%s = %v, want %v", name, got, want)
			}
		}
		w2.Accept(j.ID, o2.Gen)
		w2.End(j.ID, o2.Gen, "", "", nil)
		wantEnded(t, h, j, core.OutcomeCompleted, "")
		if n := len(f1.Closes()); n != 1 {
			t.Fatalf("closes = %d", n)
		}
	})
}

// TestStalledWorkerRealClock is the stall on the real clock.
func TestStalledWorkerRealClock(t *testing.T) {
	h, w1, f1 := oneWorker(t, shortDispatch)
	_, f2 := h.attach("q", 1)
	// Both free: the first attached gets the first pick. A long TTL keeps
	// the accept window at the 200ms ceiling and the job alive however
	// slowly this test is scheduled.
	j := h.submit("q", env(time.Minute))
	if len(f1.offersFor(j.ID)) != 1 {
		t.Fatal("the job was not offered to the first worker")
	}
	waitFor(t, 10*time.Second, "the stalled worker to be closed", func() bool { return len(f1.Closes()) > 0 })
	if !errors.Is(f1.Closes()[0], core.ErrStalled) {
		t.Fatalf("close cause = %v", f1.Closes()[0])
	}
	w1.Detach(context.Background())
	if o := f2.Offers(); len(o) != 1 || o[0].JobID != j.ID || o[0].Gen != 2 {
		t.Fatalf("offers to the second worker = %+v, want %s gen 2", o, j.ID)
	}
}

func TestAcceptedWorkerIsNotStalled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, w, fc := oneWorker(t, shortDispatch)
		j := h.submit("q", env(5*time.Second))
		w.Accept(j.ID, fc.lastOffer(t).Gen)
		time.Sleep(4 * time.Second)
		synctest.Wait()
		if len(fc.Closes()) != 0 {
			t.Fatal("a worker that accepted was dropped as stalled")
		}
		if v := h.view(j.ID); v.State != core.StateRunning {
			t.Fatalf("state = %s", v.State)
		}
	})
}

func TestDetachBeforeOutputReoffers(t *testing.T) {
	h, w1, f1 := oneWorker(t, nil)
	j := h.submit("q", env(time.Minute))
	o1 := f1.lastOffer(t)
	w1.Accept(j.ID, o1.Gen)
	w2, f2 := h.attach("q", 1)
	w1.Detach(context.Background())
	o2 := f2.lastOffer(t)
	if o2.JobID != j.ID || o2.Gen <= o1.Gen {
		t.Fatalf("re-offer = %+v, want %s with a generation above %d", o2, j.ID, o1.Gen)
	}
	if v := h.view(j.ID); v.Generation != o2.Gen || v.HandledBy != w2.ID {
		t.Fatalf("view = %+v", v)
	}
	if len(f1.Closes()) != 0 {
		t.Fatal("Close called on a worker that detached by itself")
	}
	// The old generation is fenced off.
	head := j.History.Head()
	w1.Output(j.ID, o1.Gen, []byte(`"old"`))
	w1.End(j.ID, o1.Gen, "", "", nil)
	if j.History.Head() != head {
		t.Fatal("output from the lost worker was appended")
	}
	w2.Accept(j.ID, o2.Gen)
	w2.Output(j.ID, o2.Gen, []byte(`"new"`))
	w2.End(j.ID, o2.Gen, "", "", nil)
	wantEnded(t, h, j, core.OutcomeCompleted, "")
	evs := events(t, j)
	if got := fmt.Sprint(kinds(evs)); got != "[accepted output done]" {
		t.Fatalf("events = %s", got)
	}
	if evs[1].Gen != o2.Gen || string(evs[1].Data) != `{"data":"new"}` {
		t.Fatalf("output event = gen %d %s", evs[1].Gen, evs[1].Data)
	}
	// Going back to the queue before any output keeps the event stream.
	if g := j.StreamGeneration(); g != 1 {
		t.Errorf("StreamGeneration = %d, want 1", g)
	}
	if v := h.metric("switchyard_dispatch_reclaims_total"); v != 1 {
		t.Errorf("reclaims_total = %v", v)
	}
}

func TestDetachWithNoOtherWorkerRequeues(t *testing.T) {
	h, w1, f1 := oneWorker(t, nil)
	j := h.submit("q", env(time.Minute))
	w1.Detach(context.Background())
	if v := h.view(j.ID); v.State != core.StateQueued || v.HandledBy != "" {
		t.Fatalf("view after the only worker left = %+v", v)
	}
	if v := h.metric("switchyard_queue_depth", "queue", "q"); v != 1 {
		t.Fatalf("queue_depth = %v", v)
	}
	_, f2 := h.attach("q", 1)
	if o := f2.lastOffer(t); o.JobID != j.ID || o.Gen != f1.lastOffer(t).Gen+1 {
		t.Fatalf("offer to the new worker = %+v", o)
	}
}

func TestDetachAfterOutputFailsWorkerLost(t *testing.T) {
	h, w1, f1 := oneWorker(t, nil)
	j, gen := h.running(w1, f1)
	w1.Output(j.ID, gen, []byte(`"partial"`))
	wantLostNotRunAgain(t, h, w1, j)
	if got := fmt.Sprint(kinds(events(t, j))); got != "[accepted output error]" {
		t.Fatalf("events = %s", got)
	}
	if len(f1.Cancels()) != 0 {
		t.Fatalf("a gone worker was sent a cancel: %v", f1.Cancels())
	}
	if v := h.metric("switchyard_dispatch_reclaims_total"); v != 0 {
		t.Errorf("reclaims_total = %v", v)
	}
}

func TestSendOfferFailureDropsWorker(t *testing.T) {
	h, w1, f1 := oneWorker(t, nil)
	f1.mu.Lock()
	f1.offerErr = errors.New("stream closed")
	f1.mu.Unlock()
	_, f2 := h.attach("q", 1)
	// Both are free; w1 was attached first and gets the first pick.
	j := h.submit("q", env(time.Minute))
	closes := f1.Closes()
	if len(closes) != 1 || closes[0] == nil || errors.Is(closes[0], core.ErrStalled) {
		t.Fatalf("closes = %v, want one send error", closes)
	}
	if o := f2.lastOffer(t); o.JobID != j.ID || o.Gen != 2 {
		t.Fatalf("offer to the healthy worker = %+v", o)
	}
	w1.Detach(context.Background())
	if v := h.metric("switchyard_workers_connected"); v != 1 {
		t.Fatalf("workers_connected = %v", v)
	}
}

// TestShortTTLOfferDoesNotDropWorker: a job offered with so little TTL left
// that its accept window is cut below the dispatch-timeout floor is the job
// running out of time, not the worker stalling. The worker must not be
// dropped for it (which would fail its other jobs worker_lost); the job
// expires and the worker is told to stop it.
func TestShortTTLOfferDoesNotDropWorker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, nil) // floor 1s
		w, fc := h.attach("q", 2)
		a, ga := h.running(w, fc)
		w.Output(a.ID, ga, []byte(`"a is producing"`))
		c, gc := h.running(w, fc)
		b := h.submit("q", env(time.Second)) // waits: no credit
		time.Sleep(600 * time.Millisecond)
		w.End(c.ID, gc, "", "", nil) // frees a credit: b is offered with 400ms left
		ob := fc.lastOffer(t)
		if ob.JobID != b.ID || ob.TTL != 400*time.Millisecond {
			t.Fatalf("offer = %+v, want b with 400ms", ob)
		}
		// b's accept window is min(..., 400ms/2) = 200ms, below the 1s floor.
		time.Sleep(250 * time.Millisecond)
		synctest.Wait()
		if cl := fc.Closes(); len(cl) != 0 {
			t.Fatalf("a healthy worker was dropped for a job that ran out of TTL: %v", cl)
		}
		if v := h.view(a.ID); v.State != core.StateRunning {
			t.Fatalf("the worker's other job is %s (%s), want running", v.State, v.Code)
		}
		wantEnded(t, h, b, core.OutcomeExpired, core.CodeExpired)
		if cs := fc.Cancels(); len(cs) != 1 || cs[0] != (cancelMsg{b.ID, ob.Gen, core.CodeExpired}) {
			t.Fatalf("cancels = %+v, want b told it expired", cs)
		}
		if v := h.metric("switchyard_dispatch_stalls_total"); v != 0 {
			t.Errorf("stalls_total = %v", v)
		}
		// The worker acknowledges; its credit comes back, a keeps running.
		w.End(b.ID, ob.Gen, core.CodeCancelled, "", nil)
		w.End(a.ID, ga, "", "", nil)
		wantEnded(t, h, a, core.OutcomeCompleted, "")
	})
}

// TestShortTTLOfferAcceptedInTime: a short accept window that the worker
// meets is an ordinary run.
func TestShortTTLOfferAcceptedInTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, nil) // floor 1s
		w, fc := h.attach("q", 1)
		j := h.submit("q", env(400*time.Millisecond)) // window 200ms
		time.Sleep(150 * time.Millisecond)
		w.Accept(j.ID, fc.lastOffer(t).Gen)
		time.Sleep(200 * time.Millisecond)
		synctest.Wait()
		if v := h.view(j.ID); v.State != core.StateRunning {
			t.Fatalf("state = %s (%s), want running", v.State, v.Code)
		}
		w.End(j.ID, fc.lastOffer(t).Gen, "", "", nil)
		wantEnded(t, h, j, core.OutcomeCompleted, "")
		if len(fc.Closes())+len(fc.Cancels()) != 0 {
			t.Fatalf("closes %v cancels %v", fc.Closes(), fc.Cancels())
		}
	})
}

func TestWorkerSendQueueFitsLargestOffer(t *testing.T) {
	for _, maxInput := range []int64{1 << 10, 1 << 20, 64 << 20} {
		if count, bytes := core.WorkerSendQueue(1, maxInput); bytes < 2*(maxInput+64<<10) || count < 4 {
			t.Errorf("WorkerSendQueue(1, %d) = %d, %d: two offers of the largest input do not fit", maxInput, count, bytes)
		}
	}
}
