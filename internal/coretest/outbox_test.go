package coretest

import (
	"errors"
	"testing"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/internal/tbtest"
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
		queued := 0
		got := tbtest.Run(func(tb testing.TB) { queued = FillOutbox(tb, out, tc.count, tc.maxBytes, tc.byBytes, send) })
		if pass := len(got) == 0; pass != tc.pass || queued != tc.queued {
			t.Errorf("%s: passed %v with %d queued, want %v with %d (%q)", tc.name, pass, queued, tc.pass, tc.queued, got)
		}
	}
}
