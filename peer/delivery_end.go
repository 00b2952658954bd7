package peer

// How a delivery stream ends: after StreamIdle with nothing to send (its
// stream is closed cleanly), when its node leaves the catalog, or at Close.
// What it still holds then is dropped and counted, and its forwards fail.

// idleOut ends the delivery stream after StreamIdle without traffic, unless
// something is unacked or was queued meanwhile: true when the goroutine
// must exit.
func (l *deliveryStream) idleOut() bool {
	r := l.r
	if len(l.unacked) > 0 {
		return false
	}
	r.mu.Lock()
	if len(l.pending) > 0 {
		r.mu.Unlock()
		return false
	}
	delete(r.deliveries, l.key)
	r.unrefLocked(l.key.node)
	r.mu.Unlock()
	if l.st != nil {
		l.closeStream()
		r.m.idleCloses.Inc()
	}
	return true
}

// closeStream closes the delivery stream's Deliver stream cleanly (nothing
// is unacked): it half-closes, waits a little for the receiver to end the
// stream, then ends it anyway.
func (l *deliveryStream) closeStream() {
	st := l.st
	close(st.closec)
	l.r.awaitEnd(st.done)
	l.dropStream()
}

// gone drops items and everything else the delivery stream holds: its node
// left the catalog (its lease is gone: it is dead).
func (l *deliveryStream) gone(items []*item) {
	all := append(append(append([]*item(nil), items...), l.unacked...), l.take(-1)...)
	l.unacked = nil
	l.ackTimer.Stop()
	if l.st != nil {
		l.dropStream()
	}
	l.drop(all, ErrUnknownNode)
	l.r.log.Warn("dropped routing messages to a node that left the catalog", "node", l.key.node, "queue", l.key.queue, "messages", len(all))
}

// shutdown ends the delivery stream at Close: what it holds is dropped.
func (l *deliveryStream) shutdown() {
	r := l.r
	if l.st != nil {
		l.dropStream()
	}
	r.mu.Lock()
	pending := l.pending
	l.pending = nil
	delete(r.deliveries, l.key)
	r.mu.Unlock()
	l.drop(append(append([]*item(nil), l.unacked...), pending...), ErrClosed)
	l.unacked = nil
	r.mu.Lock()
	r.unrefLocked(l.key.node)
	r.mu.Unlock()
}

// drop gives up on items: messages are counted as dropped, forwards fail
// with err.
func (l *deliveryStream) drop(items []*item, err error) {
	r := l.r
	var n int
	for _, it := range items {
		if it.fwd != nil {
			it.finish(nil, err)
			continue
		}
		r.m.dropped.WithLabelValues(it.kind).Inc()
		n++
	}
	if n > 0 {
		r.m.queue.WithLabelValues(l.key.node).Sub(float64(n))
	}
}
