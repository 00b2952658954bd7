package core_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/switchyard/switchyard/core"
)

// submitAs submits a job of subject owner with the given weight and
// priority; its input names it.
func (h *harness) submitAs(queue, owner string, weight, priority int, name string) *core.Job {
	h.t.Helper()
	e := env(5 * time.Minute)
	e.Input = json.RawMessage(fmt.Sprintf("%q", name))
	e.Priority = priority
	j, _, err := h.e.Submit(context.Background(), queue, e, core.SubmitOptions{Owner: owner, Share: core.Share{Weight: weight}})
	if err != nil {
		h.t.Fatalf("Submit %s: %v", name, err)
	}
	return j
}

// running tracks the jobs a fake worker holds, oldest first, so a test can
// end them in the order they started and read what the freed slot went to.
type running struct {
	t     *testing.T
	w     *core.Worker
	fc    *fakeConn
	seen  int
	held  []core.Offer
	names []string
}

func newRunning(t *testing.T, w *core.Worker, fc *fakeConn) *running {
	return &running{t: t, w: w, fc: fc}
}

// started returns the names (inputs) of the jobs offered since the last
// call, accepts them and holds them.
func (r *running) started() []string {
	offers := r.fc.Offers()
	var out []string
	for _, o := range offers[r.seen:] {
		var name string
		if err := json.Unmarshal(o.Input, &name); err != nil {
			r.t.Fatalf("offer input %s: %v", o.Input, err)
		}
		r.w.Accept(o.JobID, o.Gen)
		r.held = append(r.held, o)
		r.names = append(r.names, name)
		out = append(out, name)
	}
	r.seen = len(offers)
	return out
}

// endOldest ends the job that started first and returns what started in
// its place.
func (r *running) endOldest() []string {
	r.started()
	if len(r.held) == 0 {
		r.t.Fatal("no job is running")
	}
	o := r.held[0]
	r.held, r.names = r.held[1:], r.names[1:]
	r.w.End(o.JobID, o.Gen, "", "", nil)
	return r.started()
}

// fourSlots is a harness with one worker of four credits on queue q,
// tracked by a running.
func fourSlots(t *testing.T) (*harness, *core.Worker, *running) {
	t.Helper()
	h := newHarness(t, nil)
	w, fc := h.attach("q", 4)
	return h, w, newRunning(t, w, fc)
}

// submitSeries submits, on queue q, the jobs of subject owner (weight,
// priority 0) named fmt.Sprintf(format, i) for i from from up to to.
func (h *harness) submitSeries(owner string, weight int, format string, from, to int) {
	h.t.Helper()
	for i := from; i < to; i++ {
		h.submitAs("q", owner, weight, 0, fmt.Sprintf(format, i))
	}
}

// subjects of a sequence of job names: their first letter.
func subjects(names []string) string {
	var b strings.Builder
	for _, n := range names {
		b.WriteByte(n[0])
	}
	return b.String()
}

// Fair share with equal weights: a subject that posts 12 jobs into a full
// queue and one that posts 6 after it get the slots that free in turns
// that keep their slots equal — not first come, first served.
func TestFairShareEqualWeights(t *testing.T) {
	h, _, r := fourSlots(t)
	h.submitSeries("heavy", 1, "H%d", 0, 12)
	h.submitSeries("light", 1, "L%d", 0, 6)
	if got := subjects(r.started()); got != "HHHH" {
		t.Fatalf("first four slots went to %s", got)
	}
	var next []string
	for range 10 {
		next = append(next, r.endOldest()...)
	}
	// Heavy holds 4, light 0: light takes the next two slots (4:0 → 2:2),
	// then each subject's ended job is replaced by its own, light's six
	// jobs in all.
	if got, want := subjects(next), "LLHHLLHHLL"; got != want {
		t.Fatalf("slots went to %s, want %s", got, want)
	}
	// Within each subject, first come, first served.
	if !slices.IsSorted(filter(next, "L")) || !slices.IsSorted(filter(next, "H")) {
		t.Errorf("a subject's jobs started out of order: %v", next)
	}
}

func filter(names []string, prefix string) []string {
	var out []string
	for _, n := range names {
		if strings.HasPrefix(n, prefix) {
			out = append(out, n)
		}
	}
	return out
}

// Weights 3:1: the subject of weight 3 holds three slots of four while
// both wait, whoever posted more.
func TestFairShareWeights(t *testing.T) {
	h, _, r := fourSlots(t)
	h.submitSeries("heavy", 1, "H%02d", 0, 20)
	h.submitSeries("light", 3, "L%02d", 0, 10)
	r.started()
	var next []string
	for range 12 {
		next = append(next, r.endOldest()...)
	}
	if got, want := subjects(next), "LLLHLLLHLLLH"; got != want {
		t.Fatalf("slots went to %s, want %s (3:1)", got, want)
	}
	// The queue view shows the shares: light holds 3 of the 4 slots and
	// its weight entitles it to 3/4.
	st := stats(t, h, "q")
	want := []core.SubjectStat{
		{Subject: "heavy", Weight: 1, Depth: 20 - 4 - 3, Bound: 1, Share: 0.25, FairShare: 0.25},
		{Subject: "light", Weight: 3, Depth: 10 - 9, Bound: 3, Share: 0.75, FairShare: 0.75},
	}
	if !slices.Equal(st.Subjects, want) {
		t.Errorf("subjects %+v, want %+v", st.Subjects, want)
	}
}

