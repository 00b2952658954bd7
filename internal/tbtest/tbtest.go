// Package tbtest tests test plumbing: it runs a helper that takes a
// testing.TB against one that records what the helper reports, where a
// real one would fail the test that runs it.
package tbtest

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
)

// Run calls f in a goroutine of its own, as a test runs, with a
// testing.TB that records each failure reported to it (Errorf, Fatalf)
// and whose Fatalf ends that goroutine, as testing's does. It returns,
// once f has returned or called Fatalf, the failures in order (none: f
// passed). Helper and Logf do nothing; f's calling any other method of
// the TB panics.
func Run(f func(tb testing.TB)) []string {
	r := &recorder{}
	var wg sync.WaitGroup
	wg.Go(func() { f(r) })
	wg.Wait()
	return r.failures
}

// recorder is Run's testing.TB. Its embedded TB is nil: the methods it
// does not define panic.
type recorder struct {
	testing.TB
	failures []string
}

func (r *recorder) Helper()             {}
func (r *recorder) Logf(string, ...any) {}

func (r *recorder) Errorf(format string, args ...any) {
	r.failures = append(r.failures, fmt.Sprintf(format, args...))
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	runtime.Goexit()
}
