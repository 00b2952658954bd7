package core_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/switchyard/switchyard/core"
)

// run submits a job to h's worker w and has the worker complete it after
// the given outputs (JSON values).
func (h *harness) run(w *core.Worker, fc *fakeConn, opts core.SubmitOptions, outputs ...string) *core.Job {
	h.t.Helper()
	j, existing, err := h.e.Submit(context.Background(), "q", env(time.Minute), opts)
	if err != nil || existing {
		h.t.Fatalf("Submit = existing %v, %v", existing, err)
	}
	gen := fc.lastOffer(h.t).Gen
	w.Accept(j.ID, gen)
	for _, out := range outputs {
		w.Output(j.ID, gen, []byte(out))
	}
	w.End(j.ID, gen, "", "", nil)
	return j
}

// wantGone checks that every call for an evicted job answers
// job_not_found, as for an id the node never had.
func wantGone(t *testing.T, h *harness, ids ...string) {
	t.Helper()
	for _, id := range ids {
		_, err := h.e.Job(id)
		ce := wantCode(t, err, core.CodeJobNotFound)
		if !strings.Contains(ce.Detail, "no longer retained") {
			t.Errorf("Job(%s) detail %q does not say an ended job may be no longer retained", id, ce.Detail)
		}
		_, err = h.e.View(id)
		wantCode(t, err, core.CodeJobNotFound)
		_, err = h.e.Cancel(id, "late")
		wantCode(t, err, core.CodeJobNotFound)
		if h.e.StreamOpened(id, true) {
			t.Errorf("StreamOpened(%s) owned an evicted job", id)
		}
	}
}

func wantKept(t *testing.T, h *harness, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if v, err := h.e.View(id); err != nil || !v.State.Terminal() {
			t.Errorf("View(%s) = %+v, %v; want the ended job kept", id, v, err)
		}
	}
}

func (h *harness) wantRetained(jobs int, evicted map[core.EvictReason]float64) {
	h.t.Helper()
	n, bytes := h.e.Retained()
	if n != jobs {
		h.t.Errorf("Retained() = %d jobs, want %d", n, jobs)
	}
	if g := h.metric("switchyard_retention_jobs"); g != float64(jobs) {
		h.t.Errorf("switchyard_retention_jobs = %v, want %d", g, jobs)
	}
	if g := h.metric("switchyard_retention_bytes"); g != float64(bytes) {
		h.t.Errorf("switchyard_retention_bytes = %v, want %d (Retained)", g, bytes)
	}
	for _, r := range []core.EvictReason{core.EvictRetention, core.EvictCount, core.EvictBytes} {
		if got := h.metric("switchyard_retention_evictions_total", "reason", string(r)); got != evicted[r] {
			h.t.Errorf("evictions_total{reason=%s} = %v, want %v", r, got, evicted[r])
		}
	}
}

