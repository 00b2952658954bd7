package ticktest

import (
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// f runs again and again until stop, which returns once f's goroutine
// has.
func TestEveryUntilStop(t *testing.T) {
	var calls atomic.Int32
	reached := make(chan struct{})
	stop := Every(time.Millisecond, func() bool {
		if calls.Add(1) == 3 {
			close(reached)
		}
		return true
	})
	<-reached
	stop()
	// Its goroutine is gone: f cannot run again.
	goleak.VerifyNone(t)
}

// f returning false ends the calls; stop still returns.
func TestEveryUntilFalse(t *testing.T) {
	calls := 0
	ended := make(chan struct{})
	stop := Every(time.Millisecond, func() bool {
		calls++
		if calls == 2 {
			close(ended)
			return false
		}
		return true
	})
	<-ended
	stop()
	if calls != 2 {
		t.Fatalf("f ran %d times, want 2: it must not run after it returned false", calls)
	}
}
