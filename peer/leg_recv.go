package peer

import (
	"errors"
	"sync"
	"time"

	"github.com/switchyard/switchyard/core"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// The response leg, receiving side (the ingress): what the server remembers
// of each response leg across the reply streams that carry it, so that a
// leg resent on a new reply stream is handled once and in order, and where
// the job's cancel goes. The reply stream itself is reply_recv.go.

// How long the ingress remembers a leg.
const (
	// maxLegMemory caps how long a leg's state is kept for a host to
	// re-open it, whatever TTL its open frame claims.
	maxLegMemory = time.Hour
	// inLegSweep: legs no stream has held past their memory are swept at
	// most this often.
	inLegSweep = time.Minute
	// finishedLegMemory is how long a leg is remembered after its last
	// item was handled: a host whose reply stream failed before that item's ack
	// reached it resends the leg's unacked tail on its next reply stream (after
	// up to three heartbeat intervals to notice, and its backoff), and
	// finds the leg's numbers here, so nothing is handled twice. A resend
	// later than that is handled again, and is stale at the engine (the
	// job ended, or moved to a new generation).
	finishedLegMemory = 10 * time.Second
)

// inLegKey names a response leg as the ingress sees it.
type inLegKey struct {
	from, job string
	gen       uint64
}

// inLeg is what the server knows of one response leg, across the reply
// streams that carry it (a host opens the leg again on its next reply
// stream when one fails): the numbers it handled, the reply stream that
// holds it now, and the job's cancel once there is one. Once its last item
// is handled, or the host ended it without one, it is done: kept for
// finishedLegMemory, then forgotten. It is also forgotten when no reply
// stream held it for its memory (attachLeg sweeps).
type inLeg struct {
	key inLegKey

	// mu serialises handling: dedup and the receiver call. It is taken
	// before server.mu (which the receiver's sends may take), never under
	// it.
	mu      sync.Mutex
	session string
	next    uint64
	// outputSeen: an output of the leg was handed to the receiver.
	outputSeen bool

	// Under server.mu.
	cur    *respondIn
	ctl    [nControls]legControl // the job's cancel and newest grant, if any
	forget time.Time             // while no reply stream holds it: dropped after
	done   bool                  // its last item was handled (see finishLeg)
}

// A leg's controls are the messages for the host that the ingress writes
// on the reply stream holding the leg, and again on each reply stream that
// opens the leg later, until it ends.
type control int

const (
	ctlCancel control = iota // the job's cancel: the first one stands
	ctlGrant                 // the newest grant of output credit (grants are cumulative)
	nControls
)

// legControl is one control of a leg: its message, the reply stream it was
// last written on, and whether it was counted (once, however often it is
// written).
type legControl struct {
	msg     *pb.PeerMessage
	on      *respondIn
	counted bool
}

// finishedLeg is an entry of server.finished: a done leg, to forget once
// until has passed (unless it was opened again since).
type finishedLeg struct {
	l     *inLeg
	until time.Time
}

// attachLeg makes rs the reply stream that holds the leg o opens: a host
// opens a leg on a new reply stream only once it gave up on the last.
func (s *server) attachLeg(from string, o *pb.RespondOpen, rs *respondIn) *inLeg {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	sweep(s.inLegs, &s.legsSwept, inLegSweep, now, func(l *inLeg) bool { return l.cur == nil && now.After(l.forget) })
	k := inLegKey{from, o.GetJobId(), o.GetGeneration()}
	l := s.inLegs[k]
	if l == nil {
		l = &inLeg{key: k}
		s.inLegs[k] = l
	}
	if rs.held == nil {
		// rs ended: its reader handles nothing more. The leg is kept for
		// the host's next reply stream like any other.
		if l.cur == nil && l.forget.IsZero() {
			l.forget = now.Add(min(max(time.Duration(o.GetTtlNs()), 0), maxLegMemory) + 2*legTTLSlack)
		}
		return l
	}
	if old := l.cur; old != nil && old != rs {
		if old.epoch > rs.epoch {
			return l // a stale frame of an older reply stream: the newer one holds the leg
		}
		delete(old.held, k)
	}
	// A done leg opened again is a resend of its tail: skipped by number.
	l.cur, l.done = rs, false
	rs.held[k] = l
	l.forget = now.Add(min(max(time.Duration(o.GetTtlNs()), 0), maxLegMemory) + 2*legTTLSlack)
	queued := false
	for c := range nControls {
		if l.ctl[c].msg != nil {
			rs.pending[c] = append(rs.pending[c], l)
			queued = true
		}
	}
	if queued {
		rs.wake()
	}
	return l
}

// finishLeg marks done a leg whose last item rs handled, or that the host
// ended on rs without one: rs no longer holds it, and it is forgotten
// after finishedLegMemory unless the host opens it again meanwhile.
func (s *server) finishLeg(rs *respondIn, l *inLeg) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.cur != rs {
		return
	}
	l.cur = nil
	delete(rs.held, l.key)
	now := time.Now()
	if s.inLegs[l.key] == l {
		l.done, l.forget = true, now.Add(finishedLegMemory)
		s.finished = append(s.finished, finishedLeg{l, l.forget})
	}
	s.pruneFinishedLocked(now)
}

