package core_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/internal/chans"
)

func appendN(t *testing.T, h *core.History, n int, size int) {
	t.Helper()
	for i := range n {
		if _, ok := h.Append(core.EventOutput, 1, []byte(strings.Repeat(fmt.Sprint(i%10), size))); !ok {
			t.Fatalf("Append %d refused", i)
		}
	}
}

func seqs(evs []core.Event) []uint64 {
	out := make([]uint64, len(evs))
	for i, ev := range evs {
		out[i] = ev.Seq
	}
	return out
}

func TestHistoryAppendAndSince(t *testing.T) {
	h := core.NewHistory(100, 1<<20)
	if h.Head() != 0 {
		t.Fatalf("Head of an empty history = %d", h.Head())
	}
	r, first, err := h.Since(0, 10)
	if err != nil || first != 0 || len(r.Events) != 0 || r.Ended || r.LagEvents != 0 {
		t.Fatalf("Since on empty = %+v, %d, %v", r, first, err)
	}
	ev, ok := h.Append(core.EventAccepted, 0, []byte(`{"a":1}`))
	if !ok || ev.Seq != 1 || ev.Kind != core.EventAccepted {
		t.Fatalf("first Append = %+v, %v", ev, ok)
	}
	for i := 2; i <= 5; i++ {
		ev, ok := h.Append(core.EventOutput, 7, []byte(fmt.Sprintf(`{"i":%d}`, i)))
		if !ok || ev.Seq != uint64(i) || ev.Gen != 7 {
			t.Fatalf("Append %d = %+v, %v", i, ev, ok)
		}
	}
	if h.Head() != 5 {
		t.Fatalf("Head = %d, want 5", h.Head())
	}
	r, first, err = h.Since(0, 100)
	if err != nil || first != 1 {
		t.Fatalf("Since(0) first=%d err=%v", first, err)
	}
	if got := fmt.Sprint(seqs(r.Events)); got != "[1 2 3 4 5]" {
		t.Fatalf("Since(0) seqs = %s", got)
	}
	for i, ev := range r.Events[1:] {
		if string(ev.Data) != fmt.Sprintf(`{"i":%d}`, i+2) {
			t.Errorf("event %d data = %s", ev.Seq, ev.Data)
		}
	}
	r, _, _ = h.Since(2, 2)
	if got := fmt.Sprint(seqs(r.Events)); got != "[3 4]" {
		t.Fatalf("Since(2, max 2) = %s, want [3 4]", got)
	}
	if r.LagEvents != 3 {
		t.Errorf("LagEvents after 2 = %d, want 3", r.LagEvents)
	}
	r, _, err = h.Since(5, 10)
	if err != nil || len(r.Events) != 0 || r.LagEvents != 0 || r.LagBytes != 0 {
		t.Fatalf("Since(head) = %+v, %v", r, err)
	}
	r, _, err = h.Since(99, 10)
	if err != nil || len(r.Events) != 0 {
		t.Fatalf("Since(beyond head) = %+v, %v", r, err)
	}
}

func TestHistorySinceReturnsACopy(t *testing.T) {
	h := core.NewHistory(10, 1<<20)
	h.Append(core.EventOutput, 1, []byte("a"))
	r, _, _ := h.Since(0, 10)
	r.Events[0].Seq = 42
	r2, _, _ := h.Since(0, 10)
	if r2.Events[0].Seq != 1 {
		t.Fatal("a reader changed the history through the slice Since returned")
	}
}

func TestHistoryLag(t *testing.T) {
	h := core.NewHistory(100, 1<<20)
	sizes := []int{3, 5, 7, 11}
	for _, n := range sizes {
		h.Append(core.EventOutput, 1, make([]byte, n))
	}
	for after := range 5 {
		r, _, err := h.Since(uint64(after), 1)
		if err != nil {
			t.Fatal(err)
		}
		wantEvents, wantBytes := 0, int64(0)
		for _, n := range sizes[min(after, len(sizes)):] {
			wantEvents++
			wantBytes += int64(n)
		}
		if r.LagEvents != wantEvents || r.LagBytes != wantBytes {
			t.Errorf("Since(%d): lag %d events %d bytes, want %d, %d", after, r.LagEvents, r.LagBytes, wantEvents, wantBytes)
		}
		if wantEvents > 0 && len(r.Events) != 1 {
			t.Errorf("Since(%d, max 1) returned %d events", after, len(r.Events))
		}
	}
}

