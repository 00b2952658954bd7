package httpapi

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/switchyard/switchyard/core"
)

// A session's queue of events is bounded by count and by bytes: an offer
// or cancel that does not fit fails (and the engine drops the session), and
// what was refused is not accounted.
func TestWorkerSessionQueueBounds(t *testing.T) {
	big := core.Offer{JobID: "j", Gen: 1, Queue: "q", Input: json.RawMessage(`"` + strings.Repeat("x", 1000) + `"`)}
	for _, tc := range []struct {
		name     string
		count    int
		maxBytes int64
		send     func(*workerSession) error
		byBytes  bool
	}{
		{"byte bound", 1000, 10 << 10, func(ss *workerSession) error { return ss.SendOffer(big) }, true},
		{"count bound", 8, 1 << 20, func(ss *workerSession) error { return ss.SendCancel("j", 1, core.CodeCancelled) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ss := &workerSession{done: make(chan struct{})}
			ss.out = core.NewOutbox[workerEvent](tc.count, tc.maxBytes, ss.done)
			accepted := 0
			var err error
			for range 2 * tc.count {
				if err = tc.send(ss); err != nil {
					break
				}
				accepted++
			}
			if !errors.Is(err, core.ErrSendQueueFull) {
				t.Fatalf("after %d events: %v, want %v", accepted, err, core.ErrSendQueueFull)
			}
			held := ss.out.Bytes()
			if ss.out.Len() != accepted || held > tc.maxBytes {
				t.Fatalf("%d queued of %d accepted, %d bytes of %d", ss.out.Len(), accepted, held, tc.maxBytes)
			}
			if byBytes := accepted < tc.count; byBytes != tc.byBytes {
				t.Fatalf("refused at %d of %d events (%d bytes of %d): the wrong bound", accepted, tc.count, held, tc.maxBytes)
			}
		})
	}
}
