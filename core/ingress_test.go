package core_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/switchyard/switchyard/core"
)

func TestSubmitWithoutCapableWorker(t *testing.T) {
	h := newHarness(t, func(c *core.Config) { c.Zone = "" })
	ctx := context.Background()

	check := func(t *testing.T, queue string, e *core.Envelope) {
		t.Helper()
		j, existing, err := h.e.Submit(ctx, queue, e, core.SubmitOptions{IdempotencyKey: "key-" + queue})
		if j != nil || existing {
			t.Fatalf("Submit returned a job (%v, existing=%v) with its error", j, existing)
		}
		if !errors.Is(err, core.ErrNoCapableWorker) {
			t.Fatalf("Submit = %v, want ErrNoCapableWorker", err)
		}
		if ce := wantCode(t, err, core.CodeNoCapableWorker); ce.RetryAfter <= 0 {
			t.Errorf("RetryAfter = %v, want > 0", ce.RetryAfter)
		}
	}

	t.Run("no worker at all", func(t *testing.T) { check(t, "empty", env(time.Minute)) })

	_, fc := h.attach("q", 4, "model=a", "model=b", "gpu=yes")
	_, other := h.attach("elsewhere", 4, "model=c")
	t.Run("worker lacks the capability", func(t *testing.T) {
		e := env(time.Minute)
		e.Capabilities = map[string]string{"model": "c"}
		check(t, "q", e)
	})
	t.Run("worker lacks one of two", func(t *testing.T) {
		e := env(time.Minute)
		e.Capabilities = map[string]string{"model": "a", "gpu": "no"}
		check(t, "q", e)
	})
	t.Run("zone the node is not in", func(t *testing.T) {
		e := env(time.Minute)
		e.Zone = "eu"
		check(t, "q", e)
	})
	if n := len(fc.Offers()) + len(other.Offers()); n != 0 {
		t.Fatalf("refused submissions produced %d offers", n)
	}
	wantJobsTotal(t, h, map[core.Outcome]float64{})
	if v := h.metric("switchyard_queue_depth", "queue", "q"); v > 0 {
		t.Fatalf("queue_depth{q} = %v after refusals", v)
	}
	// Nothing was enqueued: a worker that can run the refused jobs arrives
	// and gets nothing, and the refused idempotency keys are still free.
	_, late := h.attach("q", 4, "model=c", "gpu=no")
	_, lateEmpty := h.attach("empty", 4)
	if n := len(late.Offers()) + len(lateEmpty.Offers()); n != 0 {
		t.Fatalf("a late capable worker got %d offers of refused jobs", n)
	}
	j, existing, err := h.e.Submit(ctx, "empty", env(time.Minute), core.SubmitOptions{IdempotencyKey: "key-empty"})
	if err != nil || existing {
		t.Fatalf("Submit with a key used only by a refused submission = %v, existing=%v", err, existing)
	}
	if len(lateEmpty.offersFor(j.ID)) != 1 {
		t.Fatal("the accepted job was not offered")
	}
	// A multi-valued capability satisfies either value.
	e := env(time.Minute)
	e.Capabilities = map[string]string{"model": "b", "gpu": "yes"}
	j = h.submit("q", e)
	if len(fc.offersFor(j.ID)) != 1 {
		t.Fatal("model=b job not offered to the worker declaring model=a and model=b")
	}
}

func TestSubmitRefusesBadRequests(t *testing.T) {
	h, _, fc := oneWorker(t, nil)
	ctx := context.Background()
	_, _, err := h.e.Submit(ctx, "bad/queue", env(time.Minute), core.SubmitOptions{})
	wantCode(t, err, core.CodeInvalidQueueName)
	_, _, err = h.e.Submit(ctx, "q", env(time.Hour), core.SubmitOptions{})
	wantCode(t, err, core.CodeTTLOutOfRange)
	big := env(time.Minute)
	big.Limits.MaxInputBytes = 5
	_, _, err = h.e.Submit(ctx, "q", big, core.SubmitOptions{})
	wantCode(t, err, core.CodeInputTooLarge)
	if len(fc.Offers()) != 0 {
		t.Fatalf("refused jobs were offered: %v", fc.Offers())
	}
	wantJobsTotal(t, h, map[core.Outcome]float64{})
}

