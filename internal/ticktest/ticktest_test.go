package ticktest

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/switchyard/switchyard/internal/tbtest"
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

// wait runs WaitEvery as a test would and returns what it returned and
// the failure it reported ("" if none).
func wait(every, timeout time.Duration, cond func() bool) (took time.Duration, failed string) {
	failures := tbtest.Run(func(tb testing.TB) { took = WaitEvery(tb, every, timeout, "the thing", cond) })
	return took, strings.Join(failures, "; ")
}

// WaitEvery (WaitFor's loop) returns once cond holds, having called it
// until then, and says how long that took.
func TestWaitReturnsOnceCondHolds(t *testing.T) {
	calls := 0
	took, failed := wait(time.Millisecond, time.Minute, func() bool {
		calls++
		return calls == 3
	})
	if failed != "" || calls != 3 {
		t.Fatalf("failed %q after %d calls, want no failure after 3", failed, calls)
	}
	if took < 2*time.Millisecond || took > 10*time.Second {
		t.Fatalf("took %v for two 1ms pauses", took)
	}
	if took, failed := wait(time.Hour, time.Minute, func() bool { return true }); failed != "" || took > time.Second {
		t.Fatalf("a cond that holds at once: took %v, failed %q", took, failed)
	}
}

// A cond that never holds fails the test after the timeout, naming what
// it waited for.
func TestWaitFailsAfterTimeout(t *testing.T) {
	start := time.Now()
	_, failed := wait(time.Millisecond, 20*time.Millisecond, func() bool { return false })
	if want := "timed out after 20ms waiting for the thing"; failed != want {
		t.Fatalf("failed %q, want %q", failed, want)
	}
	if d := time.Since(start); d < 20*time.Millisecond {
		t.Fatalf("failed after %v, before the 20ms timeout", d)
	}
}
