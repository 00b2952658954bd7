package core_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/core"
)

// smallWindow paces jobs by 4 outputs or 1000 bytes.
func smallWindow(c *core.Config) { c.OutputWindowEvents, c.OutputWindowBytes = 4, 1000 }

// submitStreamed submits a job as an SSE POST or a gRPC Submit would: its
// owner streams pace it.
func (h *harness) submitStreamed(queue string) *core.Job {
	h.t.Helper()
	j, _, err := h.e.Submit(context.Background(), queue, env(time.Minute), core.SubmitOptions{Streamed: true})
	if err != nil {
		h.t.Fatalf("Submit: %v", err)
	}
	return j
}

func output(i int) []byte { return []byte(fmt.Sprintf(`{"i":%d}`, i)) } // 7 bytes for i < 10

// A streamed job's worker gets its window with the offer and no more
// until the job's reader takes some: with the window used, the job waits
// for its reader (its view says so, the host counts it); once an owner
// stream wrote half the window, the worker is granted that much more,
// cumulatively, and the wait is over.
func TestCreditPacesAStreamedJobByItsReader(t *testing.T) {
	h, w, fc := oneWorker(t, smallWindow)
	j := h.submitStreamed("q")
	o := fc.lastOffer(t)
	if o.Credit != (core.OutputCredit{Events: 4, Bytes: 1000}) {
		t.Fatalf("offer credit = %+v, want the window {4 1000}", o.Credit)
	}
	for i := range 4 {
		w.Output(j.ID, o.Gen, output(i))
	}
	if v := h.view(j.ID); !v.WaitingForReader || v.Outputs != 4 {
		t.Fatalf("view after the window = %+v, want 4 outputs, waiting for its reader", v)
	}
	if got := h.metric("switchyard_worker_credit_waiting"); got != 1 {
		t.Errorf("credit_waiting = %v, want 1", got)
	}
	if got := fc.Credits(); len(got) != 0 {
		t.Fatalf("credits before the reader took anything: %+v", got)
	}
	if e, b := h.metric("switchyard_output_unread_events"), h.metric("switchyard_output_unread_bytes"); e != 4 || b != 28 {
		t.Errorf("unread = %v events, %v bytes; want 4, 28", e, b)
	}

	// The owner stream wrote accepted (1) and the first output (2): one
	// output taken, less than half the window: no grant yet.
	h.e.StreamSent(j.ID, 2)
	if got := fc.Credits(); len(got) != 0 {
		t.Fatalf("a grant for one output taken (half the window is 2): %+v", got)
	}
	time.Sleep(10 * time.Millisecond)
	h.e.StreamSent(j.ID, 3)
	want := core.OutputCredit{Events: 2 + 4, Bytes: 14 + 1000}
	if got := fc.Credits(); len(got) != 1 || got[0].JobID != j.ID || got[0].Gen != o.Gen || got[0].Credit != want {
		t.Fatalf("credits = %+v, want one of %+v for %s", got, want, j.ID)
	}
	if v := h.view(j.ID); v.WaitingForReader {
		t.Fatal("still waiting for its reader after the grant")
	}
	if got := h.metric("switchyard_worker_credit_waiting"); got != 0 {
		t.Errorf("credit_waiting = %v after the grant, want 0", got)
	}
	if got := h.metric("switchyard_worker_credit_wait_seconds_total"); got < 0.01 {
		t.Errorf("credit_wait_seconds_total = %v, want the 10ms waited", got)
	}
	if e, b := h.metric("switchyard_output_unread_events"), h.metric("switchyard_output_unread_bytes"); e != 2 || b != 14 {
		t.Errorf("unread = %v events, %v bytes after two were taken; want 2, 14", e, b)
	}
	// A position already reported, or older, changes nothing.
	h.e.StreamSent(j.ID, 3)
	h.e.StreamSent(j.ID, 2)
	if got := fc.Credits(); len(got) != 1 {
		t.Fatalf("credits after old positions = %+v, want still one", got)
	}
	w.Output(j.ID, o.Gen, output(4))
	w.Output(j.ID, o.Gen, output(5))
	w.End(j.ID, o.Gen, "", "", nil)
	wantEnded(t, h, j, core.OutcomeCompleted, "")
	if v := h.view(j.ID); v.Outputs != 6 || v.WaitingForReader {
		t.Fatalf("ended view = %+v, want 6 outputs, not waiting", v)
	}
	// An ended job's unread output is the history's, for late readers.
	if e, b := h.metric("switchyard_output_unread_events"), h.metric("switchyard_output_unread_bytes"); e != 0 || b != 0 {
		t.Errorf("unread = %v events, %v bytes after the end; want 0", e, b)
	}
}

// A job submitted for later has no reader while it runs: an output is
// taken once the ingress has it, so its worker is granted more as its
// output arrives and never waits for anyone.
func TestCreditJobForLaterIsTakenOnArrival(t *testing.T) {
	h, w, fc := oneWorker(t, smallWindow)
	j := h.submit("q", env(time.Minute))
	o := fc.lastOffer(t)
	for i := range 10 {
		w.Output(j.ID, o.Gen, output(i))
	}
	got := fc.Credits()
	if len(got) == 0 || got[len(got)-1].Credit.Events != 10+4 {
		t.Fatalf("credits = %+v, want the last granting 14 outputs (10 taken + the window)", got)
	}
	if len(got) != 5 {
		t.Errorf("%d grants for 10 outputs, want 5 (one per half window)", len(got))
	}
	if h.view(j.ID).WaitingForReader || h.metric("switchyard_worker_credit_waiting") != 0 {
		t.Error("a job for later waits for a reader")
	}
}