func TestSubmitRunComplete(t *testing.T) {
	h := newHarness(t, nil)
	w, fc := h.attach("q", 1, "model=demo")
	e := env(30 * time.Second)
	e.Capabilities = map[string]string{"model": "demo"}
	e.Options = json.RawMessage(`{"temp":0.5}`)
	e.Limits.MaxOutputBytes = 1000
	before := time.Now()
	j := h.submit("q", e)

	if !strings.HasPrefix(j.ID, "j_") || j.Queue != "q" || j.Env != e || j.Limits.TTL != 30*time.Second {
		t.Fatalf("job = %+v", j)
	}
	if j.Created.Before(before) || j.Created.After(time.Now()) {
		t.Errorf("Created = %v, not during Submit", j.Created)
	}
	got, err := h.e.Job(j.ID)
	if err != nil || got != j {
		t.Fatalf("Job(%s) = %p, %v; want the submitted job", j.ID, got, err)
	}
	offers := fc.Offers()
	if len(offers) != 1 {
		t.Fatalf("offers = %d, want 1", len(offers))
	}
	o := offers[0]
	if o.JobID != j.ID || o.Gen != 1 || o.Queue != "q" || string(o.Input) != string(e.Input) ||
		string(o.Options) != `{"temp":0.5}` || fmt.Sprint(o.Capabilities) != "[model=demo]" || o.MaxOutputBytes != 1000 {
		t.Fatalf("offer = %+v", o)
	}
	if o.TTL <= 0 || o.TTL > e.TTL {
		t.Fatalf("offer TTL = %v, want in (0, %v]", o.TTL, e.TTL)
	}
	v := h.view(j.ID)
	if v.State != core.StateOffered || v.Generation != 1 || v.HandledBy != w.ID || v.WorkerName != w.Name || v.Outcome != "" {
		t.Fatalf("view after offer = %+v", v)
	}
	if v.Remaining <= 0 || v.Remaining > 30*time.Second || v.TTL != 30*time.Second {
		t.Errorf("view TTL %v remaining %v", v.TTL, v.Remaining)
	}
	if c := h.metric("switchyard_dispatch_colocated_deliveries_total"); c != 1 {
		t.Errorf("colocated_deliveries_total = %v, want 1 (single node: no network)", c)
	}

	w.Accept(j.ID, o.Gen)
	if v := h.view(j.ID); v.State != core.StateRunning {
		t.Fatalf("state after Accept = %s", v.State)
	}
	chunks := []string{`{"token":"a"}`, "{ \"token\" :\n \"b\" }", `"c"`, `[1, 2]`}
	for _, c := range chunks {
		w.Output(j.ID, o.Gen, []byte(c))
	}
	w.End(j.ID, o.Gen, "", "", json.RawMessage(`{"tokens":4}`))

	evs := events(t, j)
	if got := fmt.Sprint(kinds(evs)); got != "[accepted output output output output done]" {
		t.Fatalf("events = %s", got)
	}
	var acc map[string]any
	if err := json.Unmarshal(evs[0].Data, &acc); err != nil || acc["queue"] != "q" || acc["ttl_ms"] != float64(30000) {
		t.Errorf("accepted event = %s", evs[0].Data)
	}
	wantData := []string{`{"data":{"token":"a"}}`, `{"data":{"token":"b"}}`, `{"data":"c"}`, `{"data":[1,2]}`}
	for i, want := range wantData {
		ev := evs[i+1]
		if string(ev.Data) != want || ev.Gen != 1 || ev.Seq != uint64(i+2) {
			t.Errorf("output %d = seq %d gen %d %s, want %s", i, ev.Seq, ev.Gen, ev.Data, want)
		}
	}
	_, done := terminalEvent(t, j)
	if done["outcome"] != "completed" || fmt.Sprint(done["result"]) != "map[tokens:4]" {
		t.Errorf("done event = %v", done)
	}
	v = h.view(j.ID)
	if v.State != core.StateCompleted || v.Outcome != core.OutcomeCompleted || v.Code != "" || v.Outputs != 4 || v.LastSeq != 6 || v.Ended.IsZero() || v.Remaining != 0 {
		t.Errorf("final view = %+v", v)
	}
	wantJobsTotal(t, h, map[core.Outcome]float64{core.OutcomeCompleted: 1})
	if n := h.metric("switchyard_time_to_first_output_seconds"); n != 1 {
		t.Errorf("time_to_first_output observations = %v, want 1", n)
	}

	// Late messages for the ended job change nothing.
	w.Output(j.ID, o.Gen, []byte(`"late"`))
	w.End(j.ID, o.Gen, "", "", nil)
	w.Accept(j.ID, o.Gen)
	if h := j.History.Head(); h != 6 {
		t.Errorf("history head after late messages = %d, want 6", h)
	}
	wantJobsTotal(t, h, map[core.Outcome]float64{core.OutcomeCompleted: 1})
	if _, err := h.e.Cancel(j.ID, "too late"); err != nil {
		t.Fatal(err)
	}
	if v := h.view(j.ID); v.Outcome != core.OutcomeCompleted {
		t.Errorf("Cancel changed an ended job: %+v", v)
	}
	if len(fc.Cancels()) != 0 {
		t.Errorf("the worker was told to cancel an ended job: %v", fc.Cancels())
	}
}

