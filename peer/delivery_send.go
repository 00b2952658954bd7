package peer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchyard/switchyard/internal/chans"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/switchyard/switchyard/core"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// The request leg, sending side: Transport.Forward, the delivery stream per
// (node, queue) that carries it and the request leg's messages, and the
// delivery stream's Deliver stream. The receiving side is delivery_recv.go.
// Off this path, each in its own file: what an ack settles and the ack
// deadline (delivery_acks.go), the fallback to unary calls when a stream
// stalls, fails or goes silent (delivery_stall.go), the unary path itself
// (delivery_unary.go), the zone test (delivery_zone.go), how a delivery
// stream ends (delivery_end.go), and the backoff between attempts
// (retry.go).

// deliveryWindow bounds the items a delivery stream has sent on its stream
// and not yet seen acked; more wait in its queue until acks come back.
const deliveryWindow = 256

// seqOverhead is what an item's sequence number adds to its frame or Post,
// at most.
const seqOverhead = 1 + 10

// Forward is core.Transport.Forward: it hands d to the dispatcher on node
// and returns its verdict: nil once the dispatcher holds the job, the
// *core.Error it refused it with, or an error when no verdict could be
// had: node is not in the catalog (wraps ErrUnknownNode), the job cannot
// be carried at all (wraps ErrUndeliverable), it failed in a way retrying
// cannot cure, or ctx ended (wraps ctx.Err()) while it kept failing
// transiently (Unavailable, or an attempt that timed out). Retrying is
// safe: the dispatcher takes a (job id, generation) once.
//
// The forward is an item of its queue's delivery stream: sent on the
// delivery stream's Deliver stream and answered by its ack, or by a unary
// Forward call when the delivery stream has no stream or dropped it (the
// receiver answers a resent item with the verdict it gave first). An
// attempt that got no verdict is made again as a new item, after a backoff.
func (t *Transport) Forward(ctx context.Context, node string, d core.Delivery) error {
	r := t.rt
	// The forward ends with ctx or with the router (Close), whichever
	// ends first: each wait below watches both, rather than a context
	// joining them made for every forward.
	c := &forwardCall{r: r, ctx: ctx, node: node, d: d}
	p := DeliveryToPB(d)
	// Every attempt is meant for the incarnation of node the view names
	// now: once it names another, the forward fails (attempt).
	p.Incarnation = r.incarnationOf(node)
	if reason, err := r.wireCheck(p, len(d.Queue)); err != nil {
		r.m.undeliverable.WithLabelValues(string(core.MsgForward), reason).Inc()
		return c.fail(fmt.Errorf("%w (%s): %w", ErrUndeliverable, reason, err))
	}
	timeout := r.ackTimeout(core.Message{Kind: core.MsgForward, JobID: d.JobID, Gen: d.Gen, Queue: d.Queue, Delivery: &d})
	// The caller's span of the forward (core's switchyard.forward) counts
	// the attempts.
	span := trace.SpanFromContext(ctx)
	for attempt := 0; ; attempt++ {
		res, err := c.attempt(p, timeout)
		if span.IsRecording() {
			span.SetAttributes(core.AttrAttempt.Int(attempt + 1))
		}
		switch {
		case err != nil:
			return err
		case res != nil:
			return ForwardError(res)
		}
		r.log.DebugContext(ctx, "forward failed; retrying", "node", node, "job", d.JobID, "attempt", attempt+1, "err", c.last)
		if !r.sleep(ctx, attempt) {
			return c.ended(c.last)
		}
	}
}

// forwardCall is one forward's attempts.
type forwardCall struct {
	r    *router
	ctx  context.Context // the caller's; the forward also ends with r.ctx
	node string
	d    core.Delivery
	// last is the last attempt that failed on its own: when ctx ends
	// during an attempt, that attempt's error only repeats ctx's.
	last error
}

// attempt makes one attempt: the forward as a new item of its delivery
// stream. It returns the verdict, or the error the forward ends with, or
// neither when a transient failure (in last) is worth another attempt.
func (c *forwardCall) attempt(p *pb.PeerDelivery, timeout time.Duration) (*pb.ForwardResponse, error) {
	r := c.r
	if r.ctx.Err() != nil {
		return nil, c.fail(ErrClosed)
	}
	if _, ok := r.cfg.Addr(c.node); !ok {
		return nil, c.fail(ErrUnknownNode)
	}
	if now, stale := r.replaced(c.node, p.GetIncarnation()); stale {
		r.m.stale.WithLabelValues(string(core.MsgForward), sideSender).Inc()
		return nil, c.fail(fmt.Errorf("%w: meant for incarnation %s, the view names %s", core.ErrNodeReplaced, p.GetIncarnation(), now))
	}
	it := &item{kind: string(core.MsgForward), fwd: p, timeout: timeout, ctx: c.ctx, done: make(chan forwardResult, 1)}
	if !r.enqueue(c.node, c.d.Queue, it) {
		return nil, c.fail(ErrClosed)
	}
	var res forwardResult
	select {
	case res = <-it.done:
	case <-c.ctx.Done():
		return nil, c.ended(c.ctx.Err())
	case <-r.ctx.Done():
		return nil, c.ended(r.ctx.Err())
	}
	res.err = replacedError(res.err)
	switch {
	case res.err == nil:
		return res.res, nil
	case errors.Is(res.err, ErrUnknownNode), errors.Is(res.err, core.ErrNodeReplaced):
		return nil, c.fail(res.err)
	case c.ctx.Err() != nil, r.ctx.Err() != nil:
		return nil, c.ended(res.err)
	case !transient(res.err):
		return nil, c.fail(res.err)
	}
	c.last = res.err
	return nil, nil
}

