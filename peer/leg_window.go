package peer

import (
	"time"

	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// A reply leg's window on the consumer host: what the leg takes from its
// queue (within the in-flight bounds, which Room's channel waits on) into
// frames on its trunk, and what the ingress's acks free again.

// fill sends queued messages while the in-flight bounds allow: what was
// queued since the leg last sent goes in as few frames as it can (see
// RespondItems; a fast worker queues several outputs while one is sent).
func (l *replyLeg) fill() {
	r := l.r
	if l.t == nil {
		return
	}
	from := len(l.unacked)
	for len(l.unacked) < replyInFlight {
		it := l.take()
		if it == nil {
			break
		}
		if reason, err := r.wireCheckSize(it.msg, it.size+respondOverhead); err != nil {
			r.undeliverable(l.key.node, it.msg, nil, reason, err)
			if it.final {
				// Nothing of the leg is to come after it: the leg ends
				// once what went before is acked, not at its TTL.
				l.finalAcked = true
			}
			continue
		}
		l.unacked = append(l.unacked, it)
		l.unackedBytes += it.size
	}
	// What a failed send leaves unsent is unacked: the next trunk gets it.
	l.sendRun(l.unacked[from:])
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

// sendRun sends items, in order, on the leg's trunk: as many to a frame as
// the peer message limit allows. False once the trunk failed.
func (l *replyLeg) sendRun(items []*legItem) bool {
	for len(items) > 0 {
		n, size := 0, 0
		for n < len(items) && (n == 0 || size+items[n].size+respondOverhead <= l.r.maxPost) {
			size += items[n].size + respondOverhead
			n++
		}
		if !l.sendFrame(items[:n]) {
			return false
		}
		items = items[n:]
	}
	return true
}

// sendFrame sends items in one frame, each with the leg's open if the
// ingress does not hold the leg when it comes to it (the first, or one
// after a final item: the ingress forgot the leg there).
func (l *replyLeg) sendFrame(items []*legItem) bool {
	held := l.held
	fs := make([]*pb.RespondItem, len(items))
	for i, it := range items {
		fs[i] = &pb.RespondItem{Seq: it.seq, Message: it.msg}
		if !held {
			fs[i].Open = l.openOf()
		}
		held = !it.final
	}
	l.openDue = false
	if !l.t.send(&pb.RespondFrame{Body: &pb.RespondFrame_Items{Items: &pb.RespondItems{Items: fs}}}) {
		return false
	}
	l.r.m.replyFrames.Inc()
	l.held = held
	return true
}

// sendOpen sends the leg's open frame alone on the trunk it joined, if it
// had no item to carry it.
func (l *replyLeg) sendOpen() {
	if l.t == nil || !l.openDue {
		return
	}
	l.openDue = false
	if l.t.send(&pb.RespondFrame{Body: &pb.RespondFrame_Open{Open: l.openOf()}}) {
		l.held = true
	}
}

// openOf is the leg's open.
func (l *replyLeg) openOf() *pb.RespondOpen {
	r := l.r
	return &pb.RespondOpen{
		Session: r.session, JobId: l.key.job, Generation: l.key.gen, Queue: l.queueName,
		HeartbeatIntervalNs: int64(r.cfg.Heartbeat), TtlNs: int64(max(time.Until(l.deadline), 0)),
	}
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