func TestEndWithoutResultAndBeforeAccept(t *testing.T) {
	h, w, fc := oneWorker(t, nil)
	j := h.submit("q", env(time.Minute))
	// An End before any Accept is allowed (offered → completed).
	w.End(j.ID, fc.lastOffer(t).Gen, "", "", nil)
	_, done := terminalEvent(t, j)
	if _, ok := done["result"]; ok || done["outcome"] != "completed" {
		t.Errorf("done event = %v, want no result", done)
	}
	wantEnded(t, h, j, core.OutcomeCompleted, "")
}

func TestEndCodes(t *testing.T) {
	tests := []struct {
		name    string
		code    core.Code
		result  json.RawMessage
		outcome core.Outcome
		want    core.Code
	}{
		{"worker failure code kept", "model_oom", nil, core.OutcomeFailed, "model_oom"},
		{"code with a space becomes worker_error", "out of memory", nil, core.OutcomeFailed, core.CodeWorkerError},
		{"long code becomes worker_error", core.Code(strings.Repeat("x", 65)), nil, core.OutcomeFailed, core.CodeWorkerError},
		{"worker says cancelled", core.CodeCancelled, nil, core.OutcomeCancelled, core.CodeCancelled},
		{"worker says expired", core.CodeExpired, nil, core.OutcomeExpired, core.CodeExpired},
		{"result not JSON", "", json.RawMessage(`{nope`), core.OutcomeFailed, core.CodeBadOutput},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, w, fc := oneWorker(t, nil)
			j, gen := h.running(w, fc)
			w.End(j.ID, gen, tt.code, "detail", tt.result)
			wantEnded(t, h, j, tt.outcome, tt.want)
			wantJobsTotal(t, h, map[core.Outcome]float64{tt.outcome: 1})
			if len(fc.Cancels()) != 0 {
				t.Errorf("a job the worker ended itself was cancelled on it: %v", fc.Cancels())
			}
		})
	}
}

func TestIdempotencyKey(t *testing.T) {
	h, _, fc := oneWorker(t, nil)
	_, _ = h.attach("other", 1)
	ctx := context.Background()
	opts := core.SubmitOptions{IdempotencyKey: "retry-1"}
	j1, existing, err := h.e.Submit(ctx, "q", env(time.Minute), opts)
	if err != nil || existing {
		t.Fatalf("first Submit = %v, existing=%v", err, existing)
	}
	j2, existing, err := h.e.Submit(ctx, "q", env(time.Minute), opts)
	if err != nil || !existing || j2 != j1 {
		t.Fatalf("retried Submit = %v (%p vs %p), existing=%v; want the same job", err, j2, j1, existing)
	}
	if n := len(fc.Offers()); n != 1 {
		t.Fatalf("the retry produced another offer: %d offers", n)
	}
	j3, existing, err := h.e.Submit(ctx, "other", env(time.Minute), opts)
	if j3 != nil || existing {
		t.Fatalf("Submit on another queue returned a job")
	}
	if ce := wantCode(t, err, core.CodeIdempotencyReuse); ce.Field != "Idempotency-Key" {
		t.Errorf("Field = %q", ce.Field)
	}
	// The key still maps to the first job once it has ended (until retention).
	if _, err := h.e.Cancel(j1.ID, "x"); err != nil {
		t.Fatal(err)
	}
	j4, existing, err := h.e.Submit(ctx, "q", env(time.Minute), opts)
	if err != nil || !existing || j4 != j1 {
		t.Fatalf("retry after the job ended = %v, existing=%v", err, existing)
	}
	// A different key makes a different job.
	j5, existing, err := h.e.Submit(ctx, "q", env(time.Minute), core.SubmitOptions{IdempotencyKey: "retry-2"})
	if err != nil || existing || j5 == j1 {
		t.Fatalf("Submit with another key = %v, existing=%v", err, existing)
	}
}

