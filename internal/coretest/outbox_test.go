package coretest

import (
	"errors"
	"sync"
	"testing"

	"github.com/switchyard/switchyard/core"
)

// FillOutbox passes an outbox refusing at the bound named, and fails one
// refusing at the other bound, one that never refuses, and one that
// refuses for another reason.
func TestFillOutbox(t *testing.T) {
	for _, tc := range []struct {
		name     string
		count    int
		maxBytes int64
		size     int64
		byBytes  bool
		broken   bool // send fails with another error on its third call
		pass     bool
		queued   int
	}{
		{"count bound", 8, 1 << 20, 100, false, false, true, 8},
		{"byte bound", 100, 1000, 300, true, false, true, 3},
		{"byte bound, exactly full", 100, 900, 300, true, false, true, 3},
		{"count bound named, byte bound hit", 100, 1000, 300, false, false, false, 0},
		{"byte bound named, count bound hit", 8, 1 << 20, 100, true, false, false, 0},
		{"refused for another reason", 8, 1 << 20, 100, false, true, false, 0},
	} {
		out := core.NewOutbox[int](tc.count, tc.maxBytes, nil)
		calls := 0
		send := func() error {
			if calls++; tc.broken && calls == 3 {
				return errors.New("stream broken")
			}
			return out.Offer(1, tc.size)
		}
		f := &failures{}
		queued := 0
		var wg sync.WaitGroup
		wg.Go(func() { queued = FillOutbox(f, out, tc.count, tc.maxBytes, tc.byBytes, send) })
		wg.Wait()
		if pass := len(f.got) == 0; pass != tc.pass || queued != tc.queued {
			t.Errorf("%s: passed %v with %d queued, want %v with %d (%q)", tc.name, pass, queued, tc.pass, tc.queued, f.got)
		}
	}
}
