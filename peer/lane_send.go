package peer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/switchyard/switchyard/core"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// laneWindow bounds the items a lane has sent on its stream and not yet
// seen acked; more wait in its queue until acks come back.
const laneWindow = 256

// seqOverhead is what an item's sequence number adds to its frame or Post,
// at most.
const seqOverhead = 1 + 10

// The request leg, sending side: lanes. The receiving side is
// lane_recv.go; a lane's stream is deliver_send.go, its unary path
// lane_unary.go.

// A lane is the ordered path of one queue's messages from this node to one
// node: the request leg's kinds (forward, deliver, cancel, unbind) and
// synchronous Forwards. Its goroutine sends its items in sequence order by
// one path at a time: its Deliver stream, with at most laneWindow unacked,
// or unary calls while it has none. A stream that stalls (an ack misses
// its deadline), fails or goes silent is dropped, and what it held unacked
// is resent by unary calls before anything newer, numbers unchanged; the
// receiver's lane memory skips what it handled already, so each item is
// handled once and in order whichever path carried it (the argument is in
// docs/cluster.md, "Stall → fallback").
type lane struct {
	r      *router
	key    laneKey
	wake   chan struct{} // capacity 1: "something was queued"
	rezone chan struct{} // capacity 1: "zones changed in the catalog view"

	// pending is under r.mu: queued, not yet taken by the goroutine.
	pending []*item

	// The rest is the goroutine's own.
	unacked     []*item   // sent on st, oldest first
	headSince   time.Time // when unacked[0] became the oldest unacked
	ackTimer    *time.Timer
	st          *laneStream
	openFailing bool      // the last open failed (logged once until one succeeds)
	warned      time.Time // the last fallback logged at warn level
}

// warnEvery rate-limits a lane's fallback warnings: a peer that keeps
// stalling would otherwise log one per message.
const warnEvery = time.Minute

// item is one lane item: a message from Send or a forward from Forward.
type item struct {
	seq     uint64
	kind    string
	msg     *pb.PeerMessage  // a Send
	fwd     *pb.PeerDelivery // a Forward
	timeout time.Duration    // its ack timeout
	cost    int              // bytes in a Post, once checked
	sentAt  time.Time

	// A Send with no wire form: reported, never sent.
	bad    *core.Message
	badErr error

	// A Forward: its caller's context (the item is skipped once it ends)
	// and its verdict, written once.
	ctx  context.Context
	done chan forwardResult
}

type forwardResult struct {
	res *pb.ForwardResponse
	err error
}

func (it *item) finish(res *pb.ForwardResponse, err error) {
	select {
	case it.done <- forwardResult{res, err}:
	default:
	}
}

// enqueue queues it on node's lane for queue: false after Close.
func (r *router) enqueue(node, queue string, it *item) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.enqueueLocked(node, queue, it)
	return true
}