func TestHistoryRetentionByCount(t *testing.T) {
	h := core.NewHistory(3, 1<<20)
	appendN(t, h, 5, 1)
	r, first, err := h.Since(2, 10)
	if err != nil || first != 3 {
		t.Fatalf("Since(2) first=%d err=%v, want first 3", first, err)
	}
	if got := fmt.Sprint(seqs(r.Events)); got != "[3 4 5]" {
		t.Fatalf("retained %s, want [3 4 5]", got)
	}
	if h.Head() != 5 {
		t.Fatalf("Head = %d", h.Head())
	}
	// A cursor before the oldest retained event has lost events: gone.
	for _, after := range []uint64{0, 1} {
		_, first, err := h.Since(after, 10)
		if !errors.Is(err, core.ErrHistoryGone) || first != 3 {
			t.Errorf("Since(%d) = first %d, %v; want ErrHistoryGone with oldest 3", after, first, err)
		}
	}
}

func TestHistoryRetentionByBytes(t *testing.T) {
	h := core.NewHistory(100, 10)
	appendN(t, h, 3, 4) // 12 bytes: the first goes
	r, first, err := h.Since(1, 10)
	if err != nil || first != 2 || fmt.Sprint(seqs(r.Events)) != "[2 3]" {
		t.Fatalf("after 3×4 bytes under 10: first %d, %v, %v", first, seqs(r.Events), err)
	}
	if r.LagBytes != 8 {
		t.Errorf("LagBytes = %d, want 8", r.LagBytes)
	}
	if _, _, err := h.Since(0, 10); !errors.Is(err, core.ErrHistoryGone) {
		t.Errorf("Since(0) = %v, want ErrHistoryGone", err)
	}
	// An event larger than the whole byte budget is still kept, alone: the
	// newest event always is.
	h.Append(core.EventOutput, 1, make([]byte, 50))
	r, first, err = h.Since(3, 10)
	if err != nil || first != 4 || len(r.Events) != 1 || len(r.Events[0].Data) != 50 {
		t.Fatalf("oversized newest: first %d, %v, %v", first, seqs(r.Events), err)
	}
	if r.LagBytes != 50 {
		t.Errorf("LagBytes = %d, want 50", r.LagBytes)
	}
	// The next small event pushes the oversized one out.
	h.Append(core.EventOutput, 1, []byte("x"))
	r, first, err = h.Since(4, 10)
	if err != nil || first != 5 || fmt.Sprint(seqs(r.Events)) != "[5]" {
		t.Fatalf("after a small event: first %d, %v, %v", first, seqs(r.Events), err)
	}
}

func TestHistoryNewestAlwaysKept(t *testing.T) {
	h := core.NewHistory(0, 0) // budgets that admit nothing still keep one
	appendN(t, h, 3, 5)
	r, first, err := h.Since(2, 10)
	if err != nil || first != 3 || fmt.Sprint(seqs(r.Events)) != "[3]" {
		t.Fatalf("Since(2) = first %d, %v, %v", first, seqs(r.Events), err)
	}
}

func TestHistoryWakeClosesOnAppend(t *testing.T) {
	h := core.NewHistory(10, 1<<20)
	// Each read gets a fresh channel that the next append closes, the
	// terminal one too.
	for after, ev := range []struct {
		kind core.EventKind
		data string
	}{{core.EventOutput, "a"}, {core.EventDone, "{}"}} {
		r, _, _ := h.Since(uint64(after), 10)
		if chans.Closed(r.Wake) {
			t.Fatalf("Wake of a read after %d closed before the next append", after)
		}
		h.Append(ev.kind, 1, []byte(ev.data))
		if !chans.Closed(r.Wake) {
			t.Fatalf("Wake not closed by the Append of %s", ev.kind)
		}
	}
}

