package catalog

import (
	"maps"
	"slices"
	"sync"
	"testing"

	"github.com/switchyard/switchyard/core"
)

func consumerRec(queue, id, node string, caps core.Capabilities) core.ConsumerInfo {
	return core.ConsumerInfo{Queue: queue, ID: id, Node: node, Capabilities: caps, Concurrency: 1}
}

// deepCopy copies records and their capabilities, to compare a snapshot
// with what it held.
func deepCopy(cs []core.ConsumerInfo) []core.ConsumerInfo {
	out := slices.Clone(cs)
	for i := range out {
		out[i] = cloneConsumer(out[i])
	}
	return out
}

func equalConsumers(a, b []core.ConsumerInfo) bool {
	return slices.EqualFunc(a, b, func(x, y core.ConsumerInfo) bool {
		return x.Queue == y.Queue && x.ID == y.ID && x.Node == y.Node && x.Concurrency == y.Concurrency &&
			maps.EqualFunc(x.Capabilities, y.Capabilities, slices.Equal)
	})
}

// A queue's consumers come as one snapshot, shared until the queue's
// records change: the same array every read, no copy; a change (a put, a
// delete, a reload) brings a new one, and the snapshot a reader held stays
// as it was.
func TestConsumersSnapshot(t *testing.T) {
	v := newView()
	if got := v.consumersOf("q"); got != nil {
		t.Fatalf("no consumers: got %v", got)
	}
	caps := core.Capabilities{"model": {"a"}}
	v.setConsumer(consumerRec("q", "w2", "n2", caps))
	v.setConsumer(consumerRec("q", "w1", "n1", nil))
	v.setConsumer(consumerRec("other", "w9", "n1", nil))

	s1 := v.consumersOf("q")
	if ids := []string{s1[0].ID, s1[1].ID}; !slices.Equal(ids, []string{"w1", "w2"}) {
		t.Fatalf("snapshot ids = %v, want sorted [w1 w2]", ids)
	}
	if s2 := v.consumersOf("q"); &s2[0] != &s1[0] {
		t.Fatal("a second read copied the snapshot")
	}
	if cap(s1) != len(s1) {
		t.Fatalf("snapshot has spare capacity %d > %d: an append would write into it", cap(s1), len(s1))
	}
	// The record the store parsed is not the snapshot's: a later change to
	// what was passed in does not reach readers.
	caps["model"][0] = "changed"
	if got := s1[1].Capabilities["model"][0]; got != "a" {
		t.Fatalf("snapshot shares the record's capabilities: model = %q", got)
	}
	before := deepCopy(s1)

	// A change to another queue leaves this one's snapshot shared.
	v.setConsumer(consumerRec("other", "w8", "n1", nil))
	if s := v.consumersOf("q"); &s[0] != &s1[0] {
		t.Fatal("a change to another queue dropped this queue's snapshot")
	}

	// A put replaces the snapshot; the old one is untouched.
	v.setConsumer(consumerRec("q", "w2", "n2", core.Capabilities{"model": {"b"}}))
	s3 := v.consumersOf("q")
	if &s3[0] == &s1[0] || s3[1].Capabilities["model"][0] != "b" {
		t.Fatalf("after a put: %v, want a new snapshot with w2 model=b", s3)
	}
	if !equalConsumers(s1, before) {
		t.Fatalf("a put changed a snapshot already handed out: %v, was %v", s1, before)
	}

	// A delete too.
	v.deleteConsumer("q", "w1")
	if s := v.consumersOf("q"); len(s) != 1 || s[0].ID != "w2" {
		t.Fatalf("after deleting w1: %v", s)
	}
	v.deleteConsumer("q", "w2")
	if s := v.consumersOf("q"); s != nil {
		t.Fatalf("after deleting every consumer: %v, want nil", s)
	}
	if _, ok := v.snaps["q"]; ok {
		t.Fatal("a queue without consumers keeps a snapshot")
	}

	// A reload (replaceWith) drops every snapshot.
	o1 := v.consumersOf("other")
	fresh := newView()
	fresh.setConsumer(consumerRec("other", "w7", "n3", nil))
	v.replaceWith(fresh)
	if s := v.consumersOf("other"); len(s) != 1 || s[0].ID != "w7" {
		t.Fatalf("after a reload: %v, want [w7]", s)
	}
	if len(o1) != 2 || o1[0].ID != "w8" || o1[1].ID != "w9" {
		t.Fatalf("a reload changed a snapshot already handed out: %v", o1)
	}
}

// Readers racing with the watch's writes each see a whole snapshot, of
// the state before a change or after it (run with -race).
func TestConsumersSnapshotConcurrent(t *testing.T) {
	v := newView()
	v.setConsumer(consumerRec("q", "w0", "n1", nil))
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 2000 {
				s := v.consumersOf("q")
				if len(s) < 1 || len(s) > 2 || s[0].ID != "w0" {
					t.Errorf("snapshot %v", s)
					return
				}
			}
		})
	}
	for i := range 500 {
		v.mu.Lock()
		if i%2 == 0 {
			v.setConsumer(consumerRec("q", "w1", "n2", core.Capabilities{"i": {"x"}}))
		} else {
			v.deleteConsumer("q", "w1")
		}
		v.mu.Unlock()
	}
	wg.Wait()
}

// BenchmarkConsumersOf is one read of a queue's consumers, as the
// dispatcher makes one per dispatch pass and the ingress two per submit,
// with no change between reads: one consumer without capabilities (the
// demo worker of BenchmarkProcesses), and four of three capabilities each.
func BenchmarkConsumersOf(b *testing.B) {
	for _, bc := range []struct {
		name string
		ids  []string
		caps core.Capabilities
	}{
		{"1x0caps", []string{"w1"}, nil},
		{"4x3caps", []string{"w4", "w2", "w3", "w1"}, core.Capabilities{"model": {"a", "b"}, "gpu": {"x"}, "zone": {"z"}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			v := newView()
			for _, id := range bc.ids {
				v.setConsumer(consumerRec("q", id, "n-"+id, bc.caps))
			}
			b.ReportAllocs()
			for b.Loop() {
				if len(v.consumersOf("q")) != len(bc.ids) {
					b.Fatal("consumers lost")
				}
			}
		})
	}
}
