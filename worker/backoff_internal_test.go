package worker

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v5"
)

func TestSessionBackOffCappedAndReset(t *testing.T) {
	var healthy atomic.Bool
	b := &sessionBackOff{
		inner: &backoff.ExponentialBackOff{
			InitialInterval: 10 * time.Millisecond, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: 100 * time.Millisecond,
		},
		max:   100 * time.Millisecond,
		reset: &healthy,
	}
	b.Reset()
	for i := range 20 {
		if d := b.NextBackOff(); d > 100*time.Millisecond || d < 0 {
			t.Fatalf("attempt %d: backoff %s outside 0..100ms", i, d)
		}
	}
	healthy.Store(true)
	// After a healthy session the delay starts over: ≤ 1.5 × the initial one.
	if d := b.NextBackOff(); d > 15*time.Millisecond {
		t.Fatalf("after a healthy session: backoff %s, want a fresh start", d)
	}
	if healthy.Load() {
		t.Fatal("healthy flag not consumed")
	}
}
