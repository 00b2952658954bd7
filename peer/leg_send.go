package peer

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchyard/switchyard/core"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// The response leg, sending side (the consumer host): one reply leg per
// binding. The legs' frames travel on the node's reply trunks
// (trunk_send.go); the ingress's side is leg_recv.go and trunk_recv.go.

// Reply leg bounds.
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
	// openDelay is how long a leg opened by Expect waits for its first
	// reply before it sends its open frame alone (at most a quarter of the
	// heartbeat interval).
	openDelay = 20 * time.Millisecond
	// legTTLSlack is how long past the job's TTL, as the host measured it
	// with the leg's first reply, the leg may live: the ingress ends the job
	// at its own deadline, which is later than the host's measure, so by
	// then nothing the leg carries can matter.
	legTTLSlack = 2 * time.Second
	// respondOverhead is what a RespondFrame adds around its message, with
	// the leg's open it may carry (session, job id, queue name, numbers).
	respondOverhead = 512
)

// Why a reply leg ended: the reason label of
// switchyard_peer_reply_legs_ended_total.
const (
	legEndDone   = "end"     // its last message (end or release) was acked
	legEndCancel = "cancel"  // the job was cancelled (on the leg or by another path)
	legEndTTL    = "ttl"     // the job's TTL (plus slack) passed
	legEndGone   = "gone"    // the ingress left the catalog: it is dead
	legEndRefuse = "refused" // the ingress refused the stream for good
	legEndClosed = "closed"  // Transport.Close
)

type legKey struct {
	node, job string
	gen       uint64
}

// legItem is one message of a leg.
type legItem struct {
	seq   uint64
	kind  string
	msg   *pb.PeerMessage
	size  int
	final bool
}

// A replyLeg is the consumer host's side of one binding's reply leg: the
// binding's replies and release, in order, to the job's ingress, on the
// node's reply trunk to it (trunk_send.go), with at most replyInFlight
// (and replyInFlightBytes) unacked and a queue behind them that Room
// bounds. Expect or the binding's first reply opens it. It ends once its
// last message is acked, on a cancel, at the job's TTL plus legTTLSlack,
// or when its ingress is gone or refuses it; never for being idle. When a
// trunk fails, the leg joins the next one and resends what is unacked,
// numbers unchanged. docs/cluster.md, "Response leg", has the why.
type replyLeg struct {
	r        *router
	key      legKey
	deadline time.Time
	// queueName is the job's queue, for its open frame: given by Expect or
	// by the message that opened the leg.
	queueName string
	wake      chan struct{} // capacity 1: "something was queued"

	stop     chan struct{} // closed when the job was cancelled
	stopOnce sync.Once
	// cancelled: a cancel came on the leg (handled once, whichever trunk).
	cancelled atomic.Bool
	// acked is the highest seq the ingress acked (-1: none); ackc says it
	// moved. Written by the trunk's reader.
	acked atomic.Int64
	ackc  chan struct{}

	// Under r.mu.
	pending      []*legItem
	pendingBytes int
	room         chan struct{} // handed out by Room; closed when the queue drains
	removed      bool          // no longer in r.legs

	// The goroutine's own.
	unacked      []*legItem
	unackedBytes int
	finalAcked   bool
	t            *replyTrunk // the trunk the leg is open on, nil while none
	failures     int         // trunk attempts failed in a row
	// held: the ingress holds the leg on l.t (its open went out, and no
	// final item since, after which the ingress forgets the leg); else the
	// next item carries the leg's open. openDue: the leg joined l.t and
	// has sent nothing on it yet: if it has nothing to send, its open
	// goes alone.
	held, openDue bool
	// expected: opened by Expect, with nothing to send yet.
	expected bool
}

// expect opens the reply leg of binding (job, gen) to its ingress node
// before the binding's first message: the host calls it when it offers a
// remote ingress's job to its worker, so the ingress learns where the job
// runs and hears the host's heartbeats while the worker computes in
// silence (a silent host then fails the job within the heartbeat bound
// even before any output). The open frame waits up to openDelay for the
// job's first reply, to go out with it: a short job's open would
// otherwise cost the two nodes a frame of its own, and its wake-ups, while
// its worker starts. Opening carries no message. It never blocks.
func (r *router) expect(node, job string, gen uint64, queue string, ttl time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := legKey{node, job, gen}
	if r.closed || r.legs[k] != nil || r.cfg.ForceUnary {
		return
	}
	r.startLegLocked(k, queue, ttl, true)
}