// A delivery stream is the ordered path of one queue's messages from this
// node to one node: the request leg's kinds (forward, deliver, cancel,
// unbind) and synchronous Forwards. Its goroutine sends its items in
// sequence order by one path at a time: its Deliver stream, with at most
// deliveryWindow unacked, or unary calls while it has none. A stream that
// stalls (an ack misses its deadline), fails or goes silent is dropped, and
// what it held unacked is resent by unary calls before anything newer,
// numbers unchanged; the receiver's delivery stream memory skips what it
// handled already, so each item is handled once and in order whichever path
// carried it (the argument is in docs/cluster.md, "Stall → fallback").
type deliveryStream struct {
	r      *router
	key    deliveryKey
	wake   chan struct{} // capacity 1: "something was queued"
	rezone chan struct{} // capacity 1: "zones changed in the catalog view"

	// pending is under r.mu: queued, not yet taken by the goroutine.
	pending []*item

	// The rest is the goroutine's own.
	unacked     []*item   // sent on st, oldest first
	headSince   time.Time // when unacked[0] became the oldest unacked
	ackTimer    *time.Timer
	st          *deliverCall
	openFailing bool      // the last open failed (logged once until one succeeds)
	warned      time.Time // the last fallback logged at warn level
}

// item is one delivery stream item: a message from Send or a forward from
// Forward.
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

// enqueue queues it on node's delivery stream for queue: false after Close.
func (r *router) enqueue(node, queue string, it *item) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.enqueueLocked(node, queue, it)
	return true
}

// enqueueLocked numbers it and queues it on node's delivery stream for queue,
// starting the delivery stream's goroutine if it has none.
func (r *router) enqueueLocked(node, queue string, it *item) {
	k := deliveryKey{node, queue}
	l := r.deliveries[k]
	if l == nil {
		l = &deliveryStream{r: r, key: k, wake: make(chan struct{}, 1), rezone: make(chan struct{}, 1)}
		r.deliveries[k] = l
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
	chans.Notify(l.wake)
}

// run is the delivery stream's goroutine.
func (l *deliveryStream) run() {
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
			l.ackDue()
		case <-tick:
			l.silenceCheck()
		case <-idle.C:
			if l.idleOut() {
				return
			}
			idle.Reset(r.cfg.StreamIdle)
		}
	}
}