func stats(t *testing.T, h *harness, queue string) core.QueueStat {
	t.Helper()
	for _, st := range h.e.QueueStats() {
		if st.Name == queue {
			return st
		}
	}
	t.Fatalf("no queue %s", queue)
	return core.QueueStat{}
}

// The share is of slots held, not of jobs dispatched: a subject whose jobs
// run long keeps its half of the slots while the other's short jobs come
// and go, and gets no more than its half however many of its jobs wait.
func TestFairShareCountsSlotsNotDispatches(t *testing.T) {
	h, w, r := fourSlots(t)
	h.submitSeries("long", 1, "A%d", 0, 2)
	h.submitSeries("short", 1, "B%02d", 0, 20)
	h.submitSeries("long", 1, "A%d", 2, 12)
	if got := subjects(r.started()); got != "AABB" {
		t.Fatalf("first slots %s", got)
	}
	// End only short jobs: each freed slot goes back to short (2:2 held),
	// never to long, which already holds its half.
	for range 10 {
		i := slices.IndexFunc(r.names, func(n string) bool { return n[0] == 'B' })
		o := r.held[i]
		r.held, r.names = slices.Delete(r.held, i, i+1), slices.Delete(r.names, i, i+1)
		w.End(o.JobID, o.Gen, "", "", nil)
		if got := subjects(r.started()); got != "B" {
			t.Fatalf("a short job's slot went to %q", got)
		}
	}
}

// Priorities within a subject: higher first, arrival order among equals.
func TestPriorityOrder(t *testing.T) {
	h, w, fc := oneWorker(t, nil)
	r := newRunning(t, w, fc)
	h.submitAs("q", "s", 1, 0, "first")
	for _, p := range []int{0, 5, -5, 2, 5} {
		h.submitAs("q", "s", 1, p, fmt.Sprintf("p%d@%d", p, len(fc.Offers())+len(r.names)))
	}
	r.started()
	var got []string
	for range 5 {
		for _, n := range r.endOldest() {
			got = append(got, n[:strings.Index(n, "@")])
		}
	}
	if want := []string{"p5", "p5", "p2", "p0", "p-5"}; !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

// Aging: a job gains a level of priority per PriorityAging of waiting, so
// a later job of higher priority passes it only within that many levels'
// time. Run in virtual time.
func TestPriorityAging(t *testing.T) {
	for _, tc := range []struct {
		wait  time.Duration
		first string
	}{
		// low (-5) waited 9s: a high (+5) job posted now is 10 levels up,
		// 9 of them made up: it goes first.
		{9 * time.Second, "high"},
		// 11s: the low job has made up more than the 10 levels.
		{11 * time.Second, "low"},
	} {
		t.Run(tc.wait.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h, w, fc := oneWorker(t, func(c *core.Config) { c.Scheduling.PriorityAging = time.Second })
				r := newRunning(t, w, fc)
				h.submitAs("q", "s", 1, 0, "busy")
				r.started() // accepted: the worker is not dropped as stalled
				h.submitAs("q", "s", 1, core.MinPriority, "low")
				time.Sleep(tc.wait)
				h.submitAs("q", "s", 1, core.MaxPriority, "high")
				r.started()
				if got := r.endOldest(); !slices.Equal(got, []string{tc.first}) {
					t.Fatalf("after %v the slot went to %v, want %s", tc.wait, got, tc.first)
				}
			})
		})
	}
}

// A job that came back to its queue (its worker refused it) goes ahead of
// every subject's waiting jobs, even of a subject further below its share.
func TestReturnedJobGoesFirst(t *testing.T) {
	h := newHarness(t, nil)
	wa, fa := h.attach("q", 3)
	wb, fb := h.attach("q", 1)
	h.submitSeries("x", 1, "x%d", 0, 4)
	if len(fa.Offers()) != 3 || len(fb.Offers()) != 1 {
		t.Fatalf("offers %d and %d, want 3 and 1", len(fa.Offers()), len(fb.Offers()))
	}
	h.submitAs("q", "y", 1, 0, "y0")
	h.submitAs("q", "y", 1, 0, "y1")
	// wb refuses its job: it comes back, excluded from wb, whose slot goes
	// to y0.
	ob := fb.lastOffer(t)
	wb.Reject(ob.JobID, ob.Gen, "busy")
	if o := fb.lastOffer(t); string(o.Input) != `"y0"` {
		t.Fatalf("wb's freed slot went to %s, want y0", o.Input)
	}
	// A slot on wa frees: x holds 2, y 1 — the share would say y1, but the
	// returned job goes first.
	oa := fa.Offers()[0]
	wa.End(oa.JobID, oa.Gen, "", "", nil)
	if o := fa.lastOffer(t); o.JobID != ob.JobID {
		t.Fatalf("wa's freed slot went to %s, want the returned job %s", o.Input, ob.JobID)
	}
}
