package peer

// A response leg's window on the consumer host: what the leg takes from its
// queue within its in-flight bounds, and what the ingress's acks free
// again. What bounds the queue itself is the job's output credit: the
// worker sends no more than its window past what the job's reader took
// (core/credit.go), so a slow ingress, or a slow reader behind it, stops
// the job's worker, and no other job's.

// Response leg in-flight bounds: what a leg has sent and not yet seen acked
// (a message larger than replyInFlightBytes goes alone). Past them the leg
// stops sending, and what the worker produces next waits in the leg's
// queue, within the job's output credit. The ingress handles each item as
// it reads it, so what it has not read waits in HTTP/2 flow control
// windows, under these bounds.
const (
	replyInFlight      = 256
	replyInFlightBytes = 4 << 20
)

// takeRun moves the queued messages that the in-flight bounds allow, in
// order, to the end of l.unacked and numbers them (a message goes alone
// when nothing is in flight); it returns them, nil when none. One lock for
// the run: the engine queues with r.mu held, the leg takes what came while
// it sent its last frame.
func (l *responseLeg) takeRun() []*legItem {
	r := l.r
	r.mu.Lock()
	defer r.mu.Unlock()
	from, n, bytes := len(l.unacked), 0, l.unackedBytes
	for n < len(l.pending) && from+n < replyInFlight {
		it := l.pending[n]
		if bytes > 0 && bytes+it.size > replyInFlightBytes {
			break
		}
		bytes += it.size
		it.seq = r.seq
		r.seq++
		n++
	}
	if n == 0 {
		return nil
	}
	l.unacked = append(l.unacked, l.pending[:n]...)
	// The queue keeps its array: the engine appends to it again.
	rest := copy(l.pending, l.pending[n:])
	clear(l.pending[rest:])
	l.pending = l.pending[:rest]
	return l.unacked[from:]
}

// applyAcks drops what the ingress acked from unacked, counting each
// message sent.
func (l *responseLeg) applyAcks() {
	r := l.r
	a := l.acked.Load()
	n := 0
	for n < len(l.unacked) && int64(l.unacked[n].seq) <= a {
		it := l.unacked[n]
		r.m.sent(it.kind).Inc()
		l.unackedBytes -= it.size
		if it.final {
			l.finalAcked = true
		}
		n++
	}
	if n == 0 {
		return
	}
	l.queued.Sub(float64(n))
	// unacked keeps its array: takeRun appends to it again.
	rest := copy(l.unacked, l.unacked[n:])
	clear(l.unacked[rest:])
	l.unacked = l.unacked[:rest]
}
