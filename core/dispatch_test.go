package core_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/switchyard/switchyard/core"
)

func TestQueueDepthCap(t *testing.T) {
	h, w, fc := oneWorker(t, func(c *core.Config) { c.Limits.MaxQueueDepth = 2 })
	a := h.submit("q", env(time.Minute)) // bound: not counted in the depth
	b := h.submit("q", env(time.Minute))
	c := h.submit("q", env(time.Minute))
	if v := h.metric("switchyard_queue_depth", "queue", "q"); v != 2 {
		t.Fatalf("queue_depth = %v, want 2", v)
	}
	j, existing, err := h.e.Submit(context.Background(), "q", env(time.Minute), core.SubmitOptions{IdempotencyKey: "d"})
	if j != nil || existing {
		t.Fatal("a refused submit returned a job")
	}
	if !errors.Is(err, core.ErrQueueFull) {
		t.Fatalf("Submit = %v, want ErrQueueFull", err)
	}
	if ce := wantCode(t, err, core.CodeQueueFull); ce.RetryAfter <= 0 {
		t.Errorf("RetryAfter = %v", ce.RetryAfter)
	}
	if v := h.metric("switchyard_queue_depth", "queue", "q"); v != 2 {
		t.Fatalf("queue_depth after refusal = %v, want 2", v)
	}
	wantJobsTotal(t, h, map[core.Outcome]float64{})

	// The queued jobs still run, in order, and nothing else does.
	for _, next := range []*core.Job{b, c} {
		prev := fc.lastOffer(t)
		w.End(prev.JobID, prev.Gen, "", "", nil)
		if o := fc.lastOffer(t); o.JobID != next.ID {
			t.Fatalf("next offer is %s, want %s", o.JobID, next.ID)
		}
	}
	last := fc.lastOffer(t)
	w.End(last.JobID, last.Gen, "", "", nil)
	if n := len(fc.Offers()); n != 3 {
		t.Fatalf("offers = %d, want 3", n)
	}
	for _, j := range []*core.Job{a, b, c} {
		wantEnded(t, h, j, core.OutcomeCompleted, "")
	}
	// The refused key was never recorded.
	if _, existing, err := h.e.Submit(context.Background(), "q", env(time.Minute), core.SubmitOptions{IdempotencyKey: "d"}); err != nil || existing {
		t.Fatalf("Submit with the refused key = %v, existing=%v", err, existing)
	}
}

func TestQueueDepthLoweredByEnvelope(t *testing.T) {
	h := newHarness(t, nil)
	_, _ = h.attach("q", 1)
	h.submit("q", env(time.Minute)) // bound
	h.submit("q", env(time.Minute)) // queued: depth 1
	e := env(time.Minute)
	e.Limits.MaxQueueDepth = 1
	_, _, err := h.e.Submit(context.Background(), "q", e, core.SubmitOptions{})
	wantCode(t, err, core.CodeQueueFull)
	e.Limits.MaxQueueDepth = 2
	h.submit("q", e)
}

func TestQueueBytesCap(t *testing.T) {
	h := newHarness(t, func(c *core.Config) {
		c.Limits.MaxInputBytes = 16
		c.Limits.MaxQueueBytes = 32
	})
	w, fc := h.attach("q", 1)
	input := func(s string) *core.Envelope {
		e := env(time.Minute)
		e.Input = json.RawMessage(s)
		return e
	}
	fourteen := `"0123456789ab"`
	h.submit("q", input(fourteen))      // bound: not counted
	b := h.submit("q", input(fourteen)) // 14
	c := h.submit("q", input(fourteen)) // 28
	_, _, err := h.e.Submit(context.Background(), "q", input(fourteen), core.SubmitOptions{})
	if ce := wantCode(t, err, core.CodeQueueBytesFull); ce.RetryAfter <= 0 {
		t.Errorf("RetryAfter = %v", ce.RetryAfter)
	}
	if v := h.metric("switchyard_queue_depth", "queue", "q"); v != 2 {
		t.Fatalf("queue_depth = %v, want 2", v)
	}
	// The cap is on bytes, not depth: a 4-byte input still fits (32).
	d := h.submit("q", input(`1234`))
	_, _, err = h.e.Submit(context.Background(), "q", input(`1`), core.SubmitOptions{})
	wantCode(t, err, core.CodeQueueBytesFull)
	// The envelope may lower the bytes cap.
	w.End(fc.lastOffer(t).JobID, fc.lastOffer(t).Gen, "", "", nil) // b leaves the queue: 18 left
	low := input(`1`)
	low.Limits.MaxQueueBytes = 18
	_, _, err = h.e.Submit(context.Background(), "q", low, core.SubmitOptions{})
	wantCode(t, err, core.CodeQueueBytesFull)
	low.Limits.MaxQueueBytes = 19
	h.submit("q", low)
	for _, j := range []*core.Job{b, c, d} {
		if v := h.view(j.ID); v.State.Terminal() {
			t.Fatalf("job %s ended: %+v", j.ID, v)
		}
	}
	if o := fc.lastOffer(t); o.JobID != b.ID {
		t.Fatalf("offer after the first job ended = %s, want b", o.JobID)
	}
}