// flush sends what is queued, as far as the stream's window allows:
// false when nothing was taken.
func (l *deliveryStream) flush() bool {
	streaming := !l.r.cfg.ForceUnary
	limit := -1
	if streaming {
		if limit = deliveryWindow - len(l.unacked); limit <= 0 {
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

// stream sends items on the delivery stream's Deliver stream; the first of
// them to be the oldest unacked arms the ack deadline.
func (l *deliveryStream) stream(items []*item) {
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
func (l *deliveryStream) take(limit int) []*item {
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
func (l *deliveryStream) check(items []*item) []*item {
	r := l.r
	items = l.fresh(items)
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
			it.cost = protowire.SizeTag(3) + protowire.SizeBytes(it.msg.SizeVT()) + seqOverhead
		}
		ok = append(ok, it)
	}
	clear(items[len(ok):])
	return ok
}

// deliverCall is a delivery stream's gRPC stream on the sending side. Two
// goroutines own the gRPC stream: a writer (the open frame, items as the
// delivery stream pushes them, a heartbeat every interval) and a reader
// (acks to the delivery stream; every frame, heartbeats included, proves
// the receiver alive). The delivery stream never blocks on them: it pushes
// at most deliveryWindow unacked items, the capacity of frames and of acks.
// Both end when ctx does, which dropStream and Transport.Close cause, or
// when the stream fails; the delivery stream waits for them before it goes
// on.
type deliverCall struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	frames chan *pb.DeliverFrame   // pushed, not yet written
	acks   chan *pb.DeliverHandled // read, not yet applied
	done   chan struct{}           // closed once the stream ended; err says why
	err    error
	once   sync.Once
	closec chan struct{} // idle close: the writer half-closes
	last   atomic.Int64  // when a frame last arrived, UnixNano
	tick   *time.Ticker  // the delivery stream's silence check
	wg     sync.WaitGroup
	// The zone label of the delivery stream's node when the stream opened:
	// the zone test it passed (delivery stream.zoneCheck).
	zone  string
	zoned bool
}

var (
	errStreamDropped = errors.New("peer: deliver stream dropped")
	errOpenStalled   = errors.New("peer: opening a deliver stream took longer than the ack timeout ceiling")
)

// open opens the delivery stream's Deliver stream. It does not wait for the
// receiver: the open frame and the first items go out together, and a
// receiver that refuses the stream fails it at once.
func (l *deliveryStream) open() error {
	r := l.r
	addr, ok := r.cfg.Addr(l.key.node)
	if !ok {
		return ErrUnknownNode
	}
	cc, err := r.client.Conn(l.key.node, addr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(r.ctx)
	// A connection still being made holds the call up: bound that.
	t := time.AfterFunc(r.cfg.AckTimeoutCeiling, func() { cancel(errOpenStalled) })
	cs, err := pb.NewPeerServiceClient(cc).Deliver(ctx)
	if !t.Stop() && err == nil {
		err = errOpenStalled
	}
	if err != nil {
		cancel(err)
		return err
	}
	st := &deliverCall{
		ctx: ctx, cancel: cancel,
		frames: make(chan *pb.DeliverFrame, deliveryWindow),
		acks:   make(chan *pb.DeliverHandled, deliveryWindow),
		done:   make(chan struct{}),
		closec: make(chan struct{}),
		tick:   time.NewTicker(r.cfg.Heartbeat),
	}
	st.zone, st.zoned = r.zoneOf(l.key.node)
	st.last.Store(time.Now().UnixNano())
	open := &pb.DeliverFrame{Body: &pb.DeliverFrame_Open{Open: &pb.DeliverOpen{
		Session: r.session, Lane: &pb.PeerLane{Queue: l.key.queue}, HeartbeatIntervalNs: int64(r.cfg.Heartbeat),
	}}}
	st.wg.Add(2)
	go st.write(cs, open, r.cfg.Heartbeat)
	go st.read(cs)
	l.st, l.openFailing = st, false
	r.m.streamsOpen.WithLabelValues(kindDeliver).Inc()
	r.m.streamsOpened.WithLabelValues(kindDeliver).Inc()
	return nil
}

// push hands it to the writer; the window guarantees room.
func (st *deliverCall) push(it *item, now time.Time) {
	it.sentAt = now
	f := &pb.DeliverItem{Seq: it.seq}
	if it.fwd != nil {
		f.Body = &pb.DeliverItem_Forward{Forward: it.fwd}
	} else {
		f.Body = &pb.DeliverItem_Message{Message: it.msg}
	}
	st.frames <- &pb.DeliverFrame{Body: &pb.DeliverFrame_Item{Item: f}}
}

// fail records why the stream ended (the first reason) and ends it.
func (st *deliverCall) fail(err error) {
	st.once.Do(func() {
		st.err = err
		close(st.done)
	})
	st.cancel(err)
}

func (st *deliverCall) lastRecv() time.Time { return time.Unix(0, st.last.Load()) }

func (st *deliverCall) write(cs pb.PeerService_DeliverClient, open *pb.DeliverFrame, hb time.Duration) {
	defer st.wg.Done()
	if err := cs.Send(open); err != nil {
		st.fail(err)
		return
	}
	tick := time.NewTicker(hb)
	defer tick.Stop()
	heartbeat := &pb.DeliverFrame{Body: &pb.DeliverFrame_Heartbeat{Heartbeat: &pb.Heartbeat{}}}
	for {
		var err error
		select {
		case <-st.ctx.Done():
			return
		case <-st.closec:
			// Everything is acked: the receiver ends the stream once it
			// sees the half-close, and the reader sees that.
			if err := cs.CloseSend(); err != nil {
				st.fail(err)
			}
			return
		case f := <-st.frames:
			err = cs.Send(f)
		case <-tick.C:
			err = cs.Send(heartbeat)
		}
		if err != nil {
			st.fail(err)
			return
		}
	}
}

func (st *deliverCall) read(cs pb.PeerService_DeliverClient) {
	defer st.wg.Done()
	for {
		a, err := cs.Recv()
		if err != nil {
			st.fail(err)
			return
		}
		st.last.Store(time.Now().UnixNano())
		if h := a.GetHandled(); h != nil {
			select {
			case st.acks <- h:
			case <-st.ctx.Done():
				return
			}
		}
	}
}
