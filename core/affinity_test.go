package core_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/switchyard/switchyard/core"
)

// The key's order is a pure function of the key and the consumers: a
// consumer that leaves gives up only its own keys, one that joins takes
// keys only for itself, and slots weigh.
func TestAffinityOrderMovesOnlyItsShare(t *testing.T) {
	const keys = 4000
	slots := map[string]int{}
	for i := range 8 {
		slots[fmt.Sprintf("c_%d", i)] = 4
	}
	first := func(slots map[string]int) map[string]string {
		out := map[string]string{}
		for k := range keys {
			key := fmt.Sprintf("key-%d", k)
			out[key] = core.AffinityOrder(key, slots)[0]
		}
		return out
	}
	before := first(slots)
	perConsumer := map[string]int{}
	for _, c := range before {
		perConsumer[c]++
	}
	for c, n := range perConsumer {
		if n < keys/8*3/4 || n > keys/8*5/4 {
			t.Errorf("%s is first for %d keys of %d, want about %d", c, n, keys, keys/8)
		}
	}

	delete(slots, "c_3")
	after := first(slots)
	moved := 0
	for k, c := range before {
		switch {
		case c == "c_3":
			moved++
		case after[k] != c:
			t.Fatalf("%s moved from %s to %s when c_3 left", k, c, after[k])
		}
	}
	if moved != perConsumer["c_3"] {
		t.Errorf("%d keys moved, want c_3's %d", moved, perConsumer["c_3"])
	}

	slots["c_3"], slots["c_new"] = 4, 4
	joined := first(slots)
	taken := 0
	for k, c := range before {
		switch joined[k] {
		case c:
		case "c_new":
			taken++
		default:
			t.Fatalf("%s moved from %s to %s when c_new joined", k, c, joined[k])
		}
	}
	if taken < keys/9*3/4 || taken > keys/9*5/4 {
		t.Errorf("c_new took %d keys, want about %d", taken, keys/9)
	}

	// A consumer with twice the slots is first for about twice the keys.
	weighted := first(map[string]int{"small": 4, "big": 8})
	big := 0
	for _, c := range weighted {
		if c == "big" {
			big++
		}
	}
	if share := float64(big) / keys; share < 0.62 || share > 0.71 {
		t.Errorf("big is first for %.2f of the keys, want about 2/3", share)
	}
}

// attachN attaches n workers with concurrency slots each; ids maps their
// ids to their slots, as AffinityOrder takes them.
func (h *harness) attachN(queue string, n, slots int) ([]*core.Worker, []*fakeConn, map[string]int) {
	h.t.Helper()
	var ws []*core.Worker
	var fcs []*fakeConn
	ids := map[string]int{}
	for range n {
		w, fc := h.attach(queue, slots, "model=a")
		ws, fcs = append(ws, w), append(fcs, fc)
		ids[w.ID] = slots
	}
	return ws, fcs, ids
}

// keyFor returns a key whose order starts with the given consumers.
func keyFor(t *testing.T, slots map[string]int, prefix ...string) string {
	t.Helper()
	for i := range 100000 {
		key := fmt.Sprintf("key-%d", i)
		order := core.AffinityOrder(key, slots)
		ok := true
		for j, id := range prefix {
			ok = ok && order[j] == id
		}
		if ok {
			return key
		}
	}
	t.Fatalf("no key starts with %v", prefix)
	return ""
}

func (h *harness) submitKey(queue, key string, caps map[string]string) *core.Job {
	h.t.Helper()
	e := env(time.Minute)
	e.AffinityKey, e.Capabilities = key, caps
	j, _, err := h.e.Submit(context.Background(), queue, e, core.SubmitOptions{})
	if err != nil {
		h.t.Fatalf("Submit: %v", err)
	}
	return j
}

// owner returns the worker a job was offered to last.
func owner(t *testing.T, ws []*core.Worker, fcs []*fakeConn, id string) (int, core.Offer) {
	t.Helper()
	at, last := -1, core.Offer{}
	for i, fc := range fcs {
		if o := fc.offersFor(id); len(o) > 0 {
			at, last = i, o[len(o)-1]
		}
	}
	if at < 0 {
		t.Fatalf("job %s was offered to nobody", id)
	}
	return at, last
}

func (h *harness) affinity(result string) float64 {
	return h.metric("switchyard_dispatch_affinity_total", "result", result)
}

// Jobs with one key go to one worker, the first in the key's order, while
// it has room; the worker sees the key.
func TestAffinitySameKeySameWorker(t *testing.T) {
	h := newHarness(t, nil)
	ws, fcs, ids := h.attachN("q", 4, 2)
	for k := range 10 {
		key := fmt.Sprintf("session-%d", k)
		want := core.AffinityOrder(key, ids)[0]
		for range 5 {
			j := h.submitKey("q", key, nil)
			i, o := owner(t, ws, fcs, j.ID)
			if ws[i].ID != want || o.AffinityKey != key {
				t.Fatalf("%s went to %s (offer key %q), want %s", key, ws[i].ID, o.AffinityKey, want)
			}
			ws[i].End(j.ID, o.Gen, "", "", nil)
		}
	}
	if hits, full := h.affinity(core.AffinityHit), h.affinity(core.AffinityFull); hits != 50 || full != 0 {
		t.Errorf("hits %v full %v, want 50 and 0", hits, full)
	}
}

