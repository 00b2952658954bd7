package coretest

import (
	"errors"
	"testing"

	"github.com/switchyard/switchyard/core"
)

// FillOutbox checks a worker session's send queue at its bounds: it calls
// send, which queues one message of a fixed size into out, until out
// refuses one (at most 2*count times), and fails tb unless the refusal is
// core.ErrSendQueueFull from the bound byBytes names and out accounts for
// exactly what it took. The byte bound refuses before count messages are
// queued, with no room for one more of the size; the count bound refuses
// at count. out must be empty when it is called, with nothing taking from
// it. It returns how many messages out took.
func FillOutbox[T any](tb testing.TB, out *core.Outbox[T], count int, maxBytes int64, byBytes bool, send func() error) (queued int) {
	tb.Helper()
	var err error
	for range 2 * count {
		if err = send(); err != nil {
			break
		}
		queued++
	}
	if !errors.Is(err, core.ErrSendQueueFull) {
		tb.Fatalf("after %d messages: %v, want %v", queued, err, core.ErrSendQueueFull)
	}
	held := out.Bytes()
	if out.Len() != queued || queued == 0 {
		tb.Fatalf("%d messages queued of %d taken", out.Len(), queued)
	}
	size := held / int64(queued)
	if got := queued < count; got != byBytes {
		tb.Fatalf("refused with %d of %d messages queued (%d bytes of %d): the wrong bound", queued, count, held, maxBytes)
	}
	if held > maxBytes || (byBytes && held+size <= maxBytes) {
		tb.Fatalf("%d bytes queued (messages of %d bytes), bound %d: refused with room left, or over the bound", held, size, maxBytes)
	}
	tb.Logf("%d messages of %d bytes queued (%d bytes), then: %v", queued, size, held, err)
	return queued
}
