// Package ticktest is test plumbing: a test's periodic work (sampling a
// metric, feeding a stream, trickling a request) in a goroutine the test
// owns, and a wait for something asynchronous, a condition polled in the
// test's own goroutine until it holds.
package ticktest

import (
	"sync"
	"testing"
	"time"
)

// Every calls f every d, from a goroutine of its own, until f returns
// false or stop is called. stop waits for that goroutine to return, so f
// runs no more once it has (and what f wrote may be read); call it once.
func Every(d time.Duration, f func() bool) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(d)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			if !f() {
				return
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}

// WaitFor calls cond every 5ms until it holds and returns how long that
// took; once timeout has passed it fails tb, naming what it waited for.
// It is how real-clock tests wait for something asynchronous, never a
// bare sleep.
func WaitFor(tb testing.TB, timeout time.Duration, what string, cond func() bool) time.Duration {
	tb.Helper()
	return WaitEvery(tb, 5*time.Millisecond, timeout, what, cond)
}

// WaitEvery is WaitFor calling cond every every instead: a cond that costs
// more (a request to a node) is called less often.
func WaitEvery(tb testing.TB, every, timeout time.Duration, what string, cond func() bool) time.Duration {
	tb.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > timeout {
			tb.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(every)
	}
	return time.Since(start)
}
