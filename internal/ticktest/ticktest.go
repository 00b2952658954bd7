// Package ticktest is test plumbing: a test's periodic work (sampling a
// metric, feeding a stream, trickling a request) in a goroutine the test
// owns.
package ticktest

import (
	"sync"
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