// startLegLocked opens leg k and starts its goroutine.
func (r *router) startLegLocked(k legKey, queue string, ttl time.Duration, expected bool) *replyLeg {
	l := &replyLeg{r: r, key: k, queueName: queue, wake: make(chan struct{}, 1), stop: make(chan struct{}),
		ackc: make(chan struct{}, 1), deadline: time.Now().Add(max(ttl, 0) + legTTLSlack), expected: expected}
	l.acked.Store(-1)
	r.m.legsOpen.Inc()
	r.legs[k] = l
	r.jobLegs[k.job] = append(r.jobLegs[k.job], l)
	r.refLocked(k.node)
	r.wg.Add(1)
	go l.run()
	return l
}

// legCancelled ends the legs of binding (job, gen), whose cancel reached
// this node's receiver (the dispatcher passed it on, or the ingress sent
// it before the leg opened, or on the leg): the engine has marked the
// binding cancelling, so nothing more is sent on them. Called by the
// node's server with the lock of the path the cancel came by held (an
// inbox's, a laneInbox's or an inLeg's mu), never server.mu.
func (r *router) legCancelled(job string, gen uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range r.jobLegs[job] {
		if l.key.gen == gen {
			l.stopOnce.Do(func() { close(l.stop) })
		}
	}
}

// removeLocked takes l out of the router's maps (once): later messages
// of its binding open a new leg.
func (l *replyLeg) removeLocked() {
	r := l.r
	if l.removed {
		return
	}
	l.removed = true
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
	if l.room != nil {
		close(l.room)
		l.room = nil
	}
	r.unrefLocked(l.key.node)
}

// run is the leg's goroutine: it sends what is queued, as the trunk and
// the in-flight bound allow, until the leg ends.
func (l *replyLeg) run() {
	defer l.r.wg.Done()
	ttl := time.NewTimer(time.Until(l.deadline))
	defer ttl.Stop()
	if l.expected {
		l.expected = false
		if !l.awaitFirstReply(ttl.C) {
			l.end(legEndTTL)
			return
		}
	}
	for {
		switch why := l.step(ttl.C); why {
		case "":
		case legEndDone: // finish counted it
			return
		default:
			l.end(why)
			return
		}
	}
}

// awaitFirstReply holds a leg that Expect opened back for up to openDelay
// (a quarter of the heartbeat at most), so that its open goes out with
// the job's first reply: false when the job's TTL passed meanwhile.
func (l *replyLeg) awaitFirstReply(ttl <-chan time.Time) bool {
	t := time.NewTimer(min(openDelay, l.r.cfg.Heartbeat/4))
	defer t.Stop()
	select {
	case <-l.wake:
		// The loop sends what was queued without waiting for another wake.
	case <-t.C:
	case <-l.r.ctx.Done():
	case <-l.stop:
	case <-ttl:
		return false
	}
	return true
}

// step sends what it can, then waits for something to change: "" to go
// on, legEndDone once the leg finished, else why it must end.
func (l *replyLeg) step(ttl <-chan time.Time) string {
	if why := l.stopped(ttl); why != "" {
		return why
	}
	if l.t == nil {
		if why := l.connect(ttl); why != "" {
			return why
		}
	}
	l.applyAcks()
	l.fill()
	l.sendOpen()
	if l.finish() {
		return legEndDone
	}
	return l.wait(ttl)
}

// stopped is why the leg must end now: Close, a cancel or its TTL; "" for
// none.
func (l *replyLeg) stopped(ttl <-chan time.Time) string {
	select {
	case <-l.r.ctx.Done():
		return legEndClosed
	case <-l.stop:
		return legEndCancel
	case <-ttl:
		return legEndTTL
	default:
		return ""
	}
}

// wait waits for something to send, an ack, a reason to stop, or the
// trunk to fail: as step.
func (l *replyLeg) wait(ttl <-chan time.Time) string {
	var done <-chan struct{}
	if l.t != nil {
		done = l.t.st.done
	}
	select {
	case <-l.r.ctx.Done():
	case <-l.stop:
	case <-ttl:
		return legEndTTL
	case <-l.wake:
	case <-l.ackc:
	case <-done:
		if why := l.dropTrunk(); why != "" {
			return why
		}
		// The acks read before the trunk ended may have covered the
		// leg's last message: then it is done, not to be opened again.
		if l.finish() {
			return legEndDone
		}
	}
	return ""
}