// pruneFinishedLocked forgets the done legs whose memory ran out. Entries
// are in the order they were added, each with the same memory, so only
// the front is looked at.
func (s *server) pruneFinishedLocked(now time.Time) {
	n := 0
	for n < len(s.finished) && now.After(s.finished[n].until) {
		l := s.finished[n].l
		if l.done && l.cur == nil && now.After(l.forget) && s.inLegs[l.key] == l {
			delete(s.inLegs, l.key)
		}
		n++
	}
	if n > 0 {
		clear(s.finished[:n])
		s.finished = s.finished[n:]
	}
}

// detachAll ends rs's hold on its legs and returns them. They are kept
// until their memory runs out for the host to open them again on its next
// reply stream, silent or not: a job with no output on a silent host goes on if
// the host comes back, and its leg's numbers must still be known then.
func (s *server) detachAll(rs *respondIn) []inLegKey {
	s.mu.Lock()
	defer s.mu.Unlock()
	var keys []inLegKey
	for k, l := range rs.held {
		if l.cur != rs {
			continue
		}
		l.cur = nil
		keys = append(keys, k)
	}
	rs.held = nil
	return keys
}

// cancelOnLeg puts the cancel p of binding (job, gen) on its response leg
// from node from, when a reply stream holds it now: written at once, and
// again on any reply stream that opens the leg again. False when no reply
// stream holds such a leg: the caller sends the cancel by its delivery
// stream. It never blocks.
func (s *server) cancelOnLeg(from, job string, gen uint64, p *pb.PeerMessage) bool {
	return s.controlOnLeg(inLegKey{from, job, gen}, ctlCancel, p)
}

// grantOnLeg puts the grant p of binding (job, gen) on its response leg
// from node from, when a reply stream holds it now: written at once (in
// place of one not written yet), and again on any reply stream that opens
// the leg again. False when no reply stream holds such a leg: the caller
// sends the grant by its delivery stream. It never blocks.
func (s *server) grantOnLeg(from, job string, gen uint64, p *pb.PeerMessage) bool {
	return s.controlOnLeg(inLegKey{from, job, gen}, ctlGrant, p)
}

// controlOnLeg makes p leg k's control c and has the reply stream that
// holds the leg write it: false when none holds it.
func (s *server) controlOnLeg(k inLegKey, c control, p *pb.PeerMessage) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.inLegs[k]
	if l == nil || l.cur == nil {
		return false
	}
	switch {
	case c == ctlGrant:
		l.ctl[c] = legControl{msg: p} // written and counted anew
	case l.ctl[c].msg == nil:
		l.ctl[c].msg = p
	}
	l.cur.pending[c] = append(l.cur.pending[c], l)
	l.cur.wake()
	return true
}

// controlKind is the kind each control is counted under.
var controlKind = [nControls]core.MessageKind{ctlCancel: core.MsgCancel, ctlGrant: core.MsgGrant}

// controlsFor takes the controls c to write on rs: each leg's once per
// reply stream, while rs holds it.
func (s *server) controlsFor(rs *respondIn, c control) []*pb.PeerMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ps []*pb.PeerMessage
	for _, l := range rs.pending[c] {
		lc := &l.ctl[c]
		if l.cur == rs && lc.on != rs && lc.msg != nil {
			lc.on = rs
			ps = append(ps, lc.msg)
			if !lc.counted {
				lc.counted = true
				s.cfg.Metrics.messages.WithLabelValues(string(controlKind[c])).Inc()
			}
		}
	}
	rs.pending[c] = nil
	return ps
}

// handleItem hands one item of leg to the receiver unless the leg handled
// it already. It reports whether the item is the latest the leg handled:
// just now, or already (a resend whose ack was lost); and whether it was the
// leg's first output handed to the receiver.
func (rs *respondIn) handleItem(rcv core.Receiver, leg *inLeg, it *pb.RespondItem) (latest, firstOutput bool) {
	s := rs.s
	leg.mu.Lock()
	defer leg.mu.Unlock()
	if rs.session != leg.session {
		// A new host process (or the leg's first reply stream).
		leg.session, leg.next = rs.session, 0
	}
	seq := it.GetSeq()
	if seq < leg.next {
		return seq+1 == leg.next, false
	}
	leg.next = seq + 1
	m, err := MessageFromPB(it.GetMessage())
	if err == nil && (m.Kind != core.MsgReply && m.Kind != core.MsgRelease || m.JobID != leg.key.job || m.Gen != leg.key.gen) {
		err = errors.New("a response leg carries its own job's replies and release only")
	}
	if err != nil {
		s.cfg.Metrics.invalid.Inc()
		s.cfg.Logger.Warn("skipped an invalid message on a response leg", "from", rs.from, "job", leg.key.job, "err", err)
		return true, false
	}
	// Straight to the receiver: a response leg carries no cancel, so there is
	// no response leg of this node's to end (server.handleMessage).
	rcv.HandleMessage(rs.from, m)
	firstOutput = m.Output != nil && !leg.outputSeen
	leg.outputSeen = leg.outputSeen || m.Output != nil
	return true, firstOutput
}