// A worker that sends past its credit breaks the protocol: that output is
// not relayed, its job fails credit_exceeded and is cancelled on the
// worker with that reason; the worker's other job goes on.
func TestCreditExceededFailsTheJobOnly(t *testing.T) {
	h := newHarness(t, func(c *core.Config) { c.OutputWindowEvents, c.OutputWindowBytes = 2, 1000 })
	w, fc := h.attach("q", 2)
	bad := h.submitStreamed("q")
	ob := fc.lastOffer(t)
	good := h.submitStreamed("q")
	og := fc.lastOffer(t)
	for i := range 3 {
		w.Output(bad.ID, ob.Gen, output(i))
	}
	wantEnded(t, h, bad, core.OutcomeFailed, core.CodeCreditExceeded)
	if v := h.view(bad.ID); v.Outputs != 2 {
		t.Errorf("outputs relayed = %d, want the 2 within credit", v.Outputs)
	}
	if c := fc.Cancels(); len(c) != 1 || c[0].JobID != bad.ID || c[0].Reason != core.CodeCreditExceeded {
		t.Fatalf("cancels = %+v, want one for %s with reason credit_exceeded", c, bad.ID)
	}
	if len(fc.Closes()) != 0 {
		t.Fatal("the session was closed: only the job should fail")
	}
	w.End(bad.ID, ob.Gen, core.CodeCancelled, "", nil)
	w.Output(good.ID, og.Gen, output(0))
	w.End(good.ID, og.Gen, "", "", nil)
	wantEnded(t, h, good, core.OutcomeCompleted, "")
}

// One output may end past the byte window, so an output larger than the
// whole window still goes (alone); the next waits for credit.
func TestCreditBytesLetOneOutputPast(t *testing.T) {
	h, w, fc := oneWorker(t, func(c *core.Config) { c.OutputWindowEvents, c.OutputWindowBytes = 10, 100 })
	j := h.submitStreamed("q")
	o := fc.lastOffer(t)
	big := json.RawMessage(`"` + strings.Repeat("x", 500) + `"`)
	if wait := w.OutputOrWait(j.ID, o.Gen, big); wait != nil {
		t.Fatal("an output larger than the window waits with nothing sent")
	}
	wait := w.OutputOrWait(j.ID, o.Gen, output(1))
	if wait == nil {
		t.Fatal("an output past the byte window went")
	}
	h.e.StreamSent(j.ID, 2) // the big output taken
	select {
	case <-wait:
	case <-time.After(5 * time.Second):
		t.Fatal("the grant did not wake the wait")
	}
	if wait := w.OutputOrWait(j.ID, o.Gen, output(1)); wait != nil {
		t.Fatal("the output still waits after the grant")
	}
	if v := h.view(j.ID); v.Outputs != 2 {
		t.Fatalf("outputs = %d, want 2", v.Outputs)
	}
}

// A wait for credit ends when the job is cancelled, not at the next grant.
func TestCreditWaitEndsWithTheJob(t *testing.T) {
	h, w, fc := oneWorker(t, func(c *core.Config) { c.OutputWindowEvents, c.OutputWindowBytes = 1, 1000 })
	j := h.submitStreamed("q")
	o := fc.lastOffer(t)
	if w.OutputOrWait(j.ID, o.Gen, output(0)) != nil {
		t.Fatal("the first output waits")
	}
	wait := w.OutputOrWait(j.ID, o.Gen, output(1))
	if wait == nil {
		t.Fatal("the second output of a window of one went")
	}
	if _, err := h.e.Cancel(j.ID, "test"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wait:
	case <-time.After(5 * time.Second):
		t.Fatal("the cancel did not end the wait")
	}
	if w.OutputOrWait(j.ID, o.Gen, output(1)) != nil {
		t.Fatal("a cancelled job's output waits")
	}
	if got := h.metric("switchyard_worker_credit_waiting"); got != 0 {
		t.Errorf("credit_waiting = %v after the cancel, want 0", got)
	}
}

// A job that goes back to its queue (its worker left before any output)
// is paced afresh: the new binding's offer carries the window again.
func TestCreditStartsAgainWithANewBinding(t *testing.T) {
	h, w1, fc1 := oneWorker(t, smallWindow)
	j := h.submitStreamed("q")
	o1 := fc1.lastOffer(t)
	w1.Accept(j.ID, o1.Gen)
	w2, fc2 := h.attach("q", 1)
	w1.Detach(context.Background())
	o2 := fc2.lastOffer(t)
	if o2.Gen == o1.Gen || o2.Credit != (core.OutputCredit{Events: 4, Bytes: 1000}) {
		t.Fatalf("second offer = gen %d credit %+v, want a new generation with the window", o2.Gen, o2.Credit)
	}
	for i := range 4 {
		w2.Output(j.ID, o2.Gen, output(i))
	}
	if !h.view(j.ID).WaitingForReader {
		t.Fatal("the new binding's window is not the window")
	}
}
