package peer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/switchyard/switchyard/core"
)

// AwaitAcks returns once every message sent has been acknowledged — the
// receiver handled it — and, at its deadline, says what a receiver that
// holds a message up has not acknowledged yet.
func TestAwaitAcks(t *testing.T) {
	release := make(chan struct{})
	h := &gatedRecorder{block: holdUntil(release, func(m core.Message) bool { return m.JobID == "held" })}
	b := startServerOn(t, "127.0.0.1:0", "b", h)
	a := newRouter(t, "a", secret, newBook("b", b.addr).Addr, nil)

	const n = 10
	for i := range n {
		a.Send("b", deliverMsg("q", "j", i))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.AwaitAcks(ctx); err != nil {
		t.Fatalf("AwaitAcks: %v", err)
	}
	if got := len(h.messages()); got != n {
		t.Fatalf("AwaitAcks returned with %d of %d messages handled", got, n)
	}

	a.Send("b", deliverMsg("other", "held", 0))
	short, cancelShort := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancelShort()
	if err := a.AwaitAcks(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("AwaitAcks with a message held up = %v, want the deadline", err)
	}
	close(release)
	if err := a.AwaitAcks(ctx); err != nil {
		t.Fatalf("AwaitAcks once the receiver let go: %v", err)
	}
}
