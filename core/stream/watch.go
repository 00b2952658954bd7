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
