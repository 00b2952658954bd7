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

// watch aborts the stream's writer as soon as what was appended since the
// stream opened, and not yet written, passes a bound. It sleeps until an
// append takes the job past the bound as measured from the writer's
// position when it last looked (History.LagWait), so a stream that keeps
// up costs no wake-up per event; woken, it looks again from where the
// writer is now. It owns nothing but its loop; Run stops and waits for it.
func watch(h *core.History, written *atomic.Uint64, base uint64, p Policy, over *overflow, sink Sink, stopc <-chan struct{}) {
	for {
		e, b, passed, wake := h.LagWait(max(written.Load(), base), p.MaxLagEvents, p.MaxLagBytes)
		if passed {
			over.set(e, b)
			sink.Abort(time.Now().Add(abortGrace(p)))
			return
		}
		select {
		case <-wake:
		case <-stopc:
			h.StopLagWait(wake)
			return
		}
	}
}

// watchStall aborts a paced stream's writer once it made no progress for
// the stall timeout (Policy.Stall) while it had something to send: its client stopped reading
// (or reads so slowly that a write is stuck). Progress is the writer's
// position moving; the clock runs only while something lies after it
// (replay included: a client that resumes and stops reading is stalled
// too), and starts again whenever it moves. While there is nothing to send
// the watcher sleeps until the next append; otherwise it looks again a
// few times per stall timeout, which is all a stream costs it. It owns nothing
// but its loop; Run stops and waits for it.
func watchStall(h *core.History, written *atomic.Uint64, p Policy, over *overflow, sink Sink, stopc <-chan struct{}) {
	stall := p.stall()
	t := time.NewTimer(stall)
	defer t.Stop()
	seen, since := written.Load(), time.Time{}
	for {
		pos := written.Load()
		e, b, behind, wake := h.LagWait(pos, 0, 0)
		if !behind {
			since = time.Time{} // nothing to send: no clock runs
			select {
			case <-wake:
				continue
			case <-stopc:
				h.StopLagWait(wake)
				return
			}
		}
		now := time.Now()
		if pos != seen || since.IsZero() {
			seen, since = pos, now
		} else if now.Sub(since) >= stall {
			over.set(e, b)
			sink.Abort(now.Add(abortGrace(p)))
			return
		}
		t.Reset(min(stall/4, since.Add(stall).Sub(now)))
		select {
		case <-t.C:
		case <-stopc:
			return
		}
	}
}
