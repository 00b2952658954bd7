package peer

import (
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/switchyard/switchyard/core"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// A reply leg's queue and window on the consumer host: what the engine
// queues on the leg, how Room bounds that queue, what the leg takes from it
// into frames on its trunk within the in-flight bounds, and what the
// ingress's acks free again.

// replyLocked queues a reply or release p (m's wire form) for node: on the
// binding's leg, opening one if m is not the binding's last message, else
// on the node's Post FIFO.
func (r *router) replyLocked(node string, m core.Message, p *pb.PeerMessage) {
	k := legKey{node, m.JobID, m.Gen}
	l := r.legs[k]
	final := m.Kind == core.MsgRelease || m.End != nil
	if l == nil {
		if final || r.cfg.ForceUnary {
			r.postLocked(node, p)
			return
		}
		l = r.startLegLocked(k, m.Queue, m.TTL, false)
	}
	it := &legItem{kind: string(m.Kind), msg: p, size: proto.Size(p), final: final}
	l.pending = append(l.pending, it)
	l.pendingBytes += it.size
	r.m.queue.WithLabelValues(node).Inc()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// room is the reply leg's flow control (core.Transport.Room): nil while the
// replies of job to node may keep coming, else a channel closed once they
// may: the job's leg holds ReplyWindow messages or ReplyWindowBytes not yet
// sent, and the channel closes when that drains below half (or the leg
// ends). Each channel handed out counts in
// switchyard_peer_reply_backpressure_total. It never blocks: the engine
// calls it with its lock held.
func (r *router) room(node, job string) <-chan struct{} {
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
