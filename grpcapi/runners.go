package grpcapi

import "sync"

// maxIdleRunners bounds the runners kept waiting for a stream.
const maxIdleRunners = 256

// runners runs each job stream's work (the call's checks, the engine's
// Submit or Resume, and the stream's writer) on a goroutine kept from an
// earlier stream, the one that waited least first: its stack already grew
// to what that work needs. A goroutine gRPC starts for a call, and one
// started per stream, begins with a small stack and grows it by copying
// it, several times, on that deep path (about 6 % of an ingress's CPU on
// the JobService path at 64 streams at once). The least recently used
// runners wait at the bottom of the stack, where the collector shrinks
// their stacks; at most maxIdleRunners wait, the rest end.
//
// Every runner is counted in wg while it lives; close ends the waiting
// ones, and the busy ones end when their run returns.
type runners struct {
	wg *sync.WaitGroup

	mu     sync.Mutex
	idle   []chan func() // LIFO: the last one to finish is reused first
	closed bool
}

// run runs f on a waiting runner, or on a new one.
func (r *runners) run(f func()) {
	r.mu.Lock()
	if n := len(r.idle); n > 0 {
		c := r.idle[n-1]
		r.idle[n-1] = nil
		r.idle = r.idle[:n-1]
		r.mu.Unlock()
		c <- f // capacity 1, and only this call sends on c while it is out of idle
		return
	}
	r.mu.Unlock()
	r.wg.Go(func() { r.loop(f) })
}

// loop runs f, then whatever run hands it, until close or until it finds
// maxIdleRunners already waiting.
func (r *runners) loop(f func()) {
	c := make(chan func(), 1)
	for {
		f()
		r.mu.Lock()
		if r.closed || len(r.idle) >= maxIdleRunners {
			r.mu.Unlock()
			return
		}
		r.idle = append(r.idle, c)
		r.mu.Unlock()
		var ok bool
		if f, ok = <-c; !ok {
			return
		}
	}
}

// close ends the waiting runners; a busy one ends when its run returns. A
// run after close gets a runner that ends after it.
func (r *runners) close() {
	r.mu.Lock()
	idle := r.idle
	r.idle, r.closed = nil, true
	r.mu.Unlock()
	for _, c := range idle {
		close(c)
	}
}
