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
// side is leg_recv.go and reply_recv.go. Off this path: the leg's window
// and acks (leg_window.go), and how a leg ends or carries on after its
// reply stream failed (leg_end.go).

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
// allocated with it: sendFrame fills in its number and open each time the
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
// the why.
type responseLeg struct {
	r        *router
	key      legKey
	deadline time.Time
	// queueName is the job's queue, for its open frame: given by Expect or
	// by the message that opened the leg.
	queueName string
	// wake (capacity 1) says something changed that the leg's goroutine
	// must look at: a message queued, an ack, a cancel (stop).
	wake chan struct{}
	// queued is the node's switchyard_peer_queue child, looked up once: a
	// leg's messages count in it one by one. The leg holds a reference on
	// the node (refLocked), so the child stays registered while it lives.
	queued prometheus.Gauge

	// stop: the job was cancelled (set once, then the leg is woken).
	stop atomic.Bool
	// cancelled: a cancel came on the leg (handled once, whichever reply
	// stream).
	cancelled atomic.Bool
	// acked is the highest seq the ingress acked (-1: none). Written by the
	// reply stream's reader, which then wakes the leg.
	acked atomic.Int64

	// Under r.mu.
	pending []*legItem
	removed bool // no longer in r.legs

	// The goroutine's own.
	unacked      []*legItem
	unackedBytes int
	finalAcked   bool
	t            *replyStream // the reply stream the leg is open on, nil while none
	failures     int          // reply stream attempts failed in a row
	// held: the ingress holds the leg on l.t (its open went out, and no
	// final item since, after which the ingress forgets the leg); else the
	// next item carries the leg's open. openDue: the leg joined l.t and
	// has sent nothing on it yet: if it has nothing to send, its open
	// goes alone.
	held, openDue bool
	// expected: opened by Expect, with nothing to send yet.
	expected bool
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
	l.signal()
}

// signal wakes the leg's goroutine, unless a wake is pending already.
func (l *responseLeg) signal() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// cancel stops the leg: its goroutine ends it, once.
func (l *responseLeg) cancel() {
	if !l.stop.Swap(true) {
		l.signal()
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

// startLegLocked opens leg k and starts its goroutine.
func (r *router) startLegLocked(k legKey, queue string, ttl time.Duration, expected bool) *responseLeg {
	l := &responseLeg{r: r, key: k, queueName: queue, wake: make(chan struct{}, 1),
		deadline: time.Now().Add(max(ttl, 0) + legTTLSlack), expected: expected}
	l.acked.Store(-1)
	l.queued = r.m.queue.WithLabelValues(k.node)
	r.m.legsOpen.Inc()
	r.legs[k] = l
	r.jobLegs[k.job] = append(r.jobLegs[k.job], l)
	r.refLocked(k.node)
	r.wg.Add(1)
	go l.run()
	return l
}

// run is the leg's goroutine: it sends what is queued, as the reply stream and
// the in-flight bound allow, until the leg ends.
func (l *responseLeg) run() {
	defer l.r.wg.Done()
	// One timer per leg: an Expect'ed leg's open delay first, then its TTL.
	ttl := time.NewTimer(time.Until(l.deadline))
	defer ttl.Stop()
	if l.expected {
		l.expected = false
		if !l.awaitFirstReply(ttl) {
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
// the job's first reply: false when the job's TTL passed meanwhile. It
// borrows the leg's TTL timer for the delay (the earlier of the two), and
// leaves it set to the TTL.
func (l *responseLeg) awaitFirstReply(ttl *time.Timer) bool {
	ttl.Reset(min(openDelay, l.r.cfg.Heartbeat/4, time.Until(l.deadline)))
	select {
	case <-l.wake:
		// The loop sends what was queued without waiting for another wake
		// (or ends the leg, if it was a cancel).
	case <-ttl.C:
		if !time.Now().Before(l.deadline) {
			return false
		}
	case <-l.r.ctx.Done():
	}
	ttl.Reset(time.Until(l.deadline))
	return true
}

// step sends what it can, then waits for something to change: "" to go
// on, legEndDone once the leg finished, else why it must end.
func (l *responseLeg) step(ttl <-chan time.Time) string {
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
func (l *responseLeg) stopped(ttl <-chan time.Time) string {
	if l.stop.Load() {
		return legEndCancel
	}
	select {
	case <-l.r.ctx.Done():
		return legEndClosed
	case <-ttl:
		return legEndTTL
	default:
		return ""
	}
}

// wait waits for something to send, an ack, a reason to stop, or the
// reply stream to fail: as step.
func (l *responseLeg) wait(ttl <-chan time.Time) string {
	var done <-chan struct{}
	if l.t != nil {
		done = l.t.st.done
	}
	select {
	case <-l.r.ctx.Done():
	case <-ttl:
		return legEndTTL
	case <-l.wake:
	case <-done:
		if why := l.dropReplyStream(); why != "" {
			return why
		}
		// The acks read before the reply stream ended may have covered the
		// leg's last message: then it is done, not to be opened again.
		if l.finish() {
			return legEndDone
		}
	}
	return ""
}

// connect opens the leg on its ingress's reply stream, opening the reply
// stream if it has none, after a backoff when the last attempt failed, and
// resends what is unacked: "" once open, else why the leg ends.
func (l *responseLeg) connect(ttl <-chan time.Time) string {
	r := l.r
	for {
		if l.failures > 0 {
			d := r.backoff(l.failures - 1)
			if why := l.backoff(d, ttl); why != "" {
				return why
			}
		}
		if r.ctx.Err() != nil {
			return legEndClosed
		}
		addr, ok := r.cfg.Addr(l.key.node)
		if !ok {
			return legEndGone
		}
		t, err := r.replyStreamFor(l.key.node, addr)
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

// backoff waits d before the leg tries its reply stream again: "" after
// it, else why the leg ends meanwhile. What wakes the leg meanwhile (a
// message queued, an ack) waits for the reply stream.
func (l *responseLeg) backoff(d time.Duration, ttl <-chan time.Time) string {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			return ""
		case <-l.r.ctx.Done():
			return legEndClosed
		case <-l.wake:
			if l.stop.Load() {
				return legEndCancel
			}
		case <-ttl:
			return legEndTTL
		}
	}
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

// sendRun sends items, in order, on the leg's reply stream: as many to a
// frame as the peer message limit allows. False once the reply stream
// failed.
func (l *responseLeg) sendRun(items []*legItem) bool {
	for len(items) > 0 {
		n, size := 0, 0
		for n < len(items) && (n == 0 || size+items[n].size+respondOverhead <= l.r.maxUnicast) {
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
func (l *responseLeg) sendFrame(items []*legItem) bool {
	held := l.held
	for _, it := range items {
		w := &it.wire
		w.Seq, w.Message, w.Open = it.seq, it.msg, nil
		if !held {
			w.Open = l.openOf()
		}
		held = !it.final
	}
	l.openDue = false
	if !l.t.sendItems(items) {
		return false
	}
	l.r.m.replyFrames.Inc()
	l.held = held
	return true
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