func TestQueuedJobExpires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, w, fc := oneWorker(t, nil)
		a, _ := h.running(w, fc)
		b := h.submit("q", env(50*time.Millisecond))
		wantEndsAt(t, h, b, 50*time.Millisecond, "its TTL", core.StateQueued, core.OutcomeExpired, core.CodeExpired)
		if v := h.metric("switchyard_queue_depth", "queue", "q"); v != 0 {
			t.Errorf("queue_depth = %v, want 0", v)
		}
		// The worker frees up: the expired job is never delivered.
		w.End(a.ID, fc.lastOffer(t).Gen, "", "", nil)
		time.Sleep(time.Second)
		synctest.Wait()
		if n := len(fc.offersFor(b.ID)); n != 0 {
			t.Fatalf("an expired job was offered %d times", n)
		}
		wantJobsTotal(t, h, map[core.Outcome]float64{core.OutcomeExpired: 1, core.OutcomeCompleted: 1})
	})
}

// TestQueuedJobExpiresRealClock is the same rule on the real clock.
func TestQueuedJobExpiresRealClock(t *testing.T) {
	h, w, fc := oneWorker(t, nil)
	a, _ := h.running(w, fc)
	b := h.submit("q", env(50*time.Millisecond))
	waitFor(t, 10*time.Second, "the queued job to expire", func() bool { return h.view(b.ID).State.Terminal() })
	wantEnded(t, h, b, core.OutcomeExpired, core.CodeExpired)
	w.End(a.ID, fc.lastOffer(t).Gen, "", "", nil)
	if n := len(fc.offersFor(b.ID)); n != 0 {
		t.Fatalf("an expired job was offered %d times", n)
	}
}

func TestQueueTimeIsSubtracted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, w, fc := oneWorker(t, nil)
		a, _ := h.running(w, fc)
		b := h.submit("q", env(time.Second))
		time.Sleep(100 * time.Millisecond)
		w.End(a.ID, fc.lastOffer(t).Gen, "", "", nil)
		o := fc.lastOffer(t)
		if o.JobID != b.ID {
			t.Fatalf("offer is for %s, want b", o.JobID)
		}
		// The fake clock does not move while nothing blocks: exactly 100ms
		// of queue residence came off the TTL.
		if o.TTL != 900*time.Millisecond {
			t.Fatalf("offer TTL = %v, want 900ms", o.TTL)
		}
	})
}

// TestQueueTimeIsSubtractedRealClock: on the real clock, the offer's TTL is
// at most the envelope's TTL less the time the job provably waited.
func TestQueueTimeIsSubtractedRealClock(t *testing.T) {
	h, w, fc := oneWorker(t, nil)
	a, _ := h.running(w, fc)
	const ttl = 30 * time.Second
	beforeSubmit := time.Now()
	b := h.submit("q", env(ttl))
	afterSubmit := time.Now()
	// Let time pass (the scenario, not synchronisation): ~100ms queued.
	<-time.After(100 * time.Millisecond)
	waited := time.Since(afterSubmit)
	w.End(a.ID, fc.lastOffer(t).Gen, "", "", nil)
	upper := time.Since(beforeSubmit)
	o := fc.lastOffer(t)
	if o.JobID != b.ID {
		t.Fatalf("offer is for %s, want b", o.JobID)
	}
	if o.TTL > ttl-waited || o.TTL > ttl-100*time.Millisecond {
		t.Fatalf("offer TTL = %v, want at most %v - %v", o.TTL, ttl, waited)
	}
	if o.TTL < ttl-upper {
		t.Fatalf("offer TTL = %v, less than %v - %v: more than the elapsed time was taken", o.TTL, ttl, upper)
	}
}

