package httpapi

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/internal/coretest"
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
			coretest.FillOutbox(t, ss.out, tc.count, tc.maxBytes, tc.byBytes, func() error { return tc.send(ss) })
		})
	}
}