// An Append that no reader waits on makes no channel: the stream writer
// asks for one once per batch, not once per event.
func TestHistoryAppendWithoutReaderAllocatesNoWake(t *testing.T) {
	h := core.NewHistory(1<<20, 1<<40)
	data := []byte(`"x"`)
	// Averaged over many appends, the events slice's amortised growth
	// rounds to 0 allocations each; a channel per Append would be 1.
	if n := testing.AllocsPerRun(4096, func() { h.Append(core.EventOutput, 1, data) }); n >= 1 {
		t.Fatalf("Append allocates %.0f times with no reader, want 0", n)
	}
	// A reader that asks after those appends still gets woken by the next.
	r, _, _ := h.Since(h.Head(), 10)
	l := func() <-chan struct{} { _, _, w := h.Lag(h.Head()); return w }()
	if chans.Closed(r.Wake) || chans.Closed(l) {
		t.Fatal("Wake closed before the next append")
	}
	h.Append(core.EventOutput, 1, data)
	if !chans.Closed(r.Wake) || !chans.Closed(l) {
		t.Fatal("Wake of Since or Lag not closed by the next Append")
	}
}

func TestHistoryRefusesAppendAfterTerminal(t *testing.T) {
	for _, kind := range []core.EventKind{core.EventDone, core.EventError} {
		t.Run(string(kind), func(t *testing.T) {
			h := core.NewHistory(10, 1<<20)
			h.Append(core.EventAccepted, 0, []byte("{}"))
			if _, ok := h.Append(kind, 1, []byte("{}")); !ok {
				t.Fatal("terminal Append refused")
			}
			r, _, _ := h.Since(2, 10)
			wake := r.Wake
			if !r.Ended {
				t.Fatal("Ended = false after a terminal event")
			}
			for _, k := range []core.EventKind{core.EventOutput, core.EventDone, core.EventError, core.EventAccepted} {
				if ev, ok := h.Append(k, 1, []byte("{}")); ok {
					t.Fatalf("Append(%s) after terminal accepted: %+v", k, ev)
				}
			}
			if h.Head() != 2 {
				t.Fatalf("Head = %d, want 2", h.Head())
			}
			select {
			case <-wake:
				t.Fatal("a refused Append woke readers")
			default:
			}
		})
	}
}

func TestEventKindTerminal(t *testing.T) {
	for k, want := range map[core.EventKind]bool{
		core.EventAccepted: false, core.EventOutput: false, core.EventDone: true, core.EventError: true,
	} {
		if k.Terminal() != want {
			t.Errorf("%s.Terminal() = %v", k, !want)
		}
	}
}

func TestHistorySkipTo(t *testing.T) {
	h := core.NewHistory(100, 1<<20)
	appendN(t, h, 5, 10) // seqs 1..5, 10 bytes each
	tests := []struct {
		name      string
		after     uint64
		maxEvents int
		maxBytes  int64
		want      uint64
	}{
		{"within both bounds", 0, 10, 1000, 0},
		{"exactly at the bounds", 0, 5, 50, 0},
		{"over the event bound", 0, 3, 1000, 2},
		{"over the byte bound", 0, 10, 25, 3},
		{"both bounds, the tighter wins", 1, 3, 15, 4},
		{"nothing allowed keeps the newest", 0, 0, 0, 4},
		{"cursor already close", 3, 2, 20, 3},
		{"cursor at the newest but one", 4, 0, 0, 4},
		{"cursor at the head", 5, 0, 0, 5},
		{"cursor beyond the head", 9, 0, 0, 9},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := h.SkipTo(tt.after, tt.maxEvents, tt.maxBytes)
			if got != tt.want {
				t.Fatalf("SkipTo(%d, %d, %d) = %d, want %d", tt.after, tt.maxEvents, tt.maxBytes, got, tt.want)
			}
			if got < tt.after {
				t.Fatalf("SkipTo moved the cursor backwards")
			}
		})
	}
}