func TestCancelRunningJob(t *testing.T) {
	h, w, fc := oneWorker(t, nil)
	a := h.submit("q", env(time.Minute))
	b := h.submit("q", env(time.Minute))
	oa := fc.lastOffer(t)
	if oa.JobID != a.ID {
		t.Fatalf("first offer is %s, want %s", oa.JobID, a.ID)
	}
	w.Accept(a.ID, oa.Gen)
	w.Output(a.ID, oa.Gen, []byte(`1`))

	v, err := h.e.Cancel(a.ID, "the user pressed stop")
	if err != nil {
		t.Fatal(err)
	}
	if v.State != core.StateCancelled || v.Outcome != core.OutcomeCancelled || v.Code != core.CodeCancelled || v.Detail != "the user pressed stop" {
		t.Fatalf("Cancel view = %+v", v)
	}
	wantEnded(t, h, a, core.OutcomeCancelled, core.CodeCancelled)
	cancels := fc.Cancels()
	if len(cancels) != 1 || cancels[0] != (cancelMsg{a.ID, oa.Gen, core.CodeCancelled}) {
		t.Fatalf("cancels = %+v, want one for %s gen %d", cancels, a.ID, oa.Gen)
	}
	// The credit is held until the worker acknowledges: b still waits.
	if len(fc.offersFor(b.ID)) != 0 {
		t.Fatal("b was offered before the worker acknowledged a's cancel")
	}
	if v := h.view(b.ID); v.State != core.StateQueued {
		t.Fatalf("b state = %s", v.State)
	}
	// Output after the cancel is dropped.
	head := a.History.Head()
	w.Output(a.ID, oa.Gen, []byte(`2`))
	if a.History.Head() != head {
		t.Fatal("output after cancel was appended")
	}
	// The worker's End (cancelled) releases the credit.
	w.End(a.ID, oa.Gen, core.CodeCancelled, "stopped", nil)
	if len(fc.offersFor(b.ID)) != 1 {
		t.Fatal("b was not offered after the worker acknowledged a's cancel")
	}
	if n := len(fc.offersFor(a.ID)); n != 1 {
		t.Fatalf("a was offered %d times, want 1 (never redelivered)", n)
	}
	// Cancelling again changes nothing.
	if _, err := h.e.Cancel(a.ID, "again"); err != nil {
		t.Fatal(err)
	}
	if len(fc.Cancels()) != 1 {
		t.Fatalf("a second Cancel told the worker again: %v", fc.Cancels())
	}
	wantJobsTotal(t, h, map[core.Outcome]float64{core.OutcomeCancelled: 1})
	if d := h.view(a.ID).Detail; d != "the user pressed stop" {
		t.Errorf("detail changed to %q", d)
	}
}

// TestCancelOfferedJobThenReject: a job cancelled before the worker accepted
// it is told to the worker; the worker's reject then just frees the credit
// (the job is not re-offered anywhere).
func TestCancelOfferedJobThenReject(t *testing.T) {
	h, w, fc := oneWorker(t, nil)
	_, f2 := h.attach("q", 1)
	a := h.submit("q", env(time.Minute))
	oa := fc.lastOffer(t)
	if _, err := h.e.Cancel(a.ID, "stop"); err != nil {
		t.Fatal(err)
	}
	fc.wantCancels(t, cancelMsg{a.ID, oa.Gen, core.CodeCancelled})
	w.Reject(a.ID, oa.Gen, "whatever")
	wantEnded(t, h, a, core.OutcomeCancelled, core.CodeCancelled)
	if len(f2.Offers()) != 0 || len(fc.offersFor(a.ID)) != 1 {
		t.Fatal("a cancelled job was offered again")
	}
	if v := h.metric("switchyard_dispatch_rejects_total"); v != 0 {
		t.Errorf("rejects_total = %v: a reject of a cancelled job is not a reject", v)
	}
	// The credit is free again: the next job goes to the first worker.
	b := h.submit("q", env(time.Minute))
	if len(fc.offersFor(b.ID)) != 1 {
		t.Fatal("the credit held for the cancelled job was not released by the reject")
	}
}

func TestCancelQueuedJob(t *testing.T) {
	h, w, fc := oneWorker(t, nil)
	a := h.submit("q", env(time.Minute))
	b := h.submit("q", env(time.Minute))
	if v := h.metric("switchyard_queue_depth", "queue", "q"); v != 1 {
		t.Fatalf("queue_depth = %v, want 1", v)
	}
	if _, err := h.e.Cancel(b.ID, "nope"); err != nil {
		t.Fatal(err)
	}
	wantEnded(t, h, b, core.OutcomeCancelled, core.CodeCancelled)
	if v := h.metric("switchyard_queue_depth", "queue", "q"); v != 0 {
		t.Fatalf("queue_depth after cancel = %v, want 0", v)
	}
	gen := fc.lastOffer(t).Gen
	w.End(a.ID, gen, "", "", nil)
	if n := len(fc.offersFor(b.ID)); n != 0 {
		t.Fatalf("a cancelled queued job was offered %d times", n)
	}
	if len(fc.Cancels()) != 0 {
		t.Fatalf("the worker was told to cancel a job it never had: %v", fc.Cancels())
	}
}

