package peer

// A reply leg's window on the consumer host: how Transport.Room bounds the
// leg's queue of messages not yet sent, what the leg takes from that queue
// within its in-flight bounds, and what the ingress's acks free again.

// Reply leg window bounds.
const (
	// replyInFlight and replyInFlightBytes bound what a leg has sent and not
	// yet seen acked (a message larger than replyInFlightBytes goes alone).
	// Past them the leg stops sending, and what the worker produces next
	// waits in the leg's queue, which Room bounds: so a slow ingress (its
	// handler slow, or the ingress not reading at all) fills the queue, and
	// the worker session stops reading its worker. The ingress handles
	// each item as it reads it, so what it has not read waits in HTTP/2
	// flow control windows, under these bounds.
	replyInFlight      = 256
	replyInFlightBytes = 4 << 20
	// DefaultReplyWindow and DefaultReplyWindowBytes are Config's
	// defaults: a leg's queue of messages not yet sent on its trunk may
	// hold 64 messages or 1 MiB before Room asks the worker session to
	// wait. Small against replyInFlight: the queue is only the slack
	// between the worker and the stream, so the worker feels a slow ingress
	// after a few hundred kilobytes rather than after megabytes, while a
	// fast ingress (acks back in well under a millisecond on a LAN) never
	// lets it fill: 64 outputs is several milliseconds of a busy worker.
	DefaultReplyWindow      = 64
	DefaultReplyWindowBytes = 1 << 20
)

// Room is core.Transport.Room, the reply leg's flow control: nil while the
// replies of job to node may keep coming, else a channel closed once they
// may: the job's leg holds ReplyWindow messages or ReplyWindowBytes not yet
// sent, and the channel closes when that drains below half (or the leg
// ends). Each channel handed out counts in
// switchyard_peer_reply_backpressure_total. It never blocks: the engine
// calls it with its lock held.
func (t *Transport) Room(node, job string) <-chan struct{} {
	r := t.rt
	r.mu.Lock()
	defer r.mu.Unlock()
	var l *replyLeg
	for _, c := range r.jobLegs[job] {
		if c.key.node == node && (l == nil || c.key.gen > l.key.gen) {
			l = c
		}
	}
	if l == nil || len(l.pending) < r.cfg.ReplyWindow && l.pendingBytes < r.cfg.ReplyWindowBytes {
		return nil
	}
	if l.room == nil {
		l.room = make(chan struct{})
	}
	r.m.backpressure.Inc()
	return l.room
}

// take removes the next queued message and numbers it: nil when none, or
// when it would take the bytes in flight past replyInFlightBytes (a
// message goes alone when nothing is in flight). The room channel closes
// once the queue is below half the window.
func (l *replyLeg) take() *legItem {
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
	l.pendingBytes -= it.size
	it.seq = r.seq
	r.seq++
	if l.room != nil && len(l.pending) <= r.cfg.ReplyWindow/2 && l.pendingBytes <= r.cfg.ReplyWindowBytes/2 {
		close(l.room)
		l.room = nil
	}
	return it
}

// applyAcks drops what the ingress acked from unacked, counting each
// message sent.
func (l *replyLeg) applyAcks() {
	r := l.r
	a := l.acked.Load()
	n := 0
	for n < len(l.unacked) && int64(l.unacked[n].seq) <= a {
		it := l.unacked[n]
		r.m.messages.WithLabelValues(it.kind).Inc()
		l.unackedBytes -= it.size
		if it.final {
			l.finalAcked = true
		}
		n++
	}
	if n == 0 {
		return
	}
	r.m.queue.WithLabelValues(l.key.node).Sub(float64(n))
	clear(l.unacked[:n])
	l.unacked = l.unacked[n:]
	if len(l.unacked) == 0 {
		l.unacked = nil
	}
}