func TestHistorySkipToPastRetention(t *testing.T) {
	h := core.NewHistory(3, 1<<20)
	appendN(t, h, 5, 1) // retained: 3, 4, 5
	if got := h.SkipTo(0, 10, 1000); got != 2 {
		t.Fatalf("SkipTo from a dropped position = %d, want 2 (just before the oldest retained)", got)
	}
	if _, _, err := h.Since(h.SkipTo(0, 10, 1000), 10); err != nil {
		t.Fatalf("Since(SkipTo(...)) = %v: a skipped-to cursor must be readable", err)
	}
	if got := core.NewHistory(3, 1<<20).SkipTo(7, 0, 0); got != 7 {
		t.Fatalf("SkipTo on an empty history = %d, want the cursor unchanged", got)
	}
}

// TestHistorySkipToBoundsLag checks the contract over many shapes: after a
// skip the lag is within the bounds (unless only the newest is left), the
// cursor never moves backwards, and it never skips the newest event.
func TestHistorySkipToBoundsLag(t *testing.T) {
	for size := 1; size <= 7; size += 3 {
		h := core.NewHistory(8, 1<<20)
		for i := range 12 {
			h.Append(core.EventOutput, 1, make([]byte, size*(i%3+1)))
		}
		head := h.Head()
		for after := uint64(0); after <= head; after++ {
			for maxEvents := 0; maxEvents <= 9; maxEvents++ {
				for _, maxBytes := range []int64{0, 5, 13, 40, 1000} {
					got := h.SkipTo(after, maxEvents, maxBytes)
					if got < after || (after < head && got >= head) {
						t.Fatalf("SkipTo(%d, %d, %d) = %d with head %d", after, maxEvents, maxBytes, got, head)
					}
					r, _, err := h.Since(got, 100)
					if err != nil {
						t.Fatalf("Since(SkipTo(%d, %d, %d) = %d): %v", after, maxEvents, maxBytes, got, err)
					}
					if r.LagEvents > 1 && (r.LagEvents > maxEvents || r.LagBytes > maxBytes) {
						t.Fatalf("SkipTo(%d, %d, %d) = %d leaves lag %d events %d bytes", after, maxEvents, maxBytes, got, r.LagEvents, r.LagBytes)
					}
					// Not more than needed: one event less skipped would
					// break a bound (or the cursor did not move at all).
					if got > after {
						r0, first, err := h.Since(got-1, 100)
						if err == nil && got-1 >= first-1 && r0.LagEvents <= maxEvents && r0.LagBytes <= maxBytes {
							t.Fatalf("SkipTo(%d, %d, %d) = %d skipped more than needed", after, maxEvents, maxBytes, got)
						}
					}
				}
			}
		}
	}
}

// stops are lagWait's stop funcs by channel.
var stops = map[<-chan struct{}]func() bool{}

// lagWait is LagFunc with a callback that closes a channel.
func lagWait(h *core.History, after uint64, maxEvents int, maxBytes int64) (int, int64, bool, <-chan struct{}) {
	c := make(chan struct{})
	e, b, over, stop := h.LagFunc(after, maxEvents, maxBytes, func() { close(c) })
	stops[c] = stop
	return e, b, over, c
}

// wantWokenPast checks that wake is still open after n more appends (of
// 10 bytes), which reach a LagFunc's bound of what (events, bytes), and
// closed by the next one, which passes it.
func wantWokenPast(t *testing.T, h *core.History, wake <-chan struct{}, n int, what string) {
	t.Helper()
	appendN(t, h, n, 10)
	if chans.Closed(wake) {
		t.Fatalf("woken at the %s bound, not past it", what)
	}
	appendN(t, h, 1, 10)
	if !chans.Closed(wake) {
		t.Fatalf("not woken past the %s bound", what)
	}
}

