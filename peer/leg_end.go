package peer

import (
	"context"
	"log/slog"

	"github.com/switchyard/switchyard/core"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// How a response leg ends: its last message acked, a cancel (on the leg, or
// by another path), its TTL, its ingress gone or refusing it, or Close. How
// it carries on when its reply stream fails (it joins the next one, unless
// the failure is for good) is its sender's (leg_sender.go).

// Why a response leg ended: the reason label of
// switchyard_peer_reply_legs_ended_total.
const (
	legEndDone   = "end"     // its last message (end or release) was acked
	legEndCancel = "cancel"  // the job was cancelled (on the leg or by another path)
	legEndTTL    = "ttl"     // the job's TTL (plus slack) passed
	legEndGone   = "gone"    // the ingress left the catalog: it is dead
	legEndRefuse = "refused" // the ingress refused the stream for good
	legEndClosed = "closed"  // Transport.Close
)

// finish ends the leg once its last message was acked and nothing is
// queued behind it. False while the leg goes on.
func (l *responseLeg) finish() bool {
	r := l.r
	if !l.finalAcked || len(l.unacked) > 0 {
		return false
	}
	if l.held {
		// Something went after the last message: the ingress holds the
		// leg and is told to forget it while the leg is still the
		// binding's, so a leg opened after it for the same binding opens
		// after that end frame (see end). Something queued meanwhile is
		// sent on a reply stream joined again.
		l.leave()
	}
	r.mu.Lock()
	if len(l.pending) > 0 {
		r.mu.Unlock()
		return false
	}
	l.removeLocked()
	r.mu.Unlock()
	l.leave()
	r.m.legsEnded.WithLabelValues(legEndDone).Inc()
	return true
}

// end ends the leg for why: what it holds is dropped and counted. The
// ingress is told on the reply stream, if the leg is open on one.
func (l *responseLeg) end(why string) {
	r := l.r
	if why != legEndClosed {
		// The end frame goes while the leg is still the binding's in
		// r.legs: a message queued after removeLocked opens a new leg for
		// the binding, whose open must reach the ingress after this end,
		// or the ingress would forget the new leg.
		l.leave()
	}
	r.mu.Lock()
	items := append(l.unacked, l.pending...)
	l.unacked, l.pending = nil, nil
	for _, it := range items {
		r.m.dropped.WithLabelValues(it.kind).Inc()
	}
	if len(items) > 0 {
		r.m.queue.WithLabelValues(l.key.node).Sub(float64(len(items)))
	}
	l.removeLocked()
	r.mu.Unlock()
	if len(items) > 0 {
		lvl := slog.LevelWarn
		if why == legEndCancel || why == legEndClosed {
			lvl = slog.LevelDebug // nobody wants them any more
		}
		r.log.Log(context.Background(), lvl, "response leg ended with messages unsent", "node", l.key.node, "job", l.key.job, "gen", l.key.gen, "why", why, "messages", len(items))
	}
	r.m.legsEnded.WithLabelValues(why).Inc()
}

// leave takes the leg off its reply stream, if it is open on one. If the
// ingress holds it there (it did not forget it at its last item), an end
// frame tells it to forget it, after the leg's items.
func (l *responseLeg) leave() {
	t := l.t
	if t == nil {
		return
	}
	l.t = nil
	if l.held {
		l.s.sendEnd(t, l)
	}
	t.leave()
}

// removeLocked takes l out of the router's maps (once): later messages
// of its binding open a new leg.
func (l *responseLeg) removeLocked() {
	r := l.r
	if l.removed {
		return
	}
	l.removed = true
	l.timer.Stop()
	delete(l.s.legs, l)
	r.m.legsOpen.Dec()
	delete(r.legs, l.key)
	legs := r.jobLegs[l.key.job]
	for i, c := range legs {
		if c == l {
			legs = append(legs[:i:i], legs[i+1:]...)
			break
		}
	}
	if len(legs) == 0 {
		delete(r.jobLegs, l.key.job)
	} else {
		r.jobLegs[l.key.job] = legs
	}
	r.unrefLocked(l.key.node)
}

// legCancelled ends the legs of binding (job, gen), whose cancel reached
// this node's receiver (the dispatcher passed it on, or the ingress sent
// it before the leg opened, or on the leg): the engine has marked the
// binding cancelling, so nothing more is sent on them. Called by the
// node's server with the lock of the path the cancel came by held (an
// unicastInbox's or a deliveryInbox's mu), never server.mu.
func (r *router) legCancelled(job string, gen uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range r.jobLegs[job] {
		if l.key.gen == gen {
			l.cancelLocked()
		}
	}
}

// takeCancel hands the ingress's cancel to the node's receiver, once, and
// ends the leg: the engine has marked the binding cancelling by the time
// HandleMessage returns, so it sends nothing more for it.
func (l *responseLeg) takeCancel(p *pb.PeerMessage) {
	r := l.r
	m, err := MessageFromPB(p)
	if err != nil || m.Kind != core.MsgCancel || m.JobID != l.key.job || m.Gen != l.key.gen {
		r.m.invalid.Inc()
		r.log.Warn("skipped an invalid cancel on a response leg", "node", l.key.node, "job", l.key.job, "gen", l.key.gen, "err", err)
		return
	}
	if !l.cancelled.CompareAndSwap(false, true) {
		return
	}
	if rcv, err := r.srv.receiver(); err == nil {
		rcv.HandleMessage(l.key.node, m)
	} else {
		r.log.Error("a cancel came on a response leg before routing started", "node", l.key.node, "job", l.key.job)
	}
	r.mu.Lock()
	l.cancelLocked()
	r.mu.Unlock()
}

// takeGrant hands a grant of output credit from the ingress to the node's
// receiver, which passes it to the binding's worker if it still runs the
// job here: the leg the grant came on may have ended since (its last
// message acked), and the engine knows best.
func (t *replyStream) takeGrant(p *pb.PeerMessage) {
	r := t.r
	m, err := MessageFromPB(p)
	if err != nil || m.Kind != core.MsgGrant {
		r.m.invalid.Inc()
		r.log.Warn("skipped an invalid grant on a reply stream", "node", t.node, "job", p.GetJobId(), "err", err)
		return
	}
	if rcv, err := r.srv.receiver(); err == nil {
		rcv.HandleMessage(t.node, m)
	}
}