// Bounded loads: a hot key's jobs wait for its worker while that holds
// (runs and has waiting) no more than its slots plus AffinityLoadFactor ×
// the average per slot; past that they go to the key's next worker, and
// wait there on the same terms.
func TestAffinityBoundedLoad(t *testing.T) {
	h := newHarness(t, func(c *core.Config) {
		c.Scheduling.AffinityLoadFactor, c.Scheduling.AffinityWait = 1.5, time.Hour
	})
	ws, fcs, ids := h.attachN("q", 4, 1)
	order := core.AffinityOrder("hot", ids)
	at := func(id string) int { return slices.IndexFunc(ws, func(w *core.Worker) bool { return w.ID == id }) }
	first, second := at(order[0]), at(order[1])
	var jobs []*core.Job
	for range 5 {
		jobs = append(jobs, h.submitKey("q", "hot", nil))
	}
	// H held before each job, S = 4 slots of 1, bound 1 + ⌈1.5 × (H+1)/4⌉:
	// job 1 takes the first's slot (H 0); jobs 2 and 3 wait for it
	// (bounds 2 and 3); job 4 would make it hold 4 over a bound of 3: it
	// goes to the second, free; job 5 would make the first hold 4 over 3
	// again, and waits for the second (2 under 3).
	offered := func(i int) []string {
		var out []string
		for _, o := range fcs[i].Offers() {
			out = append(out, o.JobID)
		}
		return out
	}
	if got := offered(first); !slices.Equal(got, []string{jobs[0].ID}) {
		t.Fatalf("the first worker was offered %v, want job 1", got)
	}
	if got := offered(second); !slices.Equal(got, []string{jobs[3].ID}) {
		t.Fatalf("the second worker was offered %v, want job 4", got)
	}
	end := func(w, job int) {
		t.Helper()
		o := fcs[w].offersFor(jobs[job].ID)
		ws[w].End(jobs[job].ID, o[len(o)-1].Gen, "", "", nil)
	}
	end(first, 0)
	end(second, 3)
	end(first, 1)
	if got := offered(first); !slices.Equal(got, []string{jobs[0].ID, jobs[1].ID, jobs[2].ID}) {
		t.Fatalf("the first worker was offered %v, want jobs 1 to 3", got)
	}
	if got := offered(second); !slices.Equal(got, []string{jobs[3].ID, jobs[4].ID}) {
		t.Fatalf("the second worker was offered %v, want jobs 4 and 5", got)
	}
	for _, i := range []int{0, 1, 2, 3} {
		if i != first && i != second && len(fcs[i].Offers()) > 0 {
			t.Errorf("worker %d, neither of the key's first two, was offered a job", i)
		}
	}
	if hits, full := h.affinity(core.AffinityHit), h.affinity(core.AffinityFull); hits != 3 || full != 2 {
		t.Errorf("hits %v full %v, want 3 and 2", hits, full)
	}
}

// A job waits for its key's worker while another job of its subject can
// use the slot that frees elsewhere: the free slot does not idle, and the
// waiting job keeps its worker.
func TestAffinityWaitsForItsWorker(t *testing.T) {
	h := newHarness(t, nil)
	ws, fcs, ids := h.attachN("q", 2, 1)
	a, b := ws[0], ws[1]
	keyA := keyFor(t, ids, a.ID)
	keyB := keyFor(t, ids, b.ID)
	busyA := h.submitKey("q", keyA, nil)
	busyB := h.submitKey("q", keyB, nil)
	first := h.submitKey("q", keyA, nil)
	second := h.submitKey("q", keyB, nil)
	_, o := owner(t, ws, fcs, busyB.ID)
	b.End(busyB.ID, o.Gen, "", "", nil)
	if i, _ := owner(t, ws, fcs, second.ID); i != 1 {
		t.Fatalf("the job for b went to worker %d", i)
	}
	if n := len(fcs[1].offersFor(first.ID)); n != 0 {
		t.Fatal("the job for a took b's slot while another job could use it")
	}
	_, o = owner(t, ws, fcs, busyA.ID)
	a.End(busyA.ID, o.Gen, "", "", nil)
	if i, _ := owner(t, ws, fcs, first.ID); i != 0 {
		t.Fatalf("the job for a went to worker %d", i)
	}
	if hits := h.affinity(core.AffinityHit); hits != 4 {
		t.Errorf("hits %v, want 4", hits)
	}
}

