package core

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// Events carved from a job's slab are what outputEvent makes of each
// output, stay so as later ones are carved (none overlaps or can be
// appended into another), and cost an allocation per slab, not per event;
// an output too large for a slab, one that needs HTML escapes and one that
// is refused take nothing of it.
func TestEventSlab(t *testing.T) {
	var s eventSlab
	var outs, evs [][]byte
	add := func(out []byte) {
		t.Helper()
		ev, _, ok := appendOutputEvent(s.take(outputEventMax(out)), out)
		want, _, wantOK := outputEvent(out)
		if ok != wantOK || !bytes.Equal(ev, want) {
			t.Fatalf("from the slab %q, %v; outputEvent %q, %v", ev, ok, want, wantOK)
		}
		if !ok {
			return
		}
		ev = s.keep(ev)
		if cap(ev) != len(ev) {
			t.Fatalf("event data of %d bytes has room for %d", len(ev), cap(ev))
		}
		outs, evs = append(outs, out), append(evs, ev)
	}
	for i := range 500 {
		switch {
		case i%97 == 0:
			add([]byte(`"` + strings.Repeat("x", slabMax) + `"`)) // an array of its own
		case i%31 == 0:
			add([]byte(`"<b>"`)) // escaped in an array of its own
		case i%17 == 0:
			add([]byte(`{"a":1,"a":2}`)) // refused
		case i%13 == 0:
			add([]byte(`"` + strings.Repeat("y", 100*(i%20)) + `"`)) // up to 1.9 KB: a new slab, larger than the last
		case i == 1:
			add([]byte(`"` + strings.Repeat("z", 1000) + `"`)) // larger than the first slab
		default:
			add(fmt.Appendf(nil, ` { "i" : %d } `, i)) // compacted in place
		}
	}
	for i, ev := range evs {
		if want, _, _ := outputEvent(outs[i]); !bytes.Equal(ev, want) {
			t.Fatalf("event %d changed to %q, want %q", i, ev, want)
		}
	}

	var fresh eventSlab
	out := []byte(`"0123456789012345678901234567890"`) // 33 bytes, 43 as an event
	if a := testing.AllocsPerRun(1, func() {
		for range 1000 {
			ev, _, _ := appendOutputEvent(fresh.take(outputEventMax(out)), out)
			fresh.keep(ev)
		}
	}); a > 1000*43/slabMax+5 {
		t.Fatalf("1000 events of 43 bytes cost %v allocations", a)
	}
}

// newID is its prefix and 16 characters of the lower-case base32 alphabet
// (80 random bits), in one allocation.
func TestNewID(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := newID("j_")
		if len(id) != 18 || !strings.HasPrefix(id, "j_") || strings.Trim(id[2:], "0123456789abcdefghijklmnopqrstuv") != "" || seen[id] {
			t.Fatalf("newID = %q", id)
		}
		seen[id] = true
	}
	if a := testing.AllocsPerRun(100, func() { newID("j_") }); a != 1 && !raceEnabled {
		t.Fatalf("newID allocates %v times, want 1", a)
	}
}