func TestConcurrencyCredits(t *testing.T) {
	h := newHarness(t, nil)
	w, fc := h.attach("q", 2)
	var jobs []*core.Job
	for range 5 {
		jobs = append(jobs, h.submit("q", env(time.Minute)))
	}
	outstanding := map[string]uint64{}
	seen := 0
	sync := func() {
		t.Helper()
		offers := fc.Offers()
		for _, o := range offers[seen:] {
			outstanding[o.JobID] = o.Gen
		}
		seen = len(offers)
		if len(outstanding) > 2 {
			t.Fatalf("%d offers outstanding for a worker with concurrency 2", len(outstanding))
		}
	}
	sync()
	if len(outstanding) != 2 {
		t.Fatalf("outstanding = %d, want 2", len(outstanding))
	}
	if v := h.metric("switchyard_queue_depth", "queue", "q"); v != 3 {
		t.Fatalf("queue_depth = %v, want 3", v)
	}
	// End jobs in submission order; each End frees exactly one credit.
	for i, j := range jobs {
		gen, ok := outstanding[j.ID]
		if !ok {
			t.Fatalf("job %d not outstanding when its turn came", i)
		}
		w.Accept(j.ID, gen)
		w.End(j.ID, gen, "", "", nil)
		delete(outstanding, j.ID)
		sync()
		if want := min(2, len(jobs)-i-1); len(outstanding) != want {
			t.Fatalf("after ending job %d: %d outstanding, want %d", i, len(outstanding), want)
		}
	}
	offers := fc.Offers()
	if len(offers) != 5 {
		t.Fatalf("offers = %d, want 5", len(offers))
	}
	for i, o := range offers {
		if o.JobID != jobs[i].ID {
			t.Fatalf("offer %d is %s, want %s (FIFO)", i, o.JobID, jobs[i].ID)
		}
	}
	wantJobsTotal(t, h, map[core.Outcome]float64{core.OutcomeCompleted: 5})
}

func TestLeastLoadedWorkerFirst(t *testing.T) {
	h := newHarness(t, nil)
	_, f1 := h.attach("q", 3)
	_, f2 := h.attach("q", 3)
	for range 4 {
		h.submit("q", env(time.Minute))
	}
	if n1, n2 := len(f1.Offers()), len(f2.Offers()); n1 != 2 || n2 != 2 {
		t.Fatalf("offers split %d/%d, want 2/2", n1, n2)
	}
}

func TestZoneScopedJobs(t *testing.T) {
	h := newHarness(t, func(c *core.Config) { c.Zone = "eu" })
	_, fc := h.attach("q", 2)
	e := env(time.Minute)
	e.Zone = "eu"
	j := h.submit("q", e)
	if len(fc.offersFor(j.ID)) != 1 {
		t.Fatal("a job scoped to this node's zone was not offered")
	}
	e.Zone = "us"
	_, _, err := h.e.Submit(context.Background(), "q", e, core.SubmitOptions{})
	wantCode(t, err, core.CodeNoCapableWorker)
}