// TestRetainCountBound: past RetainJobs ended jobs, the oldest ended ones
// are evicted, one for one, and the trimmed record keeps no input.
func TestRetainCountBound(t *testing.T) {
	h, w, fc := oneWorker(t, func(c *core.Config) { c.RetainJobs = 3 })
	var ids []string
	for range 5 {
		j := h.run(w, fc, core.SubmitOptions{}, `"a"`, `"b"`)
		ids = append(ids, j.ID)
		if j.Env != nil {
			t.Errorf("job %s kept its envelope after it ended", j.ID)
		}
	}
	wantGone(t, h, ids[:2]...)
	wantKept(t, h, ids[2:]...)
	h.wantRetained(3, map[core.EvictReason]float64{core.EvictCount: 2})

	// A running job is not an ended one: it is never counted or evicted.
	running, _, err := h.e.Submit(context.Background(), "q", env(time.Minute), core.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h.wantRetained(3, map[core.EvictReason]float64{core.EvictCount: 2})
	wantKept(t, h, ids[2:]...)
	if v := h.view(running.ID); v.State.Terminal() {
		t.Fatalf("running job ended: %+v", v)
	}
}

// retainingBytes is oneWorker on a node whose ended jobs are kept up to
// limit bytes (RetainBytes), a job's history up to as many (HistoryBytes)
// and inputs small (1 KiB), so the bound is in output.
func retainingBytes(t *testing.T, limit int64) (*harness, *core.Worker, *fakeConn) {
	t.Helper()
	return oneWorker(t, func(c *core.Config) {
		c.Limits.MaxInputBytes = 1 << 10
		c.HistoryBytes = limit
		c.RetainBytes = limit
	})
}

// TestRetainBytesBound: the ended jobs kept hold at most RetainBytes; the
// oldest go first when a new one would pass it.
func TestRetainBytesBound(t *testing.T) {
	const limit = 64 << 10
	h, w, fc := retainingBytes(t, limit)
	out := `"` + strings.Repeat("x", 6<<10) + `"`
	first := h.run(w, fc, core.SubmitOptions{}, out)
	_, per := h.e.Retained()
	if per < 6<<10 || per > 8<<10 {
		t.Fatalf("one job with 6 KiB of output is accounted %d bytes, want between 6 and 8 KiB", per)
	}
	fit := int(limit / per)
	ids := []string{first.ID}
	for range fit + 2 {
		ids = append(ids, h.run(w, fc, core.SubmitOptions{}, out).ID)
		if _, bytes := h.e.Retained(); bytes > limit {
			t.Fatalf("retained %d bytes, above RetainBytes %d", bytes, limit)
		}
	}
	wantGone(t, h, ids[:3]...)
	wantKept(t, h, ids[3:]...)
	h.wantRetained(fit, map[core.EvictReason]float64{core.EvictBytes: 3})
}

// TestRetainOldestEndedFirst: eviction goes by the order jobs ended, not
// the order they were submitted.
func TestRetainOldestEndedFirst(t *testing.T) {
	h := newHarness(t, func(c *core.Config) { c.RetainJobs = 1 })
	_, _ = h.attach("q", 2)
	a := h.submit("q", env(time.Minute))
	b := h.submit("q", env(time.Minute))
	if _, err := h.e.Cancel(b.ID, "first to end"); err != nil {
		t.Fatal(err)
	}
	wantKept(t, h, b.ID)
	if _, err := h.e.Cancel(a.ID, "second to end"); err != nil {
		t.Fatal(err)
	}
	wantGone(t, h, b.ID)
	wantKept(t, h, a.ID)
	h.wantRetained(1, map[core.EvictReason]float64{core.EvictCount: 1})
}

// TestRetainNewestKept: a job that ended is kept whatever its size, for the
// readers streaming it now, even when that evicts every other.
func TestRetainNewestKept(t *testing.T) {
	const limit = 16 << 10
	h, w, fc := retainingBytes(t, limit)
	small := h.run(w, fc, core.SubmitOptions{}, `"s"`)
	big := h.run(w, fc, core.SubmitOptions{}, `"`+strings.Repeat("x", limit-200)+`"`)
	if _, bytes := h.e.Retained(); bytes <= limit {
		t.Fatalf("retained %d bytes: the test needs a job over RetainBytes %d", bytes, limit)
	}
	wantGone(t, h, small.ID)
	wantKept(t, h, big.ID)
	if evs := events(t, big); len(evs) != 3 || evs[2].Kind != core.EventDone {
		t.Fatalf("the kept job's history = %v", kinds(evs))
	}
	h.wantRetained(1, map[core.EvictReason]float64{core.EvictBytes: 1})
}

// TestRetainIdempotencyKeyGoesWithItsJob: while an ended job is kept its
// key returns it; once the job is evicted the key is free for a new job.
func TestRetainIdempotencyKeyGoesWithItsJob(t *testing.T) {
	h, w, fc := oneWorker(t, func(c *core.Config) { c.RetainJobs = 1 })
	keyed := h.run(w, fc, core.SubmitOptions{IdempotencyKey: "k1"}, `"a"`)
	again, existing, err := h.e.Submit(context.Background(), "q", env(time.Minute), core.SubmitOptions{IdempotencyKey: "k1"})
	if err != nil || !existing || again != keyed {
		t.Fatalf("Submit with the key of a kept job = %v, existing %v, %v; want that job", again, existing, err)
	}
	h.run(w, fc, core.SubmitOptions{}, `"b"`) // evicts the keyed job
	wantGone(t, h, keyed.ID)
	fresh, existing, err := h.e.Submit(context.Background(), "q", env(time.Minute), core.SubmitOptions{IdempotencyKey: "k1"})
	if err != nil || existing || fresh.ID == keyed.ID {
		t.Fatalf("Submit with the key of an evicted job = %v, existing %v, %v; want a new job", fresh, existing, err)
	}
}

// TestRetainRetention: an ended job is kept for Retention, then evicted,
// with one timer for all: jobs that ended together go together.
func TestRetainRetention(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, w, fc := oneWorker(t, func(c *core.Config) { c.Retention = time.Minute })
		a := h.run(w, fc, core.SubmitOptions{IdempotencyKey: "ka"}, `"a"`)
		time.Sleep(10 * time.Second)
		b := h.run(w, fc, core.SubmitOptions{}, `"b"`)
		c := h.run(w, fc, core.SubmitOptions{}, `"c"`)

		time.Sleep(50*time.Second - time.Nanosecond)
		synctest.Wait()
		wantKept(t, h, a.ID, b.ID, c.ID)
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		wantGone(t, h, a.ID)
		wantKept(t, h, b.ID, c.ID)
		h.wantRetained(2, map[core.EvictReason]float64{core.EvictRetention: 1})

		time.Sleep(10 * time.Second)
		synctest.Wait()
		wantGone(t, h, b.ID, c.ID)
		h.wantRetained(0, map[core.EvictReason]float64{core.EvictRetention: 3})
		if _, existing, err := h.e.Submit(context.Background(), "q", env(time.Minute), core.SubmitOptions{IdempotencyKey: "ka"}); err != nil || existing {
			t.Fatalf("Submit with an expired job's key: existing %v, %v", existing, err)
		}
	})
}

// TestEndedHistoryReadable: a kept job's history, packed when the job
// ended, reads exactly as it was written, from the start and from a cursor.
func TestEndedHistoryReadable(t *testing.T) {
	h, w, fc := oneWorker(t, nil)
	outs := []string{`"one"`, `{"two":2}`, `[3]`}
	j := h.run(w, fc, core.SubmitOptions{}, outs...)
	evs := events(t, j)
	if len(evs) != 5 {
		t.Fatalf("events %v", kinds(evs))
	}
	for i, want := range outs {
		var got struct{ Data json.RawMessage }
		if err := json.Unmarshal(evs[i+1].Data, &got); err != nil || string(got.Data) != want {
			t.Errorf("output %d = %s, want data %s", i, evs[i+1].Data, want)
		}
		if cap(evs[i+1].Data) != len(evs[i+1].Data) {
			t.Errorf("output %d: data has spare capacity: a reader appending to it would write into the next event", i)
		}
	}
	r, _, err := j.History.Since(2, 10)
	if err != nil || len(r.Events) != 3 || r.Events[0].Seq != 3 || !r.Ended || r.LagEvents != 3 {
		t.Fatalf("Since(2) = %+v, %v", r, err)
	}
	if ev, ok := j.History.Append(core.EventOutput, 1, []byte(`"late"`)); ok {
		t.Fatalf("appended %+v after the terminal event", ev)
	}
}
