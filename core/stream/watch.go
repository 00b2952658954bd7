package stream

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchyard/switchyard/core"
)

// overflow is the watcher's verdict, read by the writer.
type overflow struct {
	once   sync.Once
	abortc chan struct{}
	events int
	bytes  int64
}

func (o *overflow) set(events int, bytes int64) {
	o.once.Do(func() {
		o.events, o.bytes = events, bytes
		close(o.abortc)
	})
}

func (o *overflow) get() (int, int64, bool) {
	select {
	case <-o.abortc:
		return o.events, o.bytes, true
	default:
		return 0, 0, false
	}
}

// watcher judges a stream from outside its writer: the lag watcher of a
// stream held to a bound, or the stall watcher of a paced stream. It has
// no goroutine of its own: an open stream that waits costs its writer's
// goroutine and nothing else (the node holds thousands). It runs in the
// goroutine of the Append that passes the bound it registered
// (History.LagFunc), and, for the stall watcher, in a timer's
// (time.AfterFunc) while the stream has something to send.
//
// mu serialises its callbacks with stop; after stop returns none of them
// touches the sink again (the sink's connection may be gone). Lock order:
// watcher.mu, then History.mu (LagFunc and its stop func take it).
type watcher struct {
	h       *core.History
	written *atomic.Uint64
	base    uint64
	p       Policy
	over    *overflow
	sink    Sink
	paced   bool

	mu      sync.Mutex
	stopped bool
	stopLag func() bool // the registered LagFunc's, nil when none
	// The stall watcher's clock: the position last seen and since when it
	// has not moved while there was something to send (zero: no clock).
	timer *time.Timer
	seen  uint64
	since time.Time
}

// startWatch starts w's watcher, which runs until stop.
func startWatch(w *writer) (stop func()) {
	wt := &watcher{h: w.h, written: &w.written, base: w.base, p: w.p, over: &w.overflow, sink: w.sink, paced: w.sent != nil}
	wt.mu.Lock()
	wt.seen = wt.written.Load()
	wt.check()
	wt.mu.Unlock()
	return wt.stop
}

func (wt *watcher) stop() {
	wt.mu.Lock()
	defer wt.mu.Unlock()
	wt.stopped = true
	wt.dropLag()
	if wt.timer != nil {
		wt.timer.Stop()
	}
}

// dropLag drops the registered LagFunc, if any (it may have run: then
// this does nothing). Called with mu held.
func (wt *watcher) dropLag() {
	if wt.stopLag != nil {
		wt.stopLag()
		wt.stopLag = nil
	}
}

// wake is the callback of LagFunc and of the stall timer.
func (wt *watcher) wake() {
	wt.mu.Lock()
	defer wt.mu.Unlock()
	if wt.stopped {
		return
	}
	wt.check()
}

// check looks at the stream now: it aborts its writer, or registers the
// next wake-up. Called with mu held.
func (wt *watcher) check() {
	wt.dropLag()
	if wt.paced {
		wt.checkStall()
		return
	}
	// The lag watcher aborts the writer as soon as what was appended since
	// the stream opened, and not yet written, passes a bound, measured from
	// the writer's position when it last looked; woken, it looks again from
	// where the writer is now.
	e, b, passed, stop := wt.h.LagFunc(max(wt.written.Load(), wt.base), wt.p.MaxLagEvents, wt.p.MaxLagBytes, wt.wake)
	if passed {
		wt.abort(e, b, time.Now())
		return
	}
	wt.stopLag = stop
}

// checkStall aborts a paced stream's writer once it made no progress for
// the stall timeout (Policy.Stall) while it had something to send: its
// client stopped reading (or reads so slowly that a write is stuck).
// Progress is the writer's position moving; the clock runs only while
// something lies after it (replay included: a client that resumes and
// stops reading is stalled too), and starts again whenever it moves.
// While there is nothing to send the watcher waits for the next append;
// otherwise it looks again a few times per stall timeout, which is all a
// stream costs it.
func (wt *watcher) checkStall() {
	pos := wt.written.Load()
	e, b, behind, stop := wt.h.LagFunc(pos, 0, 0, wt.wake)
	if !behind {
		wt.since = time.Time{} // nothing to send: no clock runs
		wt.stopLag = stop
		if wt.timer != nil {
			wt.timer.Stop()
		}
		return
	}
	stall, now := wt.p.stall(), time.Now()
	if pos != wt.seen || wt.since.IsZero() {
		wt.seen, wt.since = pos, now
	} else if now.Sub(wt.since) >= stall {
		wt.abort(e, b, now)
		return
	}
	d := min(stall/4, wt.since.Add(stall).Sub(now))
	if wt.timer == nil {
		wt.timer = time.AfterFunc(d, wt.wake)
	} else {
		wt.timer.Reset(d)
	}
}

func (wt *watcher) abort(events int, bytes int64, now time.Time) {
	wt.over.set(events, bytes)
	wt.sink.Abort(now.Add(abortGrace(wt.p)))
}