func TestCancelUnacknowledgedDropsWorker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, shortDispatch) // cancel acknowledgement: 200ms
		w, fc := h.attach("q", 1)
		a, _ := h.running(w, fc)
		if _, err := h.e.Cancel(a.ID, "stop"); err != nil {
			t.Fatal(err)
		}
		fc.wantStalledAt(t, 200*time.Millisecond, "cancel")
		if v := h.metric("switchyard_dispatch_stalls_total"); v != 1 {
			t.Errorf("stalls_total = %v", v)
		}
		w.Detach(context.Background())
		wantEnded(t, h, a, core.OutcomeCancelled, core.CodeCancelled)
		wantJobsTotal(t, h, map[core.Outcome]float64{core.OutcomeCancelled: 1})
	})
}

// submitStreamed submits a job as an SSE POST or a gRPC Submit does: its
// submitter streams it.
func submitStreamed(h *harness, queue string, e *core.Envelope) *core.Job {
	h.t.Helper()
	j, _, err := h.e.Submit(context.Background(), queue, e, core.SubmitOptions{Streamed: true})
	if err != nil {
		h.t.Fatalf("Submit: %v", err)
	}
	return j
}

// ownerGone submits a streamed job of envelope e that w, whose connection
// is fc, accepts, then opens its owner stream and closes it: clientLeft
// says the client left (else the node ended the stream).
func ownerGone(h *harness, w *core.Worker, fc *fakeConn, e *core.Envelope, clientLeft bool) *core.Job {
	h.t.Helper()
	j := submitStreamed(h, "q", e)
	w.Accept(j.ID, fc.lastOffer(h.t).Gen)
	h.e.StreamOpened(j.ID, true)
	h.e.StreamClosed(j.ID, true, clientLeft)
	return j
}

func TestOwnerStreamCloseWithoutGraceCancels(t *testing.T) {
	h, w, fc := oneWorker(t, nil)
	j := submitStreamed(h, "q", env(time.Minute))
	w.Accept(j.ID, fc.lastOffer(t).Gen)
	if !h.e.StreamOpened(j.ID, true) {
		t.Fatal("the submission's own stream is not an owner")
	}
	if h.e.StreamOpened(j.ID, false) {
		t.Fatal("a stream without a claim owns the job")
	}
	h.e.StreamClosed(j.ID, false, true) // a watcher leaving changes nothing
	if v := h.view(j.ID); v.State != core.StateRunning {
		t.Fatalf("state after a watcher left = %s", v.State)
	}
	h.e.StreamClosed(j.ID, true, true)
	wantEnded(t, h, j, core.OutcomeCancelled, core.CodeCancelled)
	if c := fc.Cancels(); len(c) != 1 || c[0].JobID != j.ID {
		t.Fatalf("cancels = %v", c)
	}
}

// A job not submitted as a stream (202) has no owner: no stream of it,
// claimed or not, ends it.
func TestUnstreamedJobHasNoOwner(t *testing.T) {
	h, w, fc := oneWorker(t, nil)
	j, _ := h.running(w, fc)
	if h.e.StreamOpened(j.ID, true) {
		t.Fatal("a stream of a job submitted without one owns it")
	}
	h.e.StreamClosed(j.ID, false, true)
	if v := h.view(j.ID); v.State != core.StateRunning {
		t.Fatalf("state after its reader left = %s, want running", v.State)
	}
}

// While two owner streams are open (the client resumed before the node
// noticed its old connection was gone), the first one ending starts no
// window; the last one does.
func TestLastOwnerStreamStartsTheWindow(t *testing.T) {
	h, w, fc := oneWorker(t, nil)
	j := submitStreamed(h, "q", env(time.Minute))
	w.Accept(j.ID, fc.lastOffer(t).Gen)
	a, b := h.e.StreamOpened(j.ID, true), h.e.StreamOpened(j.ID, true)
	if !a || !b {
		t.Fatalf("owners: %v, %v", a, b)
	}
	h.e.StreamClosed(j.ID, true, true)
	if v := h.view(j.ID); v.State != core.StateRunning {
		t.Fatalf("cancelled with an owner stream still open: %s", v.State)
	}
	h.e.StreamClosed(j.ID, true, true)
	wantEnded(t, h, j, core.OutcomeCancelled, core.CodeCancelled)
}

func TestOwnerStreamCloseGraceWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, nil)
		if h.e.Config().Limits.MaxGrace < 200*time.Millisecond {
			t.Fatal("test needs MaxGrace >= 200ms")
		}
		w, fc := h.attach("q", 2)
		e := env(time.Minute)
		e.Grace = 200 * time.Millisecond

		// Resumed within the window: not cancelled.
		kept := ownerGone(h, w, fc, e, true)
		time.Sleep(150 * time.Millisecond)
		if !h.e.StreamOpened(kept.ID, true) {
			t.Fatal("a resume with a valid token did not own the job")
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if v := h.view(kept.ID); v.State.Terminal() {
			t.Fatalf("a job resumed within its grace window ended: %+v", v)
		}
		if v := h.metric("switchyard_stream_grace_saves_total"); v != 1 {
			t.Errorf("grace_saves_total = %v, want 1", v)
		}

		// Not resumed: cancelled exactly when the window closes.
		lost := ownerGone(h, w, fc, e, true)
		wantEndsAt(t, h, lost, 200*time.Millisecond, "the grace window closed", core.StateRunning, core.OutcomeCancelled, core.CodeCancelled)
		if v := h.metric("switchyard_stream_grace_saves_total"); v != 1 {
			t.Errorf("grace_saves_total = %v, want still 1", v)
		}
		if d := h.view(lost.ID).Detail; !strings.Contains(d, "grace") {
			t.Errorf("detail = %q, want it to mention the grace window", d)
		}
		if v := h.view(kept.ID); v.State != core.StateRunning {
			t.Fatalf("the resumed job is %s, want running", v.State)
		}
		if c := fc.Cancels(); len(c) != 1 || c[0].JobID != lost.ID {
			t.Fatalf("cancels = %+v, want one for the job not resumed", c)
		}

		// The stream that saved the job owns it now: when it leaves too,
		// the window starts again.
		h.e.StreamClosed(kept.ID, true, true)
		time.Sleep(200 * time.Millisecond)
		synctest.Wait()
		wantEnded(t, h, kept, core.OutcomeCancelled, core.CodeCancelled)
	})
}

// A stream without a claim (no resume token) opened during the window only
// watches: it does not save the job, which is cancelled when the window
// closes while that stream is still reading.
func TestWatcherDoesNotSaveFromGraceWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, w, fc := oneWorker(t, nil)
		e := env(time.Minute)
		e.Grace = 200 * time.Millisecond
		j := ownerGone(h, w, fc, e, true)
		time.Sleep(100 * time.Millisecond)
		if h.e.StreamOpened(j.ID, false) {
			t.Fatal("a stream without a claim owns the job")
		}
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		wantEnded(t, h, j, core.OutcomeCancelled, core.CodeCancelled)
		if v := h.metric("switchyard_stream_grace_saves_total"); v != 0 {
			t.Errorf("grace_saves_total = %v, want 0", v)
		}
	})
}

// When the node itself ends the last owner stream (slow, idle, max
// duration), it told the client to resume: the job gets its envelope's
// grace window, or the node's MaxGrace without one, and is cancelled only
// if no owner stream opens in it. With a MaxGrace of 0 there is no window
// to give and the job runs to its TTL.
func TestNodeEndedOwnerStreamStartsGraceWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const maxGrace = 2 * time.Second
		h := newHarness(t, func(c *core.Config) { c.Limits.MaxGrace = maxGrace })
		w, fc := h.attach("q", 4)
		start := func(grace time.Duration) *core.Job {
			t.Helper()
			e := env(time.Minute)
			e.Grace = grace
			return ownerGone(h, w, fc, e, false)
		}
		noGrace := start(0)                       // window: MaxGrace
		ownGrace := start(300 * time.Millisecond) // window: the envelope's
		resumed := start(0)
		time.Sleep(299 * time.Millisecond)
		synctest.Wait()
		for _, j := range []*core.Job{noGrace, ownGrace, resumed} {
			if v := h.view(j.ID); v.State != core.StateRunning {
				t.Fatalf("%s ended before its window closed: %+v", j.ID, v)
			}
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		wantEnded(t, h, ownGrace, core.OutcomeCancelled, core.CodeCancelled)
		if !h.e.StreamOpened(resumed.ID, true) {
			t.Fatal("a resume with a valid token did not own the job")
		}
		wantEndsAt(t, h, noGrace, maxGrace-300*time.Millisecond, "MaxGrace passed", core.StateRunning, core.OutcomeCancelled, core.CodeCancelled)
		if d := h.view(noGrace.ID).Detail; !strings.Contains(d, "node ended") || !strings.Contains(d, "grace") {
			t.Errorf("detail = %q, want it to say the node ended the stream and the grace window passed", d)
		}
		time.Sleep(maxGrace)
		synctest.Wait()
		if v := h.view(resumed.ID); v.State.Terminal() {
			t.Fatalf("the resumed job ended: %+v", v)
		}
		if v := h.metric("switchyard_stream_grace_saves_total"); v != 1 {
			t.Errorf("grace_saves_total = %v, want 1", v)
		}
	})

	t.Run("max grace 0", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			h, w, fc := oneWorker(t, func(c *core.Config) { c.Limits.MaxGrace = 0 })
			j := submitStreamed(h, "q", env(time.Minute))
			w.Accept(j.ID, fc.lastOffer(t).Gen)
			h.e.StreamOpened(j.ID, true)
			h.e.StreamClosed(j.ID, true, false)
			time.Sleep(time.Minute - time.Millisecond)
			synctest.Wait()
			if v := h.view(j.ID); v.State != core.StateRunning {
				t.Fatalf("ended before its TTL with no window to give: %+v", v)
			}
			time.Sleep(time.Second)
			synctest.Wait()
			wantEnded(t, h, j, core.OutcomeExpired, core.CodeExpired)
		})
	})
}