// The miss reasons: the key's worker left (gone), or cannot run this job
// (none_capable); a worker that joins and comes first for a key takes it.
func TestAffinityMissReasons(t *testing.T) {
	h := newHarness(t, nil)
	w1, fc1 := h.attach("q", 1, "model=a")
	w2, fc2 := h.attach("q", 1, "model=a", "model=b")
	ws, fcs := []*core.Worker{w1, w2}, []*fakeConn{fc1, fc2}
	ids := map[string]int{w1.ID: 1, w2.ID: 1}
	run := func(key string, caps map[string]string) *core.Worker {
		t.Helper()
		j := h.submitKey("q", key, caps)
		i, o := owner(t, ws, fcs, j.ID)
		ws[i].End(j.ID, o.Gen, "", "", nil)
		return ws[i]
	}
	want := func(result string, n float64) {
		t.Helper()
		if got := h.affinity(result); got != n {
			t.Errorf("%s = %v, want %v", result, got, n)
		}
	}

	// none_capable: the key's worker w1 lacks model=b.
	key := keyFor(t, ids, w1.ID)
	if run(key, map[string]string{"model": "a"}) != w1 || run(key, map[string]string{"model": "b"}) != w2 {
		t.Fatal("placements by capability")
	}
	want(core.AffinityHit, 1)
	want(core.AffinityNoneCapable, 1)

	// gone: the key's worker w1 left; its next job goes to w2.
	if run(key, nil) != w1 {
		t.Fatal("placement before w1 left")
	}
	w1.Detach(context.Background())
	if run(key, nil) != w2 {
		t.Fatal("placement after w1 left")
	}
	want(core.AffinityHit, 2)
	want(core.AffinityGone, 1)

	// Keys served by w2 alone, then w3 joins and comes first for some of
	// them: those move to it, the others stay.
	var keys []string
	for i := range 32 {
		keys = append(keys, fmt.Sprintf("m-%d", i))
		run(keys[i], nil)
	}
	want(core.AffinityHit, 34)
	w3, fc3 := h.attach("q", 1, "model=a")
	ws, fcs = append(ws, w3), append(fcs, fc3)
	moved, stayed := 0, 0
	for _, k := range keys {
		first := core.AffinityOrder(k, map[string]int{w2.ID: 1, w3.ID: 1})[0]
		if got := run(k, nil); got.ID != first {
			t.Fatalf("%s went to %s, want its first %s", k, got.ID, first)
		}
		if first == w3.ID {
			moved++
		} else {
			stayed++
		}
	}
	if moved == 0 || stayed == 0 {
		t.Fatalf("moved %d stayed %d: the test needs both", moved, stayed)
	}
	want(core.AffinityHit, float64(34+moved+stayed))
	want(core.AffinityFull, 0)
	want(core.AffinityGone, 1)
	want(core.AffinityNoneCapable, 1)
}

// AffinityWait: a job whose worker is full but has room under the bound
// (its queue is no longer than the factor allows) waits that long for it
// while another worker is free, then goes there.
func TestAffinityWait(t *testing.T) {
	for _, tc := range []struct {
		name  string
		free  bool // one of the first worker's jobs ends within the wait
		first bool
	}{{"slot frees in time", true, true}, {"wait runs out", false, false}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, func(c *core.Config) {
					c.Scheduling.AffinityLoadFactor, c.Scheduling.AffinityWait = 1.5, 100*time.Millisecond
				})
				ws, fcs, ids := h.attachN("q", 2, 4)
				order := core.AffinityOrder("hot", ids)
				first := slices.IndexFunc(ws, func(w *core.Worker) bool { return w.ID == order[0] })
				var jobs []*core.Job
				for range 4 { // the first worker's slots
					jobs = append(jobs, h.submitKey("q", "hot", nil))
				}
				last := h.submitKey("q", "hot", nil)
				synctest.Wait()
				if n := len(fcs[1-first].offersFor(last.ID)); n != 0 {
					t.Fatal("the job went to the free worker before its wait was over")
				}
				if tc.free {
					time.Sleep(50 * time.Millisecond)
					_, o := owner(t, ws, fcs, jobs[0].ID)
					ws[first].End(jobs[0].ID, o.Gen, "", "", nil)
				}
				time.Sleep(100 * time.Millisecond)
				synctest.Wait()
				if i, _ := owner(t, ws, fcs, last.ID); (i == first) != tc.first {
					t.Fatalf("the job went to worker %d, want the first (%d): %v", i, first, tc.first)
				}
			})
		})
	}
}

// The key hash is FNV-1a 64, the function every node must agree on.
func TestKeyHashIsFNV1a(t *testing.T) {
	for _, key := range []string{"", "session-42", "ü", strings.Repeat("k", 256)} {
		h := fnv.New64a()
		h.Write([]byte(key))
		if got := core.KeyHash(key); got != h.Sum64() {
			t.Errorf("%q: %x, want %x", key, got, h.Sum64())
		}
	}
}
