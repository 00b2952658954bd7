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

// take removes the next queued message and numbers it: nil when none, or
// when it would take the bytes in flight past replyInFlightBytes (a
// message goes alone when nothing is in flight).
func (l *responseLeg) take() *legItem {
	r := l.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(l.pending) == 0 {
		return nil
	}
	it := l.pending[0]
	if l.unackedBytes > 0 && l.unackedBytes+it.size > replyInFlightBytes {
		return nil
	}
	l.pending[0] = nil
	l.pending = l.pending[1:]
	if len(l.pending) == 0 {
		l.pending = nil
	}
	it.seq = r.seq
	r.seq++
	return it
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
	clear(l.unacked[:n])
	l.unacked = l.unacked[n:]
	if len(l.unacked) == 0 {
		l.unacked = nil
	}
}