// enqueueLocked numbers it and queues it on node's lane for queue,
// starting the lane's goroutine if it has none.
func (r *router) enqueueLocked(node, queue string, it *item) {
	k := laneKey{node, queue}
	l := r.lanes[k]
	if l == nil {
		l = &lane{r: r, key: k, wake: make(chan struct{}, 1), rezone: make(chan struct{}, 1)}
		r.lanes[k] = l
		r.refLocked(node)
		r.wg.Add(1)
		go l.run()
	}
	it.seq = r.seq
	r.seq++
	l.pending = append(l.pending, it)
	if it.fwd == nil {
		r.m.queue.WithLabelValues(node).Inc()
	}
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// run is the lane's goroutine.
func (l *lane) run() {
	r := l.r
	defer r.wg.Done()
	idle := time.NewTimer(r.cfg.StreamIdle)
	defer idle.Stop()
	l.ackTimer = time.NewTimer(time.Hour)
	l.ackTimer.Stop()
	defer l.ackTimer.Stop()
	for {
		if r.ctx.Err() != nil {
			l.shutdown()
			return
		}
		if l.flush() {
			idle.Reset(r.cfg.StreamIdle)
		}
		var (
			acks   <-chan *pb.DeliverHandled
			failed <-chan struct{}
			tick   <-chan time.Time
		)
		if st := l.st; st != nil {
			acks, failed, tick = st.acks, st.done, st.tick.C
		}
		select {
		case <-r.ctx.Done():
		case <-l.wake:
		case <-l.rezone:
			l.zoneCheck()
		case a := <-acks:
			l.acked(a)
			idle.Reset(r.cfg.StreamIdle)
		case <-failed:
			l.fallback("the stream failed", l.st.err)
		case <-l.ackTimer.C:
			// An ack already read counts: apply those first (acked re-arms
			// the timer for the new oldest item).
			l.drainAcks()
			if len(l.unacked) > 0 && !time.Now().Before(l.deadline()) {
				r.m.ackExpiries.Inc()
				head := l.unacked[0]
				l.fallback("an ack deadline passed", fmt.Errorf("%s of job %s unacked after %s", head.kind, jobOf(head), head.timeout))
			}
		case <-tick:
			if silent := time.Since(l.st.lastRecv()); silent > silentIntervals*r.cfg.Heartbeat {
				l.fallback("the peer went silent", fmt.Errorf("nothing received for %s", silent.Round(time.Millisecond)))
			}
		case <-idle.C:
			if l.idleOut() {
				return
			}
			idle.Reset(r.cfg.StreamIdle)
		}
	}
}

func jobOf(it *item) string {
	if it.fwd != nil {
		return it.fwd.GetJobId()
	}
	return it.msg.GetJobId()
}

// flush sends what is queued, as far as the stream's window allows:
// false when nothing was taken.
func (l *lane) flush() bool {
	streaming := !l.r.cfg.ForceUnary
	limit := -1
	if streaming {
		if limit = laneWindow - len(l.unacked); limit <= 0 {
			return false
		}
	}
	taken := l.take(limit)
	if len(taken) == 0 {
		return false
	}
	items := l.check(taken)
	if len(items) == 0 {
		return true
	}
	if streaming && l.st == nil && !l.openStream(len(items)) {
		l.gone(items)
		return true
	}
	if l.st == nil {
		l.unary(items)
	} else {
		l.stream(items)
	}
	return true
}

// openStream opens the lane's stream for n items about to be sent. One
// that cannot be opened leaves them to the unary path, logged once until a
// stream opens again. False when the lane's node left the catalog.
func (l *lane) openStream(n int) bool {
	r := l.r
	err := l.open()
	switch {
	case err == nil:
		return true
	case errors.Is(err, ErrUnknownNode):
		return false
	case r.ctx.Err() != nil:
		return true
	}
	r.m.fallbacks.Inc()
	lvl := slog.LevelWarn
	if l.openFailing {
		lvl = slog.LevelDebug // said once until a stream opens again
	}
	l.openFailing = true
	r.log.Log(r.ctx, lvl, "could not open a deliver stream; sending by unary calls", "node", l.key.node, "queue", l.key.queue, "messages", n, "err", err)
	return true
}

// stream sends items on the lane's stream; the first of them to be the
// oldest unacked arms the ack deadline.
func (l *lane) stream(items []*item) {
	now := time.Now()
	for _, it := range items {
		l.st.push(it, now)
		l.unacked = append(l.unacked, it)
		if len(l.unacked) == 1 {
			l.headSince = now
			l.armAck(now)
		}
	}
}

// take removes up to limit queued items (all for a negative limit).
func (l *lane) take(limit int) []*item {
	l.r.mu.Lock()
	defer l.r.mu.Unlock()
	n := len(l.pending)
	if limit >= 0 {
		n = min(n, limit)
	}
	if n == 0 {
		return nil
	}
	items := make([]*item, n)
	copy(items, l.pending)
	clear(l.pending[:n])
	l.pending = l.pending[n:]
	if len(l.pending) == 0 {
		l.pending = nil
	}
	return items
}

// check returns the items that can be sent: it reports those no transport
// can carry, and finishes forwards whose caller gave up.
func (l *lane) check(items []*item) []*item {
	r := l.r
	ok := items[:0]
	for _, it := range items {
		switch {
		case it.fwd != nil:
			if err := it.ctx.Err(); err != nil {
				it.finish(nil, err)
				continue
			}
		case it.bad != nil:
			r.undeliverable(l.key.node, nil, it.bad, ReasonEncoding, it.badErr)
			continue
		case !l.inZone(it):
			r.undeliverable(l.key.node, it.msg, nil, ReasonZone, l.zoneErr(it))
			continue
		default:
			if reason, err := r.wireCheck(it.msg, len(l.key.queue)+seqOverhead); err != nil {
				r.undeliverable(l.key.node, it.msg, nil, reason, err)
				continue
			}
			it.cost = protowire.SizeTag(3) + protowire.SizeBytes(proto.Size(it.msg)) + seqOverhead
		}
		ok = append(ok, it)
	}
	clear(items[len(ok):])
	return ok
}

// acked applies an ack: every unacked item up to its number is handled.
func (l *lane) acked(a *pb.DeliverHandled) {
	r := l.r
	n := 0
	for n < len(l.unacked) && l.unacked[n].seq <= a.GetSeq() {
		n++
	}
	if n == 0 {
		return
	}
	var sent int
	for _, it := range l.unacked[:n] {
		if it.fwd == nil {
			r.m.messages.WithLabelValues(it.kind).Inc()
			r.m.streamed.Inc()
			sent++
			continue
		}
		switch {
		case it.seq != a.GetSeq():
			// Never: a forward's ack is its own.
			it.finish(nil, status.Error(codes.Unavailable, "the forward's ack carried no verdict"))
		case a.GetErrorCode() != 0:
			r.m.sendFailures.Inc()
			it.finish(nil, status.Error(codes.Code(a.GetErrorCode()), a.GetError()))
		default:
			r.m.messages.WithLabelValues(it.kind).Inc()
			r.m.streamed.Inc()
			res := a.GetVerdict()
			if res == nil {
				res = &pb.ForwardResponse{}
			}
			it.finish(res, nil)
		}
	}
	if sent > 0 {
		r.m.queue.WithLabelValues(l.key.node).Sub(float64(sent))
	}
	clear(l.unacked[:n])
	l.unacked = l.unacked[n:]
	if len(l.unacked) == 0 {
		l.unacked = nil
	}
	now := time.Now()
	l.headSince = now
	l.armAck(now)
}

// deadline is when the oldest unacked item's ack is due: its ack timeout
// after it was sent or became the oldest, whichever is later (the
// receiver handles a lane's items one at a time).
func (l *lane) deadline() time.Time {
	head := l.unacked[0]
	since := head.sentAt
	if l.headSince.After(since) {
		since = l.headSince
	}
	return since.Add(head.timeout)
}

// armAck sets the ack timer to the oldest unacked item's deadline.
func (l *lane) armAck(now time.Time) {
	if len(l.unacked) == 0 {
		l.ackTimer.Stop()
		return
	}
	l.ackTimer.Reset(l.deadline().Sub(now))
}

// drainAcks applies the acks the stream's reader has already read.
func (l *lane) drainAcks() {
	if l.st == nil {
		return
	}
	for {
		select {
		case a := <-l.st.acks:
			l.acked(a)
		default:
			return
		}
	}
}

// fallback drops the stream and resends every unacked item, in order, by
// unary calls, before anything newer is sent.
func (l *lane) fallback(why string, err error) {
	r := l.r
	if r.ctx.Err() != nil {
		return // Close: shutdown drops what is left
	}
	l.dropStream()
	r.m.fallbacks.Inc()
	lvl := slog.LevelDebug
	if now := time.Now(); now.Sub(l.warned) >= warnEvery {
		lvl, l.warned = slog.LevelWarn, now
	}
	r.log.Log(r.ctx, lvl, "deliver stream dropped; resending its unacked messages by unary calls", "node", l.key.node, "queue", l.key.queue, "why", why, "unacked", len(l.unacked), "err", err)
	items := l.unacked
	l.unacked = nil
	l.ackTimer.Stop()
	l.unary(items)
}

// drop gives up on items: messages are counted as dropped, forwards fail
// with err.
func (l *lane) drop(items []*item, err error) {
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

// gone drops items and everything else the lane holds: its node left the
// catalog (its lease is gone: it is dead).
func (l *lane) gone(items []*item) {
	all := append(append(append([]*item(nil), items...), l.unacked...), l.take(-1)...)
	l.unacked = nil
	l.ackTimer.Stop()
	if l.st != nil {
		l.dropStream()
	}
	l.drop(all, ErrUnknownNode)
	l.r.log.Warn("dropped routing messages to a node that left the catalog", "node", l.key.node, "queue", l.key.queue, "messages", len(all))
}

// idleOut ends the lane after StreamIdle without traffic, unless something
// is unacked or was queued meanwhile: true when the goroutine must exit.
func (l *lane) idleOut() bool {
	r := l.r
	if len(l.unacked) > 0 {
		return false
	}
	r.mu.Lock()
	if len(l.pending) > 0 {
		r.mu.Unlock()
		return false
	}
	delete(r.lanes, l.key)
	r.unrefLocked(l.key.node)
	r.mu.Unlock()
	if l.st != nil {
		l.closeStream()
		r.m.idleCloses.Inc()
	}
	return true
}

// shutdown ends the lane at Close: what it holds is dropped.
func (l *lane) shutdown() {
	r := l.r
	if l.st != nil {
		l.dropStream()
	}
	r.mu.Lock()
	pending := l.pending
	l.pending = nil
	delete(r.lanes, l.key)
	r.mu.Unlock()
	l.drop(append(append([]*item(nil), l.unacked...), pending...), ErrClosed)
	l.unacked = nil
	r.mu.Lock()
	r.unrefLocked(l.key.node)
	r.mu.Unlock()
}