func TestIngressDeadlineBackstop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, nil) // ExpirySlack 100ms
		w, fc := h.attach("q", 1)
		j := h.submit("q", env(time.Second))
		gen := fc.lastOffer(t).Gen
		w.Accept(j.ID, gen)
		wantEndsAt(t, h, j, time.Second+100*time.Millisecond, "TTL+slack", core.StateRunning, core.OutcomeExpired, core.CodeExpired)
		fc.wantCancels(t, cancelMsg{j.ID, gen, core.CodeExpired})
		wantJobsTotal(t, h, map[core.Outcome]float64{core.OutcomeExpired: 1})
	})
}

func TestOutputValidation(t *testing.T) {
	t.Run("not JSON", func(t *testing.T) {
		h, w, fc := oneWorker(t, nil)
		j, gen := h.offered(fc)
		w.Output(j.ID, gen, []byte(`{"ok":1}`)) // output before accept counts as accept
		w.Output(j.ID, gen, []byte(`not json`))
		wantEnded(t, h, j, core.OutcomeFailed, core.CodeBadOutput)
		if got := fmt.Sprint(kinds(events(t, j))); got != "[accepted output error]" {
			t.Fatalf("events = %s", got)
		}
		fc.wantCancels(t, cancelMsg{j.ID, gen, core.CodeBadOutput})
	})
	t.Run("two JSON values", func(t *testing.T) {
		h, w, fc := oneWorker(t, nil)
		j, gen := h.running(w, fc)
		w.Output(j.ID, gen, []byte(`1 2`))
		wantEnded(t, h, j, core.OutcomeFailed, core.CodeBadOutput)
	})
	t.Run("over max_output_bytes", func(t *testing.T) {
		h, w, fc := oneWorker(t, nil)
		e := env(time.Minute)
		e.Limits.MaxOutputBytes = 10
		j := h.submit("q", e)
		gen := fc.lastOffer(t).Gen
		w.Accept(j.ID, gen)
		w.Output(j.ID, gen, []byte(`"abc"`))        // 5 bytes
		w.Output(j.ID, gen, []byte(`  "a"  `))      // 3 bytes once compacted: 8
		w.Output(j.ID, gen, []byte(`"0123456789"`)) // 12 more: over
		wantEnded(t, h, j, core.OutcomeFailed, core.CodeOutputTooLarge)
		if got := fmt.Sprint(kinds(events(t, j))); got != "[accepted output output error]" {
			t.Fatalf("events = %s", got)
		}
		fc.wantCancels(t, cancelMsg{j.ID, gen, core.CodeOutputTooLarge})
		if v := h.view(j.ID); v.Outputs != 2 {
			t.Errorf("Outputs = %d, want 2", v.Outputs)
		}
	})
}

func TestStaleGenerationIgnored(t *testing.T) {
	h, w, fc := oneWorker(t, nil)
	j, gen := h.offered(fc)
	w.Accept(j.ID, gen+1) // wrong generation: not an accept
	if v := h.view(j.ID); v.State != core.StateOffered {
		t.Fatalf("state after a stale accept = %s", v.State)
	}
	w.Accept(j.ID, gen)
	head := j.History.Head()
	w.Output(j.ID, gen+1, []byte(`"stale"`))
	w.Output(j.ID, gen-1, []byte(`"stale"`))
	w.End(j.ID, gen+1, "", "", nil)
	w.Reject(j.ID, gen+1, "stale")
	w.Output("j_other", gen, []byte(`"x"`))
	if j.History.Head() != head {
		t.Fatalf("stale messages appended %d events", j.History.Head()-head)
	}
	if v := h.view(j.ID); v.State != core.StateRunning || v.Generation != gen {
		t.Fatalf("view after stale messages = %+v", v)
	}
	for kind, want := range map[string]float64{"accept": 1, "output": 3, "end": 1, "reject": 1} {
		if got := h.metric("switchyard_dispatch_stale_messages_total", "kind", kind); got != want {
			t.Errorf("stale_messages_total{kind=%s} = %v, want %v", kind, got, want)
		}
	}
	// The current generation still works.
	w.Output(j.ID, gen, []byte(`"ok"`))
	w.End(j.ID, gen, "", "", nil)
	wantEnded(t, h, j, core.OutcomeCompleted, "")
	if v := h.view(j.ID); v.Outputs != 1 {
		t.Errorf("Outputs = %d, want 1", v.Outputs)
	}
}