func TestRejectGoesToAnotherWorker(t *testing.T) {
	h, w1, f1 := oneWorker(t, nil)
	w2, f2 := h.attach("q", 1)
	j := h.submit("q", env(time.Minute))
	o1 := f1.lastOffer(t)
	if o1.JobID != j.ID || o1.Gen != 1 || len(f2.Offers()) != 0 {
		t.Fatalf("first offer = %+v (worker 2 has %d)", o1, len(f2.Offers()))
	}
	w1.Reject(j.ID, o1.Gen, "unsupported model")
	o2 := f2.lastOffer(t)
	if o2.JobID != j.ID || o2.Gen != 2 || o2.TTL > o1.TTL {
		t.Fatalf("second offer = %+v (first %+v)", o2, o1)
	}
	if v := h.view(j.ID); v.HandledBy != w2.ID || v.Generation != 2 || v.State != core.StateOffered {
		t.Fatalf("view after reject = %+v", v)
	}
	if n := len(f1.offersFor(j.ID)); n != 1 {
		t.Fatalf("the rejecting worker got the job %d times", n)
	}
	// The second worker rejects too: nobody capable is left.
	w2.Reject(j.ID, o2.Gen, "no room")
	wantEnded(t, h, j, core.OutcomeFailed, core.CodeRejected)
	if n := len(f1.offersFor(j.ID)); n != 1 {
		t.Fatalf("the job went back to a worker that refused it (%d offers)", n)
	}
	if v := h.metric("switchyard_dispatch_rejects_total"); v != 2 {
		t.Errorf("rejects_total = %v, want 2", v)
	}
	// Rejecting is not dying: both workers are still registered and healthy.
	if len(f1.Closes())+len(f2.Closes()) != 0 {
		t.Fatal("a rejecting worker was closed")
	}
	if v := h.metric("switchyard_workers_connected"); v != 2 {
		t.Fatalf("workers_connected = %v, want 2", v)
	}
	k := h.submit("q", env(time.Minute))
	if len(f1.offersFor(k.ID))+len(f2.offersFor(k.ID)) != 1 {
		t.Fatal("a later job was not offered to the workers that rejected the earlier one")
	}
}

func TestRejectBySoleWorker(t *testing.T) {
	h, w, fc := oneWorker(t, nil)
	j := h.submit("q", env(time.Minute))
	w.Reject(j.ID, fc.lastOffer(t).Gen, "unsupported model")
	wantEnded(t, h, j, core.OutcomeFailed, core.CodeRejected)
	if d := h.view(j.ID).Detail; d == "" {
		t.Error("no detail on a rejected job")
	}
	if len(fc.Closes()) != 0 {
		t.Fatal("the rejecting worker was closed")
	}
	k := h.submit("q", env(time.Minute))
	if o := fc.lastOffer(t); o.JobID != k.ID {
		t.Fatalf("the next job was not offered to the worker that rejected the last one")
	}
	if n := len(fc.offersFor(j.ID)); n != 1 {
		t.Fatalf("the rejected job was offered %d times", n)
	}
}

func TestRejectAfterAcceptIgnored(t *testing.T) {
	h, w, fc := oneWorker(t, nil)
	_, f2 := h.attach("q", 1)
	j, gen := h.running(w, fc)
	w.Reject(j.ID, gen, "changed my mind")
	if v := h.view(j.ID); v.State != core.StateRunning || v.HandledBy != w.ID {
		t.Fatalf("a reject after accept moved the job: %+v", v)
	}
	if len(f2.Offers()) != 0 {
		t.Fatal("a reject after accept re-offered the job")
	}
}

// TestRejectWhileOtherWorkerBusy: the job waits for the busy capable worker
// rather than failing, and is offered to it once it frees up.
func TestRejectWhileOtherWorkerBusy(t *testing.T) {
	h, w1, f1 := oneWorker(t, nil)
	a, _ := h.running(w1, f1)
	w2, f2 := h.attach("q", 1)
	j := h.submit("q", env(time.Minute))
	w2.Reject(j.ID, f2.lastOffer(t).Gen, "no")
	if v := h.view(j.ID); v.State != core.StateQueued {
		t.Fatalf("state = %s, want queued behind the busy capable worker", v.State)
	}
	w1.End(a.ID, f1.lastOffer(t).Gen, "", "", nil)
	if o := f1.lastOffer(t); o.JobID != j.ID || o.Gen != 2 {
		t.Fatalf("offer = %+v, want j gen 2", o)
	}
	if n := len(f2.offersFor(j.ID)); n != 1 {
		t.Fatalf("rejecting worker got j %d times", n)
	}
}
