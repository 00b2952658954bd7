package peer

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/switchyard/switchyard/core"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// The response leg, consumer host side: one reply leg per binding (ingress
// node, job, generation), carrying its replies and release to the ingress
// in order and its cancel back, multiplexed with the other legs to the same
// ingress on one Respond stream, the node's reply trunk to it. The ingress
// side is respondserver.go.

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
	// DefaultReplyWindow and DefaultReplyWindowBytes are RouterConfig's
	// defaults: a leg's queue of messages not yet sent on its stream may
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

// kindRespond is the switchyard_peer_streams_open kind of a reply trunk.
const kindRespond = "respond"

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

var (
	errLegSilent  = errors.New("peer: nothing received on the reply trunk for three heartbeat intervals")
	errLegDropped = errors.New("peer: reply trunk dropped")
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

// A replyLeg is one binding's response stream to its ingress (a reply leg):
// the consumer host's side of it.
//
// It is opened by the binding's first reply (a release or end with no leg
// open goes by the node's unary Post FIFO: there is nothing before it to
// overtake), or ahead of it by Expect, and carries every later reply and
// the release, in order. One goroutine per leg sends them on the node's
// reply trunk to the ingress (replyTrunk), after the leg's open frame,
// with at most replyInFlight (and replyInFlightBytes) unacked; the trunk's
// reader hands the leg its acks and its cancel. The leg ends:
//
//   - once its last message (an end or a release) is acked and nothing is
//     queued behind it;
//   - on a cancel from the ingress, on the trunk (handed to the node's
//     Handler first, so the engine stops the worker) or by another path
//     (Server tells the router once its Handler took it);
//   - at the job's TTL, as the first reply measured it, plus legTTLSlack;
//   - when the ingress leaves the catalog (dead), refuses the stream for
//     good, or at Router.Close; what it held is dropped and counted.
//
// A leg that ends without its last message acked says so on the trunk (an
// end frame), so the ingress forgets it. Never on idleness: while the
// worker computes in silence, the trunk heartbeats both ways.
//
// A trunk that fails, or on which nothing (ack, heartbeat) arrives for
// three heartbeat intervals, is dropped; each of its legs opens the next
// one (or finds it open) after a backoff, while the ingress still
// resolves, and sends its open frame and its unacked messages first, in
// order, with their numbers; the ingress skips what it handled already
// (per host session, job, generation and number). Numbers come from the
// router's counter, so they only grow within a session, across legs of one
// binding too.
//
// Flow control: messages wait in the leg's queue while the in-flight bound
// is reached, or while the goroutine waits for the trunk because gRPC's
// HTTP/2 window is full (an ingress not reading). Room hands the worker
// session a channel once the queue holds ReplyWindow messages or
// ReplyWindowBytes, closed when it drains below half; the session stops
// reading its worker until then, and the worker's own gRPC send blocks.
// Nothing is dropped, and nothing grows without bound: per leg, the queue
// holds at most the window plus the messages the engine sends without
// asking Room (an end, an accept, a release), and the in-flight bound
// holds the rest.
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

// legStream is one Respond call: a trunk's stream.
type legStream struct {
	ctx     context.Context
	cancel  context.CancelCauseFunc
	cs      pb.PeerService_RespondClient
	silence *time.Timer // fails the stream after three silent intervals
	done    chan struct{}
	err     error
	once    sync.Once
	heard   atomic.Bool // something arrived: the stream works
	wg      sync.WaitGroup
}

func (st *legStream) fail(err error) {
	st.once.Do(func() {
		st.err = err
		close(st.done)
	})
	st.cancel(err)
}

func (st *legStream) isDone() bool {
	select {
	case <-st.done:
		return true
	default:
		return false
	}
}

// A replyTrunk is the one Respond stream this node holds to an ingress
// node: every reply leg to that node is multiplexed on it, each as its
// open frame and its numbered items. A stream per leg would carry the
// same frames, but setting one up and tearing it down at both ends (HTTP/2
// stream, handler and reader goroutines, timers, contexts) cost more CPU
// than the rest of a short job's cross-node traffic together
// (BenchmarkCluster, docs/cluster.md).
//
// The legs' goroutines send on it under sendMu, one frame at a time; its
// reader hands each ack and cancel to the leg it names; its own goroutine
// heartbeats while nothing else went out for half an interval, and closes
// it once no leg used it for RouterConfig.StreamIdle. It fails as a whole
// (a send or receive error, or three silent intervals), and its legs move
// to the next one.
type replyTrunk struct {
	r      *router
	node   string
	st     *legStream
	sendMu sync.Mutex
	// lastSend is when a frame last went out, UnixNano.
	lastSend atomic.Int64
	// idled: closed for idleness (the reader's EOF is not a failure).
	idled atomic.Bool

	// Under r.mu.
	users     int       // legs open on it
	idleSince time.Time // when users last fell to 0
	closing   bool      // idle: no leg may join it
}

// Expect opens the reply leg of binding (job, gen) to its ingress node
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

// Room is the reply leg's flow control (core.Cluster.Room): nil while the
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

// legCancelled ends the legs of binding (job, gen), whose cancel reached
// this node's Handler by another path than the leg (the dispatcher passed
// it on, or the ingress sent it before the leg opened): the engine has
// marked the binding cancelling, so nothing more is sent on them. Called
// by the node's Server, without its locks.
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

// run is the leg's goroutine.
func (l *replyLeg) run() {
	r := l.r
	defer r.wg.Done()
	ttl := time.NewTimer(time.Until(l.deadline))
	defer ttl.Stop()
	if l.expected {
		l.expected = false
		t := time.NewTimer(min(openDelay, r.cfg.Heartbeat/4))
		select {
		case <-l.wake:
			// The loop below sends what was queued without waiting for
			// another wake.
		case <-t.C:
		case <-r.ctx.Done():
		case <-l.stop:
		case <-ttl.C:
			l.end(legEndTTL)
			t.Stop()
			return
		}
		t.Stop()
	}
	for {
		select {
		case <-r.ctx.Done():
			l.end(legEndClosed)
			return
		case <-l.stop:
			l.end(legEndCancel)
			return
		case <-ttl.C:
			l.end(legEndTTL)
			return
		default:
		}
		if l.t == nil {
			if why := l.connect(ttl.C); why != "" {
				l.end(why)
				return
			}
		}
		l.applyAcks()
		l.fill()
		l.sendOpen()
		if l.finish() {
			return
		}
		var done <-chan struct{}
		if l.t != nil {
			done = l.t.st.done
		}
		select {
		case <-r.ctx.Done():
		case <-l.stop:
		case <-ttl.C:
			l.end(legEndTTL)
			return
		case <-l.wake:
		case <-l.ackc:
		case <-done:
			if why := l.dropTrunk(); why != "" {
				l.end(why)
				return
			}
			// The acks read before the trunk ended may have covered the
			// leg's last message: then it is done, not to be opened again.
			if l.finish() {
				return
			}
		}
	}
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

// openOf is the leg's open.
func (l *replyLeg) openOf() *pb.RespondOpen {
	r := l.r
	return &pb.RespondOpen{
		Session: r.session, JobId: l.key.job, Generation: l.key.gen, Queue: l.queueName,
		HeartbeatIntervalNs: int64(r.cfg.Heartbeat), TtlNs: int64(max(time.Until(l.deadline), 0)),
	}
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

// trunkFor is node's trunk, opened if it has none (or only a failed or
// closing one), with the caller counted as one of its legs. Opening does
// not wait for the ingress: the first open frame and items go out with the
// call's headers.
func (r *router) trunkFor(node, addr string) (*replyTrunk, error) {
	r.mu.Lock()
	mu := r.trunkOpen[node]
	if mu == nil {
		mu = new(sync.Mutex)
		r.trunkOpen[node] = mu
	}
	r.mu.Unlock()
	// One opening per node at a time: the legs that wait for it join it.
	mu.Lock()
	defer mu.Unlock()
	r.mu.Lock()
	if t := r.trunks[node]; t != nil && !t.closing && !t.st.isDone() {
		t.users++
		r.mu.Unlock()
		return t, nil
	}
	r.mu.Unlock()
	cc, err := r.client.Conn(addr)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancelCause(r.ctx)
	st := &legStream{ctx: ctx, cancel: cancel, done: make(chan struct{})}
	// Armed before the call: a connection being made holds it up.
	st.silence = time.AfterFunc(silentIntervals*r.cfg.Heartbeat, func() { st.fail(errLegSilent) })
	cs, err := pb.NewPeerServiceClient(cc).Respond(ctx)
	if err != nil {
		st.silence.Stop()
		if errors.Is(context.Cause(ctx), errLegSilent) {
			err = errLegSilent
		}
		cancel(err)
		return nil, err
	}
	st.cs = cs
	t := &replyTrunk{r: r, node: node, st: st, users: 1}
	t.lastSend.Store(time.Now().UnixNano())
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		st.silence.Stop()
		cancel(ErrClosed)
		return nil, ErrClosed
	}
	r.trunks[node] = t
	r.wg.Add(1)
	r.mu.Unlock()
	r.m.streamsOpen.WithLabelValues(kindRespond).Inc()
	r.m.streamsOpened.WithLabelValues(kindRespond).Inc()
	st.wg.Add(1)
	go t.read()
	go t.run()
	return t, nil
}

// leave takes a leg off t; the last one starts its idle time.
func (t *replyTrunk) leave() {
	r := t.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if t.users--; t.users == 0 {
		t.idleSince = time.Now()
	}
}

// send sends f on the trunk: false when the trunk failed (its legs then
// see st.done).
func (t *replyTrunk) send(f *pb.RespondFrame) bool {
	st := t.st
	if st.isDone() {
		return false
	}
	t.sendMu.Lock()
	err := st.cs.Send(f)
	t.sendMu.Unlock()
	if err != nil {
		// Send reports io.EOF for a stream the ingress ended: the reader
		// gets the real status. Wait for it, a bounded while.
		tm := time.NewTimer(silentIntervals * t.r.cfg.Heartbeat)
		select {
		case <-st.done:
		case <-tm.C:
			st.fail(err)
		case <-t.r.ctx.Done():
			st.fail(ErrClosed)
		}
		tm.Stop()
		return false
	}
	t.lastSend.Store(time.Now().UnixNano())
	return true
}

// run heartbeats while nothing else went out for half an interval, closes
// the trunk once no leg used it for StreamIdle, and cleans up after it
// failed.
func (t *replyTrunk) run() {
	r := t.r
	defer r.wg.Done()
	hb := r.cfg.Heartbeat
	tick := time.NewTicker(hb)
	defer tick.Stop()
	heartbeat := &pb.RespondFrame{Body: &pb.RespondFrame_Heartbeat{Heartbeat: &pb.DeliverHeartbeat{}}}
	for {
		select {
		case <-r.ctx.Done():
			t.st.fail(ErrClosed)
			t.retire()
			return
		case <-t.st.done:
			t.retire()
			return
		case <-tick.C:
		}
		if time.Since(time.Unix(0, t.lastSend.Load())) >= hb/2 {
			t.send(heartbeat)
		}
		r.mu.Lock()
		idle := t.users == 0 && time.Since(t.idleSince) >= r.cfg.StreamIdle
		if idle {
			t.closing = true
		}
		r.mu.Unlock()
		if idle {
			t.close()
			return
		}
	}
}

// close ends an idle trunk cleanly: it half-closes, waits a bounded while
// for the ingress to end the stream, then drops it.
func (t *replyTrunk) close() {
	st := t.st
	t.idled.Store(true)
	t.sendMu.Lock()
	err := st.cs.CloseSend()
	t.sendMu.Unlock()
	if err == nil {
		tm := time.NewTimer(silentIntervals * t.r.cfg.Heartbeat)
		select {
		case <-st.done:
		case <-tm.C:
		case <-t.r.ctx.Done():
		}
		tm.Stop()
	}
	t.r.m.trunkIdle.Inc()
	st.fail(errLegDropped)
	t.retire()
}

// retire forgets a trunk that ended: it waits for its reader and stops its
// timer.
func (t *replyTrunk) retire() {
	r := t.r
	r.mu.Lock()
	if r.trunks[t.node] == t {
		delete(r.trunks, t.node)
	}
	r.mu.Unlock()
	t.st.wg.Wait()
	t.st.silence.Stop()
	r.m.streamsOpen.WithLabelValues(kindRespond).Dec()
	if err := t.st.err; !t.idled.Load() && !errors.Is(err, errLegDropped) && !errors.Is(err, ErrClosed) && r.ctx.Err() == nil {
		if errors.Is(err, errLegSilent) {
			r.m.legSilences.WithLabelValues("host").Inc()
		}
		r.log.Warn("reply trunk failed; its legs open the next one", "node", t.node, "err", err)
	}
}

// leg is the open leg of binding (job, gen) to t's node, nil if none.
func (t *replyTrunk) leg(job string, gen uint64) *replyLeg {
	t.r.mu.Lock()
	defer t.r.mu.Unlock()
	return t.r.legs[legKey{t.node, job, gen}]
}

// read reads the ingress's frames: each ack to its leg, a cancel to the
// node's Handler (at once: the legs may be blocked in Send). Every frame
// proves the ingress alive.
func (t *replyTrunk) read() {
	st := t.st
	defer st.wg.Done()
	r := t.r
	hb := r.cfg.Heartbeat
	for {
		c, err := st.cs.Recv()
		if err != nil {
			st.fail(err)
			return
		}
		st.heard.Store(true)
		st.silence.Reset(silentIntervals * hb)
		switch b := c.GetBody().(type) {
		case *pb.RespondControl_Ack:
			l := t.leg(b.Ack.GetJobId(), b.Ack.GetGeneration())
			if l == nil {
				continue // it ended meanwhile
			}
			// CAS: a failed trunk's reader may still apply an older ack.
			for s, a := int64(b.Ack.GetSeq()), l.acked.Load(); s > a && !l.acked.CompareAndSwap(a, s); a = l.acked.Load() {
			}
			select {
			case l.ackc <- struct{}{}:
			default:
			}
		case *pb.RespondControl_Cancel:
			if l := t.leg(b.Cancel.GetJobId(), b.Cancel.GetGeneration()); l != nil {
				l.takeCancel(b.Cancel)
			}
		}
	}
}

// takeCancel hands the ingress's cancel to the node's Handler, once, and
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

// backoff is the wait before attempt+1, with jitter (see sleep).
func (r *router) backoff(attempt int) time.Duration {
	d := r.cfg.RetryMax
	if attempt < 30 {
		d = min(r.cfg.RetryMin<<attempt, r.cfg.RetryMax)
	}
	return d/2 + rand.N(d/2+1)
}