func TestDrainEndsOpenJobs(t *testing.T) {
	h, w, fc := oneWorker(t, nil)
	running, gen := h.running(w, fc)
	queued := h.submit("q", env(time.Minute))

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if n := h.e.Drain(ctx); n != 2 {
		t.Fatalf("Drain = %d, want 2 (one running, one queued)", n)
	}
	if !h.e.Draining() {
		t.Fatal("Draining() = false after Drain")
	}
	wantEnded(t, h, running, core.OutcomeFailed, core.CodeNodeShutdown)
	wantEnded(t, h, queued, core.OutcomeFailed, core.CodeNodeShutdown)
	fc.wantCancels(t, cancelMsg{running.ID, gen, core.CodeNodeShutdown})
	_, _, err := h.e.Submit(context.Background(), "q", env(time.Minute), core.SubmitOptions{})
	if !errors.Is(err, core.ErrDraining) {
		t.Fatalf("Submit while draining = %v", err)
	}
	if ce := wantCode(t, err, core.CodeDraining); ce.RetryAfter <= 0 {
		t.Errorf("RetryAfter = %v", ce.RetryAfter)
	}
	if _, err := h.e.AttachWorker(context.Background(), core.WorkerSpec{Queue: "q"}, &fakeConn{}); !errors.Is(err, core.ErrDraining) {
		t.Fatalf("AttachWorker while draining = %v", err)
	}
	wantJobsTotal(t, h, map[core.Outcome]float64{core.OutcomeFailed: 2})
	// Draining again with nothing open returns at once.
	if n := h.e.Drain(context.Background()); n != 0 {
		t.Fatalf("second Drain = %d", n)
	}
}

func TestDrainWaitsForJobsToFinish(t *testing.T) {
	h, w, fc := oneWorker(t, nil)
	j, gen := h.running(w, fc)

	result := make(chan int, 1)
	go func() { result <- h.e.Drain(context.Background()) }()
	waitFor(t, 5*time.Second, "the engine to start draining", h.e.Draining)
	select {
	case n := <-result:
		t.Fatalf("Drain returned %d while a job was running", n)
	default:
	}
	// The bound job still runs to completion while draining.
	w.Output(j.ID, gen, []byte(`"still here"`))
	w.End(j.ID, gen, "", "", nil)
	wantDrained(t, result, 0) // the job finished by itself
	wantEnded(t, h, j, core.OutcomeCompleted, "")
}

func TestDrainWithNothingOpen(t *testing.T) {
	h := newHarness(t, nil)
	if n := h.e.Drain(context.Background()); n != 0 {
		t.Fatalf("Drain = %d", n)
	}
}

func TestCloseEndsOpenJobs(t *testing.T) {
	h, w, fc := oneWorker(t, nil)
	running, gen := h.running(w, fc)
	w.Output(running.ID, gen, []byte(`1`))
	queued := h.submit("q", env(time.Minute))
	queued2 := h.submit("q", env(time.Minute))

	h.e.Close()
	h.e.Close() // idempotent
	for _, j := range []*core.Job{running, queued, queued2} {
		wantEnded(t, h, j, core.OutcomeFailed, core.CodeNodeShutdown)
	}
	wantJobsTotal(t, h, map[core.Outcome]float64{core.OutcomeFailed: 3})
	if c := fc.Cancels(); len(c) != 1 || c[0].JobID != running.ID || c[0].Reason != core.CodeNodeShutdown {
		t.Fatalf("cancels = %+v", c)
	}
	_, _, err := h.e.Submit(context.Background(), "q", env(time.Minute), core.SubmitOptions{})
	wantCode(t, err, core.CodeDraining)
	// A worker session ending after Close changes nothing and panics nowhere.
	w.End(running.ID, gen, core.CodeCancelled, "", nil)
	w.Detach(context.Background())
	if n := len(fc.Offers()); n != 1 {
		t.Fatalf("offers after Close = %d, want 1", n)
	}
}
