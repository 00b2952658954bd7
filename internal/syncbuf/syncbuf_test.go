package syncbuf

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
)

// Writers and a reader at once lose nothing (and -race sees no race);
// Lines keeps the matching lines whole, in order.
func TestConcurrentWritesAndLines(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 100 {
				fmt.Fprintf(&b, "w%d line %d\n", w, i)
			}
		})
	}
	wg.Go(func() {
		for range 100 {
			_ = b.String()
		}
	})
	wg.Wait()
	if n := strings.Count(b.String(), "\n"); n != 400 {
		t.Fatalf("%d lines written, want 400", n)
	}
	got := b.Lines("w2 line 9")
	want := []string{"w2 line 9"}
	for i := 90; i < 100; i++ {
		want = append(want, fmt.Sprintf("w2 line %d", i))
	}
	if !slices.Equal(got, want) {
		t.Errorf("Lines = %q, want %q", got, want)
	}
}

// A last line without a newline counts; an empty buffer has none.
func TestLinesEdges(t *testing.T) {
	var b Buffer
	if got := b.Lines(""); got != nil {
		t.Errorf("empty: %q, want none", got)
	}
	b.Write([]byte("a x\nb\nc x"))
	if got := b.Lines("x"); !slices.Equal(got, []string{"a x", "c x"}) {
		t.Errorf("Lines(x) = %q", got)
	}
}

// Appenders and a reader at once lose nothing; All is a copy the list's
// later appends do not change.
func TestListConcurrentAppendsAndAll(t *testing.T) {
	var l List[int]
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 100 {
				l.Append(w*100 + i)
			}
		})
	}
	wg.Go(func() {
		for range 100 {
			_ = l.All()
		}
	})
	wg.Wait()
	got := l.All()
	if len(got) != 400 || l.Len() != 400 {
		t.Fatalf("%d values (Len %d), want 400", len(got), l.Len())
	}
	slices.Sort(got)
	for i, v := range got {
		if v != i {
			t.Fatalf("value %d is %d: a value was lost or doubled", i, v)
		}
	}
	got[0] = -1
	l.Append(400)
	if again := l.All(); again[0] == -1 || len(again) != 401 {
		t.Errorf("All after a change to its last result and an append = %v..., %d values", again[:1], len(again))
	}
}
