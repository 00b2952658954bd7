package core

import "testing"

// The unread queue keeps order and counts through every mix of pushes and
// takes, and a reader that keeps within the inline array allocates none.
func TestPaceUnreadQueue(t *testing.T) {
	p := newPace(OutputCredit{Events: 1 << 20, Bytes: 1 << 30}, 0)
	var next, took uint64 // next seq to push; everything up to took is taken
	check := func() {
		t.Helper()
		q := p.unread[p.head:]
		if uint64(len(q)) != next-took {
			t.Fatalf("%d unread, want %d (pushed %d, took up to %d)", len(q), next-took, next, took)
		}
		for i, u := range q {
			if u.seq != took+1+uint64(i) || u.bytes != int64(u.seq) {
				t.Fatalf("unread[%d] = %+v, want seq %d", i, u, took+1+uint64(i))
			}
		}
		if p.taken.Events != int64(took) {
			t.Fatalf("taken %d, want %d", p.taken.Events, took)
		}
	}
	// Pushes of 1..7 outputs, takes of all but 0..3 of them: the queue
	// slides, wraps to its front and grows.
	for round := range 200 {
		for range 1 + round%7 {
			next++
			p.pushUnread(next, int64(next))
			check()
		}
		upTo := next - uint64(round%4)
		if upTo > took {
			n, bytes := p.takeUnread(upTo)
			var want int64
			for s := took + 1; s <= upTo; s++ {
				want += int64(s)
			}
			if uint64(n) != upTo-took || bytes != want {
				t.Fatalf("took %d outputs of %d bytes, want %d of %d", n, bytes, upTo-took, want)
			}
			took = upTo
		}
		check()
	}
	if cap(p.unread) > 4*unreadInline {
		t.Fatalf("the queue grew to %d for at most 9 unread outputs", cap(p.unread))
	}

	q := newPace(OutputCredit{Events: 1 << 20, Bytes: 1 << 30}, 0)
	var seq uint64
	if a := testing.AllocsPerRun(100, func() {
		for range unreadInline {
			seq++
			q.pushUnread(seq, 10)
		}
		q.takeUnread(seq)
	}); a != 0 {
		t.Fatalf("%v allocations per window of %d outputs taken, want none", a, unreadInline)
	}
}
