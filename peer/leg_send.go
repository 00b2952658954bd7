package peer

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/core"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// The response leg, sending side (the consumer host): Transport.Send, which
// picks each message's path, and Transport.Expect; one response leg per
// binding, which carries the binding's replies and release in order on the
// node's reply stream to the job's ingress (reply_send.go). The receiving
// side is leg_recv.go and reply_recv.go. A leg's work (joining its reply
// stream, sending, ending) is done by its ingress node's one sender
// (leg_sender.go). Off this path: the leg's window and acks
// (leg_window.go), and how a leg ends (leg_end.go).

// Response leg timings and sizes (its window bounds: leg_window.go).
const (
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

type legKey struct {
	node, job string
	gen       uint64
}

// legItem is one message of a leg. wire is its item in a RespondFrame,
// allocated with it: sendRun fills in its number and open each time the
// item is sent.
type legItem struct {
	seq   uint64
	kind  string
	msg   *pb.PeerMessage
	size  int
	final bool
	wire  pb.RespondItem
	// body is msg's storage when the item was made with its message
	// (Send, for a reply or release).
	body pb.PeerMessage
}

// A responseLeg is the consumer host's side of one binding's response leg:
// the binding's replies and release, in order, to the job's ingress, on the
// node's reply stream to it (reply_send.go), with at most replyInFlight
// (and replyInFlightBytes) unacked and a queue behind them that the job's
// output credit bounds. Expect or the binding's first reply opens it. It
// ends once its last message is acked, on a cancel, at the job's TTL plus
// legTTLSlack, or when its ingress is gone or refuses it; never for being
// idle. When a reply stream fails, the leg joins the next one and resends
// what is unacked, numbers unchanged. docs/cluster.md, "Response leg", has
// the why. A leg has no goroutine: its ingress's legSender (leg_sender.go)
// does its work when something changed for it.
type responseLeg struct {
	r        *router
	s        *legSender // the sender of the legs to key.node
	key      legKey
	deadline time.Time
	// queueName is the job's queue, for its open frame: given by Expect or
	// by the message that opened the leg.
	queueName string
	// queued is the node's switchyard_peer_queue child, looked up once: a
	// leg's messages count in it one by one. The leg holds a reference on
	// the node (refLocked), so the child stays registered while it lives.
	queued prometheus.Gauge
	// timer marks the leg ready at its TTL (plus slack); for a leg Expect
	// opened, first at the end of its open delay (openAt).
	timer *time.Timer

	// stop: the job was cancelled (set once, then the leg is marked ready).
	stop atomic.Bool
	// cancelled: a cancel came on the leg (handled once, whichever reply
	// stream).
	cancelled atomic.Bool
	// acked is the highest seq the ingress acked (-1: none). Written by the
	// reply stream's reader, which then marks the leg ready.
	acked atomic.Int64

	// Under r.mu.
	pending []*legItem
	removed bool // no longer in r.legs
	ready   bool // in s.ready

	// The sender's own.
	unacked      []*legItem
	unackedBytes int
	finalAcked   bool
	t            *replyStream // the reply stream the leg is open on, nil while none
	// held: the ingress holds the leg on l.t (its open went out, and no
	// final item since, after which the ingress forgets the leg); else the
	// next item carries the leg's open. openDue: the leg joined l.t and
	// has sent nothing on it yet: if it has nothing to send, its open
	// goes alone.
	held, openDue bool
	// expected: opened by Expect, with nothing sent yet: it joins its reply
	// stream with its first reply, or alone at openAt.
	expected bool
	openAt   time.Time
}

// Send is core.Transport.Send: it queues m for node and returns at once.
// It never blocks on the network, so the engine calls it with its lock
// held. Each message takes one of three paths (see router), and the
// messages of one path to one node are sent in the order they were
// queued: a reply or release goes by its binding's response leg (replyLocked)
// or, when it is the binding's only message, by the node's unicast queue
// (unicast_send.go); a cancel for a job whose response leg from node this node
// holds goes back on that leg (cancelOnLeg, leg_recv.go), and so does a
// grant of output credit (grantOnLeg); every other kind goes by its
// queue's delivery stream (delivery_send.go).
func (t *Transport) Send(node string, m core.Message) {
	r := t.rt
	var (
		p   *pb.PeerMessage
		err error
		li  *legItem
	)
	if onDeliveryStream(m.Kind) {
		p, err = MessageToPB(m)
	} else {
		// A reply or release: made with the leg's item that carries it (a
		// binding's only message, which goes unicast, wastes the rest).
		li = new(legItem)
		p, err = &li.body, messageIntoPB(m, &li.body)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		r.m.dropped.WithLabelValues(string(m.Kind)).Inc()
		return
	}
	if err == nil && !onDeliveryStream(m.Kind) {
		r.replyLocked(node, m, li)
		return
	}
	if err == nil && m.Kind == core.MsgCancel && r.srv.cancelOnLeg(node, m.JobID, m.Gen, p) {
		// The job's response leg from node is open here: the cancel goes back
		// on it, and is counted when written.
		return
	}
	if err == nil && m.Kind == core.MsgGrant && r.srv.grantOnLeg(node, m.JobID, m.Gen, p) {
		return // as a cancel
	}
	if d := p.GetDelivery(); d != nil {
		// The job is meant for the node as the view names it now.
		d.Incarnation = r.incarnationOf(node)
	}
	it := &item{kind: string(m.Kind), msg: p, timeout: r.ackTimeout(m)}
	if err != nil {
		// No wire form: reported by the delivery stream's goroutine, off the
		// engine's lock.
		c := m
		it.bad, it.badErr = &c, err
	}
	r.enqueueLocked(node, m.Queue, it)
}

// onDeliveryStream reports whether messages of kind go by their queue's
// delivery stream rather than the response leg.
func onDeliveryStream(k core.MessageKind) bool { return k != core.MsgReply && k != core.MsgRelease }

// replyLocked queues a reply or release m for node, as it (made by Send
// with m's wire form): on the binding's leg, opening one if m is not the
// binding's last message, else on the node's unicast queue.
func (r *router) replyLocked(node string, m core.Message, it *legItem) {
	p := &it.body
	k := legKey{node, m.JobID, m.Gen}
	l := r.legs[k]
	final := m.Kind == core.MsgRelease || m.End != nil
	if l == nil {
		if final || r.cfg.ForceUnary {
			r.unicastLocked(node, p)
			return
		}
		l = r.startLegLocked(k, m.Queue, m.TTL, false)
	}
	it.kind, it.msg, it.size, it.final = string(m.Kind), p, p.SizeVT(), final
	l.pending = append(l.pending, it)
	l.queued.Inc()
	l.s.readyLocked(l)
}

// cancelLocked stops the leg: its sender ends it, once.
func (l *responseLeg) cancelLocked() {
	if !l.stop.Swap(true) {
		l.s.readyLocked(l)
	}
}

// Expect is core.Transport.Expect: it opens the response leg of binding (job,
// gen) to its ingress node before the binding's first message. The host
// calls it when it offers a remote ingress's job to its worker, so the
// ingress learns where the job runs and hears the host's heartbeats while
// the worker computes in silence (a silent host then fails the job within
// the heartbeat bound even before any output). The open frame waits up to
// openDelay for the job's first reply, to go out with it: a short job's
// open would otherwise cost the two nodes a frame of its own, and its
// wake-ups, while its worker starts. Opening carries no message. It never
// blocks.
func (t *Transport) Expect(node, job string, gen uint64, queue string, ttl time.Duration) {
	r := t.rt
	r.mu.Lock()
	defer r.mu.Unlock()
	k := legKey{node, job, gen}
	if r.closed || r.legs[k] != nil || r.cfg.ForceUnary {
		return
	}
	r.startLegLocked(k, queue, ttl, true)
}

// startLegLocked opens leg k, with its node's sender (started if the node
// has none) and its timer.
func (r *router) startLegLocked(k legKey, queue string, ttl time.Duration, expected bool) *responseLeg {
	now := time.Now()
	l := &responseLeg{r: r, key: k, queueName: queue, deadline: now.Add(max(ttl, 0) + legTTLSlack), expected: expected}
	l.acked.Store(-1)
	l.queued = r.m.queue.WithLabelValues(k.node)
	r.m.legsOpen.Inc()
	r.legs[k] = l
	r.jobLegs[k.job] = append(r.jobLegs[k.job], l)
	r.refLocked(k.node)
	l.s = r.legSenderLocked(k.node)
	l.s.legs[l] = struct{}{}
	first := l.deadline
	if expected {
		// Its open waits up to openDelay (a quarter of the heartbeat at
		// most) for the job's first reply, to go out with it.
		l.openAt = now.Add(min(openDelay, r.cfg.Heartbeat/4))
		if l.openAt.Before(first) {
			first = l.openAt
		}
	}
	l.timer = time.AfterFunc(first.Sub(now), l.timeUp)
	return l
}

// timeUp marks the leg ready when its timer fires: its open delay or its
// TTL passed.
func (l *responseLeg) timeUp() {
	r := l.r
	r.mu.Lock()
	l.s.readyLocked(l)
	r.mu.Unlock()
}

// stopped is why the leg must end now: a cancel, Close or its TTL; "" for
// none.
func (l *responseLeg) stopped(now time.Time) string {
	switch {
	case l.stop.Load():
		return legEndCancel
	case l.r.ctx.Err() != nil:
		return legEndClosed
	case !now.Before(l.deadline):
		return legEndTTL
	}
	return ""
}

// awaitingFirstReply reports whether a leg Expect opened still holds its
// open back for the job's first reply (nothing queued, its open delay
// not over); once it does not, its timer is set to its TTL.
func (l *responseLeg) awaitingFirstReply(now time.Time) bool {
	if !l.expected {
		return false
	}
	r := l.r
	r.mu.Lock()
	queued := len(l.pending) > 0
	r.mu.Unlock()
	if !queued && now.Before(l.openAt) {
		return true
	}
	l.expected = false
	l.timer.Reset(l.deadline.Sub(now))
	return false
}

// fill sends queued messages while the in-flight bounds allow: what was
// queued since the leg last sent goes in as few frames as it can (see
// RespondItems; a fast worker queues several outputs while one is sent).
func (l *responseLeg) fill() {
	r := l.r
	if l.t == nil {
		return
	}
	from := len(l.unacked)
	for {
		run := l.takeRun()
		if run == nil {
			break
		}
		kept := len(l.unacked) - len(run)
		for _, it := range run {
			if reason, err := r.wireCheckSize(it.msg, it.size+respondOverhead); err != nil {
				r.undeliverable(l.key.node, it.msg, nil, reason, err)
				if it.final {
					// Nothing of the leg is to come after it: the leg ends
					// once what went before is acked, not at its TTL.
					l.finalAcked = true
				}
				continue
			}
			l.unacked[kept] = it
			kept++
			l.unackedBytes += it.size
		}
		clear(l.unacked[kept:])
		l.unacked = l.unacked[:kept]
	}
	// What a failed send leaves unsent is unacked: the next reply stream
	// gets it.
	l.sendRun(l.unacked[from:])
}

// sendRun sends items, in order, on the leg's reply stream: they go in
// the frame its sender is filling (legSender.add), each with the leg's
// open if the ingress does not hold the leg when it comes to it (the first,
// or one after a final item: the ingress forgot the leg there).
func (l *responseLeg) sendRun(items []*legItem) {
	if len(items) == 0 {
		return
	}
	for _, it := range items {
		w := &it.wire
		w.Seq, w.Message, w.Open = it.seq, it.msg, nil
		if !l.held {
			w.Open = l.openOf()
		}
		// If the frame fails, so does the reply stream, and the leg joins
		// the next one not held.
		l.held = !it.final
		l.s.add(it)
	}
	l.openDue = false
}

// sendOpen sends the leg's open frame alone on the reply stream it joined,
// if it had no item to carry it.
func (l *responseLeg) sendOpen() {
	if l.t == nil || !l.openDue {
		return
	}
	l.openDue = false
	if l.t.send(&pb.RespondFrame{Body: &pb.RespondFrame_Open{Open: l.openOf()}}) {
		l.held = true
	}
}

// openOf is the leg's open.
func (l *responseLeg) openOf() *pb.RespondOpen {
	r := l.r
	return &pb.RespondOpen{
		Session: r.session, JobId: l.key.job, Generation: l.key.gen, Queue: l.queueName,
		HeartbeatIntervalNs: int64(r.cfg.Heartbeat), TtlNs: int64(max(time.Until(l.deadline), 0)),
	}
}