// connect opens the leg on its ingress's trunk, opening the trunk if it
// has none, after a backoff when the last attempt failed, and resends what
// is unacked: "" once open, else why the leg ends.
func (l *replyLeg) connect(ttl <-chan time.Time) string {
	r := l.r
	for {
		if l.failures > 0 {
			d := r.backoff(l.failures - 1)
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-r.ctx.Done():
				t.Stop()
				return legEndClosed
			case <-l.stop:
				t.Stop()
				return legEndCancel
			case <-ttl:
				t.Stop()
				return legEndTTL
			}
		}
		if r.ctx.Err() != nil {
			return legEndClosed
		}
		addr, ok := r.cfg.Addr(l.key.node)
		if !ok {
			return legEndGone
		}
		t, err := r.trunkFor(l.key.node, addr)
		if err == nil {
			l.t = t
			break
		}
		l.failures++
		if r.ctx.Err() != nil {
			return legEndClosed
		}
		r.m.sendFailures.Inc()
		if why := l.failed(err); why != "" {
			return why
		}
	}
	l.held, l.openDue = false, true
	l.sendRun(l.unacked)
	return ""
}

// takeCancel hands the ingress's cancel to the node's receiver, once, and
// ends the leg: the engine has marked the binding cancelling by the time
// HandleMessage returns, so it sends nothing more for it.
func (l *replyLeg) takeCancel(p *pb.PeerMessage) {
	r := l.r
	m, err := MessageFromPB(p)
	if err != nil || m.Kind != core.MsgCancel || m.JobID != l.key.job || m.Gen != l.key.gen {
		r.m.invalid.Inc()
		r.log.Warn("skipped an invalid cancel on a reply leg", "node", l.key.node, "job", l.key.job, "gen", l.key.gen, "err", err)
		return
	}
	if !l.cancelled.CompareAndSwap(false, true) {
		return
	}
	if rcv, err := r.srv.receiver(); err == nil {
		rcv.HandleMessage(l.key.node, m)
	} else {
		r.log.Error("a cancel came on a reply leg before routing started", "node", l.key.node, "job", l.key.job)
	}
	l.stopOnce.Do(func() { close(l.stop) })
}

// dropTrunk leaves the leg's failed trunk, applies the acks read before
// its end, and decides: "" to open the leg again, else why it ends.
func (l *replyLeg) dropTrunk() string {
	r := l.r
	t := l.t
	l.t = nil
	t.leave()
	l.applyAcks()
	if r.ctx.Err() != nil {
		return legEndClosed
	}
	if t.st.heard.Load() {
		l.failures = 0
	}
	l.failures++
	r.m.sendFailures.Inc()
	return l.failed(t.st.err)
}

// failed decides, after a failed trunk (or attempt to open one): "" to try
// again, else why the leg ends.
func (l *replyLeg) failed(err error) string {
	r := l.r
	if errors.Is(err, ErrClosed) {
		return legEndClosed
	}
	if permanent(err) {
		r.log.Error("the ingress refused a reply leg; dropping its messages", "node", l.key.node, "job", l.key.job, "err", err)
		return legEndRefuse
	}
	r.log.Debug("reply leg lost its trunk; opening it again", "node", l.key.node, "job", l.key.job,
		"unacked", len(l.unacked), "attempt", l.failures, "err", err)
	return ""
}

// leave takes the leg off its trunk, if it is open on one. If the ingress
// holds it there (it did not forget it at its last item), an end frame
// tells it to forget it.
func (l *replyLeg) leave() {
	t := l.t
	if t == nil {
		return
	}
	l.t = nil
	if l.held {
		t.send(&pb.RespondFrame{Body: &pb.RespondFrame_End{End: &pb.RespondLegEnd{JobId: l.key.job, Generation: l.key.gen}}})
	}
	t.leave()
}

// finish ends the leg once its last message was acked and nothing is
// queued behind it. False while the leg goes on.
func (l *replyLeg) finish() bool {
	r := l.r
	if !l.finalAcked || len(l.unacked) > 0 {
		return false
	}
	if l.held {
		// Something went after the last message: the ingress holds the
		// leg and is told to forget it while the leg is still the
		// binding's, so a leg opened after it for the same binding opens
		// after that end frame (see end). Something queued meanwhile is
		// sent on a trunk joined again.
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
// ingress is told on the trunk, if the leg is open on one.
func (l *replyLeg) end(why string) {
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
	l.unacked, l.pending, l.pendingBytes = nil, nil, 0
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
		r.log.Log(context.Background(), lvl, "reply leg ended with messages unsent", "node", l.key.node, "job", l.key.job, "gen", l.key.gen, "why", why, "messages", len(items))
	}
	r.m.legsEnded.WithLabelValues(why).Inc()
}
