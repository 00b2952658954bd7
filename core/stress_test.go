package core_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard/switchyard/core"
)

// chanConn hands offers to a worker goroutine and checks, at every offer,
// that the engine never has more jobs outstanding on it than its credits.
type chanConn struct {
	offers      chan core.Offer
	concurrency int64
	outstanding atomic.Int64
	over        atomic.Int64 // offers that exceeded the credits
	cancels     atomic.Int64
	closed      atomic.Int64
}

func (c *chanConn) SendOffer(o core.Offer) error {
	if c.outstanding.Add(1) > c.concurrency {
		c.over.Add(1)
	}
	select {
	case c.offers <- o:
		return nil
	default:
		return fmt.Errorf("offer buffer full")
	}
}

func (c *chanConn) SendCancel(string, uint64, core.Code) error         { c.cancels.Add(1); return nil }
func (c *chanConn) SendCredit(string, uint64, core.OutputCredit) error { return nil }
func (c *chanConn) Close(error)                                        { c.closed.Add(1) }

// TestConcurrentSubmitRunCancel runs submitters, cancellers and workers on
// their own goroutines (under -race) and checks the invariants that must
// hold whatever the interleaving: every job ends exactly once, the outcome
// counters add up, credits are never exceeded and no job is offered twice.
func TestConcurrentSubmitRunCancel(t *testing.T) {
	// The harness's generous dispatch timeouts keep a worker goroutine
	// descheduled under -race from looking like a stall.
	h := newHarness(t, nil)
	const (
		workers     = 4
		concurrency = 3
		submitters  = 6
		perSubmit   = 40
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var conns []*chanConn
	var ws []*core.Worker
	var offered sync.Map // job id → number of offers
	for i := range workers {
		c := &chanConn{offers: make(chan core.Offer, 1024), concurrency: concurrency}
		w, err := h.e.AttachWorker(context.Background(), core.WorkerSpec{Queue: "q", Name: fmt.Sprint("w", i), Concurrency: concurrency}, c)
		if err != nil {
			t.Fatal(err)
		}
		conns, ws = append(conns, c), append(ws, w)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				case o := <-c.offers:
					n, _ := offered.LoadOrStore(o.JobID, new(atomic.Int64))
					n.(*atomic.Int64).Add(1)
					w.Accept(o.JobID, o.Gen)
					w.Output(o.JobID, o.Gen, []byte(`{"chunk":1}`))
					w.Output(o.JobID, o.Gen, []byte(`{"chunk":2}`))
					c.outstanding.Add(-1) // before End: End may offer the next job at once
					w.End(o.JobID, o.Gen, "", "", nil)
				}
			}
		}()
	}

	var mu sync.Mutex
	var jobs []*core.Job
	var subWG sync.WaitGroup
	for s := range submitters {
		subWG.Add(1)
		go func() {
			defer subWG.Done()
			for i := range perSubmit {
				j, _, err := h.e.Submit(context.Background(), "q", env(time.Minute), core.SubmitOptions{})
				if err != nil {
					t.Errorf("Submit: %v", err)
					return
				}
				mu.Lock()
				jobs = append(jobs, j)
				mu.Unlock()
				if (s+i)%5 == 0 {
					if _, err := h.e.Cancel(j.ID, "changed my mind"); err != nil {
						t.Errorf("Cancel: %v", err)
					}
				}
			}
		}()
	}
	subWG.Wait()
	if t.Failed() {
		close(stop)
		wg.Wait()
		return
	}
	waitFor(t, 30*time.Second, "every job to end", func() bool {
		for _, j := range jobs {
			if v, _ := h.e.View(j.ID); !v.State.Terminal() {
				return false
			}
		}
		return true
	})
	close(stop)
	wg.Wait()

	total := 0.0
	for _, v := range h.jobsTotal() {
		total += v
	}
	if total != submitters*perSubmit {
		t.Errorf("switchyard_jobs_total sums to %v, want %d", total, submitters*perSubmit)
	}
	completed, cancelled := 0, 0
	for _, j := range jobs {
		_, data := terminalEvent(t, j)
		switch data["outcome"] {
		case "completed":
			completed++
			if got := fmt.Sprint(kinds(events(t, j))); got != "[accepted output output done]" {
				t.Errorf("completed job %s events = %s", j.ID, got)
			}
		case "cancelled":
			cancelled++
		default:
			t.Errorf("job %s ended %v", j.ID, data)
		}
		if n, ok := offered.Load(j.ID); ok && n.(*atomic.Int64).Load() != 1 {
			t.Errorf("job %s was offered %d times", j.ID, n.(*atomic.Int64).Load())
		}
	}
	if cancelled == 0 || completed == 0 {
		t.Errorf("completed %d, cancelled %d: the test did not exercise both paths", completed, cancelled)
	}
	for i, c := range conns {
		if n := c.over.Load(); n != 0 {
			t.Errorf("worker %d got %d offers beyond its %d credits", i, n, concurrency)
		}
		if n := c.closed.Load(); n != 0 {
			t.Errorf("worker %d was closed %d times", i, n)
		}
		ws[i].Detach(context.Background())
	}
	if v := h.metric("switchyard_workers_connected"); v != 0 {
		t.Errorf("workers_connected = %v after every worker detached", v)
	}
}
