// Package loadgen is what the closed-loop loads of the tests share: the
// fault suite's and the rolling restart's (integration) and the compose
// tests' (integration/compose). Each posts streamed jobs from clients in a
// closed loop and records every job as its client saw it; this package
// holds the loop's lifetime (stop, drain, halt), its record of jobs (Job:
// the answer and the stream as the client saw them), and how a client
// reads an answer. What a job is (its input, what it requires), and how it
// is posted and its stream read, is each suite's.
package loadgen

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Loop is a closed loop of clients and the jobs they recorded (J is the
// suite's job record). Its goroutines run in WG and end with Halt.
type Loop[J any] struct {
	HTTP *http.Client
	// Ctx ends when the loop is halted: every open stream is cut.
	Ctx    context.Context
	cancel context.CancelFunc
	// Stopping: no client posts a new job. Halted: open streams are
	// being cut by the suite (a stream that ends then is open, not
	// broken).
	Stopping atomic.Bool
	Halted   atomic.Bool
	WG       sync.WaitGroup

	// Mu guards Jobs and every job in it.
	Mu   sync.Mutex
	Jobs []*J
}

// NewLoop is a loop whose HTTP client keeps a connection per client.
func NewLoop[J any](clients int) *Loop[J] {
	l := &Loop[J]{HTTP: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: max(clients, 1)}}}
	l.Ctx, l.cancel = context.WithCancel(context.Background())
	return l
}

// Start runs each client on a goroutine of the loop's, client k after
// k×stagger: the jobs in flight at any moment are then at every stage of
// their run (started together, they would stay in step: a fault would
// catch all of them thinking, or all streaming).
func (l *Loop[J]) Start(clients int, stagger time.Duration, run func(k int)) {
	for k := range clients {
		l.WG.Go(func() {
			if l.Pause(time.Duration(k) * stagger) {
				run(k)
			}
		})
	}
}

// Add records a new job.
func (l *Loop[J]) Add(j *J) {
	l.Mu.Lock()
	l.Jobs = append(l.Jobs, j)
	l.Mu.Unlock()
}

// Pause waits d, or reports false if the loop was halted first.
func (l *Loop[J]) Pause(d time.Duration) bool {
	select {
	case <-l.Ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// Stop lets every client finish the job it has and post no more.
func (l *Loop[J]) Stop() { l.Stopping.Store(true) }

// Drain waits up to timeout for the clients' last streams to end, then
// cuts those still open (Halt).
func (l *Loop[J]) Drain(timeout time.Duration) {
	done := make(chan struct{})
	go func() { l.WG.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
		l.Halt()
	}
	<-done
}

// Halt cuts every open stream and waits for the clients.
func (l *Loop[J]) Halt() {
	l.Halted.Store(true)
	l.cancel()
	l.WG.Wait()
	l.HTTP.CloseIdleConnections()
}

// Snapshot copies every job recorded so far with clone, under Mu.
func (l *Loop[J]) Snapshot(clone func(*J) J) []J {
	l.Mu.Lock()
	defer l.Mu.Unlock()
	out := make([]J, len(l.Jobs))
	for i, j := range l.Jobs {
		out[i] = clone(j)
	}
	return out
}

// Count is how many jobs satisfy f, under Mu.
func (l *Loop[J]) Count(f func(*J) bool) int {
	l.Mu.Lock()
	defer l.Mu.Unlock()
	n := 0
	for _, j := range l.Jobs {
		if f(j) {
			n++
		}
	}
	return n
}

// Refusal reads a refused POST's answer as a client should: its problem
// code (http_<status> without one), and how long to wait before the next
// job, Retry-After bounded to between 200ms and 1s so the load comes back
// soon after the cluster does. It closes nothing.
func Refusal(res *http.Response) (code string, wait time.Duration) {
	b, _ := io.ReadAll(io.LimitReader(res.Body, 64<<10))
	var p struct{ Code string }
	_ = json.Unmarshal(b, &p)
	if p.Code == "" {
		p.Code = "http_" + strconv.Itoa(res.StatusCode)
	}
	wait = 200 * time.Millisecond
	if s, err := strconv.Atoi(res.Header.Get("Retry-After")); err == nil {
		wait = min(max(time.Duration(s)*time.Second, wait), time.Second)
	}
	return p.Code, wait
}