// LagFunc agrees with Lag on the lag, and its func runs in the append
// that takes the lag past a bound, not before.
func TestHistoryLagFunc(t *testing.T) {
	h := core.NewHistory(100, 1<<20)
	appendN(t, h, 5, 10) // seqs 1..5, 10 bytes each
	for _, after := range []uint64{0, 1, 3, 5, 9} {
		e, b, _ := h.Lag(after)
		we, wb, over, _ := lagWait(h, after, 100, 1<<20)
		if we != e || wb != b || over {
			t.Errorf("LagFunc(%d) = %d, %d, %v; Lag = %d, %d", after, we, wb, over, e, b)
		}
	}

	// By events: from cursor 3 (lag 2), a bound of 4 passes at seq 8.
	_, _, over, wake := lagWait(h, 3, 4, 1<<20)
	if over {
		t.Fatal("over before the bound")
	}
	wantWokenPast(t, h, wake, 2, "events") // seqs 6, 7: lag 4; seq 8: lag 5
	if e, _, over, _ := lagWait(h, 3, 4, 1<<20); !over || e != 5 {
		t.Errorf("LagFunc past the bound = %d, %v; want 5, over", e, over)
	}

	// By bytes: from the head (seq 8), 25 bytes pass with the third event.
	_, _, _, wake = lagWait(h, 8, 100, 25)
	wantWokenPast(t, h, wake, 2, "bytes") // 20 bytes, then 30

	// A stopped wait is never closed, and Append forgets it.
	_, _, _, wake = lagWait(h, h.Head(), 1, 1<<20)
	if !stops[wake]() {
		t.Error("stop of a waiting LagFunc reported it had run")
	}
	appendN(t, h, 3, 10)
	if chans.Closed(wake) {
		t.Error("a stopped LagFunc ran")
	}
	// The stop of one that ran reports it.
	_, _, _, wake = lagWait(h, h.Head(), 0, 1<<20)
	appendN(t, h, 1, 10)
	if !chans.Closed(wake) || stops[wake]() {
		t.Error("a LagFunc that ran: not run, or its stop reported it dropped")
	}
}

// A cursor at or before the oldest retained event counts what is retained,
// as Lag does.
func TestHistoryLagFuncPastRetention(t *testing.T) {
	h := core.NewHistory(3, 1<<20)
	appendN(t, h, 6, 10) // retains 4..6
	for _, after := range []uint64{0, 2, 3, 4} {
		e, b, _ := h.Lag(after)
		we, wb, over, wake := lagWait(h, after, 5, 1<<20)
		if we != e || wb != b || over {
			t.Errorf("LagFunc(%d) = %d, %d, %v; Lag = %d, %d", after, we, wb, over, e, b)
		}
		stops[wake]()
	}
	_, _, _, wake := lagWait(h, 0, 4, 1<<20) // lag 3 (4..6)
	wantWokenPast(t, h, wake, 1, "events")
}

// A job's history of an accepted event, 16 outputs and its end grows its
// events in three arrays, not append's six from one; a history at its
// bound keeps appending without an array per few events.
func TestHistoryGrowsInFewSteps(t *testing.T) {
	if core.RaceEnabled {
		t.Skip("allocation counts differ under the race detector")
	}
	data := []byte(`{"data":"x"}`)
	// NewHistory, 3 arrays of events, and the end's compaction (2).
	if n := testing.AllocsPerRun(100, func() {
		h := core.NewHistory(1024, 1<<20)
		h.Append(core.EventAccepted, 0, data)
		for range 16 {
			h.Append(core.EventOutput, 1, data)
		}
		h.Append(core.EventDone, 1, data)
	}); n > 6 {
		t.Fatalf("a job's 18 events cost %v allocations, want 6", n)
	}
	h := core.NewHistory(100, 1<<20)
	for range 1000 {
		h.Append(core.EventOutput, 1, data)
	}
	if n := testing.AllocsPerRun(1000, func() { h.Append(core.EventOutput, 1, data) }); n > 0.05 {
		t.Fatalf("an append at the history's bound costs %v allocations", n)
	}
}
