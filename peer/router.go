package peer

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/switchyard/switchyard/core"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// ErrUnknownNode is wrapped by a Forward to a node the catalog view has no
// record of.
var ErrUnknownNode = errors.New("node not in the catalog")

// Router is the transport half of core.Cluster: it sends jobs and routing
// messages to other nodes' peer servers. It is safe for concurrent use.
//
// Messages go by one of three paths, each ordered:
//
//   - Lanes carry the request leg, the kinds that travel towards a job's
//     worker or its dispatcher (forward, deliver, cancel, unbind) and the
//     synchronous Forward: one lane per (node, queue), each with its own
//     goroutine and, while it has traffic, its own Deliver stream (see
//     lane). Every message of a job names its queue, so a job's messages
//     to one node keep their order, and a slow queue never holds up
//     another. A cancel for a job whose reply leg from that node is open
//     at RouterConfig.Server goes back on the leg instead.
//   - Reply legs carry the response leg (reply and release, towards the
//     job's ingress): one leg per binding (node, job, generation), opened
//     by Expect or its first reply, which carries the rest in order, so a
//     release never overtakes the outputs before it (the ingress decides
//     from them whether the job may run again), and which flow-controls
//     the worker through Room (see replyLeg). The legs to one node share
//     one Respond stream, the node's reply trunk (see replyTrunk).
//   - A release or end with no reply leg open (a job's only reply, or a
//     release before any reply) goes by one FIFO per node, sent as batched
//     Posts with at most one in flight per node: a failed batch is resent
//     unchanged, with backoff, before anything queued after it. Nothing of
//     its binding was sent before it, so it overtakes nothing.
//
// Every message carries this Router's session and a sequence number from
// one counter, so a receiver skips one it already handled when it comes
// again (a resend whose first attempt was handled after all, or a message
// resent after its stream was dropped).
//
// Lane queues and the Post FIFO are unbounded: they hold control messages,
// and a node that stops answering either comes back or loses its lease,
// and its queues go with it. Outputs ride reply legs, which are bounded
// (Room). The queues' length is switchyard_peer_queue_messages{node}.
//
// A Forward is ordered with the messages of its queue's lane; messages of
// different paths are not ordered with each other.
type router struct {
	cfg     Config
	client  *Client
	m       *Metrics
	log     *slog.Logger
	session string

	// srv is this node's server: a cancel for a job whose reply leg it
	// holds goes back on that leg, and one that comes back on a reply leg
	// here is handed to its receiver.
	srv *server

	ctx    context.Context // ends at close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	closed    bool
	seq       uint64
	outbox    map[string]*outbox     // by node id, while its sender runs
	lanes     map[laneKey]*lane      // while their goroutine runs
	legs      map[legKey]*replyLeg   // reply legs, while open
	jobLegs   map[string][]*replyLeg // legs by job id (Room, legCancelled)
	trunks    map[string]*replyTrunk // reply trunks by node id, while open
	trunkOpen map[string]*sync.Mutex // held while a node's trunk is being opened
	senders   map[string]int         // outboxes, lanes and legs per node id
	maxPost   int                    // bytes of messages in one Post (or one frame)
}

// outbox is one node's FIFO and its sender's wake-up.
type outbox struct {
	node string
	msgs []*pb.PeerMessage
	wake chan struct{} // capacity 1: "something was queued"
}

// postOverhead is what a PostRequest, ForwardRequest or DeliverFrame adds
// around its messages (session, sequence numbers, lane, field tags), with
// room to spare.
const postOverhead = 1 << 10

// newRouter returns a router; it starts goroutines only as messages are
// sent, and close stops them. cfg has its defaults.
func newRouter(cfg Config, client *Client) *router {
	ctx, cancel := context.WithCancel(context.Background())
	return &router{
		cfg: cfg, client: client, m: cfg.Metrics, log: cfg.Logger, session: crand.Text(),
		ctx: ctx, cancel: cancel,
		outbox: map[string]*outbox{}, lanes: map[laneKey]*lane{}, senders: map[string]int{},
		legs: map[legKey]*replyLeg{}, jobLegs: map[string][]*replyLeg{},
		trunks: map[string]*replyTrunk{}, trunkOpen: map[string]*sync.Mutex{},
		maxPost: max(cfg.MaxMessageBytes-postOverhead, 1),
	}
}

// close stops every sender and stream and waits for them. Messages still
// queued or unacked are dropped and counted; Forward calls in flight fail;
// later Sends are dropped and counted. It does not close the Client.
func (r *router) close() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.cancel()
	r.wg.Wait()
}

// Forward hands d to the dispatcher on node and returns its verdict: nil
// once the dispatcher holds the job, the *core.Error it refused it with,
// or an error when no verdict could be had: node is not in the catalog
// (wraps ErrUnknownNode), the job cannot be carried at all (wraps
// ErrUndeliverable), it failed in a way retrying cannot cure, or ctx ended
// (wraps ctx.Err()) while it kept failing transiently (Unavailable, or an
// attempt that timed out). Retrying is safe: the dispatcher takes a (job
// id, generation) once.
//
// The forward is an item of its queue's lane: sent on the lane's stream
// and answered by its ack, or by a unary Forward call when the lane has no
// stream or dropped it (the receiver answers a resent item with the
// verdict it gave first). An attempt that got no verdict is made again as
// a new item, after a backoff.
func (r *router) forward(ctx context.Context, node string, d core.Delivery) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(r.ctx, cancel)()
	fail := func(err error) error {
		return fmt.Errorf("peer: forward job %s to %s: %w", d.JobID, node, err)
	}
	p := DeliveryToPB(d)
	if reason, err := r.wireCheck(p, len(d.Queue)); err != nil {
		r.m.undeliverable.WithLabelValues(string(core.MsgForward), reason).Inc()
		return fail(fmt.Errorf("%w (%s): %w", ErrUndeliverable, reason, err))
	}
	timeout := r.ackTimeout(core.Message{Kind: core.MsgForward, JobID: d.JobID, Gen: d.Gen, Queue: d.Queue, Delivery: &d})
	// last is the last attempt that failed on its own: when ctx ends
	// during an attempt, that attempt's error only repeats ctx's.
	var last error
	ended := func(err error) error {
		if last != nil {
			err = last
		}
		if r.ctx.Err() != nil {
			return fail(fmt.Errorf("%w (last attempt: %w)", ErrClosed, err))
		}
		return fail(fmt.Errorf("%w (last attempt: %w)", context.Cause(ctx), err))
	}
	for attempt := 0; ; attempt++ {
		if r.ctx.Err() != nil {
			return fail(ErrClosed)
		}
		if _, ok := r.cfg.Addr(node); !ok {
			return fail(ErrUnknownNode)
		}
		it := &item{kind: string(core.MsgForward), fwd: p, timeout: timeout, ctx: ctx, done: make(chan forwardResult, 1)}
		if !r.enqueue(node, d.Queue, it) {
			return fail(ErrClosed)
		}
		var res forwardResult
		select {
		case res = <-it.done:
		case <-ctx.Done():
			return ended(ctx.Err())
		}
		if res.err == nil {
			return ForwardError(res.res)
		}
		if errors.Is(res.err, ErrUnknownNode) {
			return fail(res.err)
		}
		if ctx.Err() != nil {
			return ended(res.err)
		}
		if !transient(res.err) {
			return fail(res.err)
		}
		last = res.err
		r.log.Debug("forward failed; retrying", "node", node, "job", d.JobID, "attempt", attempt+1, "err", res.err)
		if !r.sleep(ctx, attempt) {
			return ended(res.err)
		}
	}
}

// transient reports whether a failed attempt may succeed if made again:
// the peer was unreachable or not ready, the attempt timed out, or its
// connection was closed under it (the pool drops connections to addresses
// that left the view). The caller checks its own context first.
func transient(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Aborted:
		return true
	}
	return false
}

// permanent reports whether a failed Post can never succeed as it is, so
// resending it would only stall the queue behind it: the peer refuses this
// node's credentials or its protocol version, does not know the call, or
// finds the batch malformed or too large.
func permanent(err error) bool {
	if errors.Is(err, ErrClosed) {
		return true
	}
	switch status.Code(err) {
	case codes.Unauthenticated, codes.FailedPrecondition, codes.PermissionDenied, codes.Unimplemented, codes.InvalidArgument, codes.ResourceExhausted:
		return true
	}
	return false
}

// sleep waits out the backoff before attempt+1: false when ctx ended first.
func (r *router) sleep(ctx context.Context, attempt int) bool {
	t := time.NewTimer(r.backoff(attempt))
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Send queues m for node and returns at once: it never blocks on the
// network, so the engine calls it with its lock held. Messages of one
// path to one node (a queue's lane, a job's reply leg, or the node's
// Post FIFO; see Router) are sent in the order they were queued.
func (r *router) send(node string, m core.Message) {
	p, err := MessageToPB(m)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		r.m.dropped.WithLabelValues(string(m.Kind)).Inc()
		return
	}
	if err == nil && !laned(m.Kind) {
		r.replyLocked(node, m, p)
		return
	}
	if err == nil && m.Kind == core.MsgCancel && r.srv.cancelOnLeg(node, m.JobID, m.Gen, p) {
		// The job's reply leg from node is open here: the cancel goes back
		// on it, and is counted when written.
		return
	}
	it := &item{kind: string(m.Kind), msg: p, timeout: r.ackTimeout(m)}
	if err != nil {
		// No wire form: reported by the lane's goroutine, off the
		// engine's lock.
		c := m
		it.bad, it.badErr = &c, err
	}
	r.enqueueLocked(node, m.Queue, it)
}

// laned reports whether messages of kind go by their queue's lane rather
// than the response leg.
func laned(k core.MessageKind) bool { return k != core.MsgReply && k != core.MsgRelease }

// ackTimeout is Config.AckTimeout for m, clamped.
func (r *router) ackTimeout(m core.Message) time.Duration {
	c := r.cfg.AckTimeoutCeiling
	if r.cfg.AckTimeout == nil {
		return c
	}
	d := r.cfg.AckTimeout(m)
	if d <= 0 || d > c {
		return c
	}
	return d
}

// wireCheck reports why a message of size bytes-to-be, or delivery p,
// cannot be carried by any transport: the reason label and the error.
// extra is what its frame adds beyond the message (a lane's queue name).
func (r *router) wireCheck(p proto.Message, extra int) (string, error) {
	return r.wireCheckSize(p, proto.Size(p)+extra)
}

// wireCheckSize is wireCheck for a message whose frame is n bytes.
func (r *router) wireCheckSize(p proto.Message, n int) (string, error) {
	if n > r.maxPost {
		return ReasonTooLarge, fmt.Errorf("%d bytes, over the peer message limit of %d", n, r.maxPost)
	}
	if err := wireValid(p); err != nil {
		return ReasonEncoding, err
	}
	return "", nil
}

// undeliverable reports a message Send queued that no transport can carry.
// Called without r.mu.
func (r *router) undeliverable(node string, p *pb.PeerMessage, orig *core.Message, reason string, err error) {
	kind := kindOf(p)
	if orig != nil {
		kind = string(orig.Kind)
	}
	r.m.undeliverable.WithLabelValues(kind, reason).Inc()
	r.m.queue.WithLabelValues(node).Dec()
	var m core.Message
	switch {
	case orig != nil:
		m = *orig
	default:
		var cerr error
		if m, cerr = MessageFromPB(p); cerr != nil {
			m = core.Message{Kind: core.MessageKind(kind), JobID: p.GetJobId(), Gen: p.GetGeneration(), Queue: p.GetQueue()}
		}
	}
	if reason == ReasonZone {
		r.log.Info("a zone-scoped delivery is not sent to a node outside its zone; the engine routes it again", "node", node, "job", m.JobID, "err", err)
	} else {
		r.log.Error("a routing message cannot be sent to any peer; not retried", "node", node, "kind", kind, "job", m.JobID, "reason", reason, "err", err)
	}
	if rcv, err := r.srv.receiver(); err == nil {
		rcv.Undeliverable(node, m, reason)
	}
}

// zoneOf is node's zone label in the catalog view.
func (r *router) zoneOf(node string) (string, bool) {
	if r.cfg.Zone == nil {
		return "", false
	}
	z, ok := r.cfg.Zone(node)
	return z, ok && z != ""
}

// ZonesChanged applies the zone test again to every open lane stream (see
// lane.zoneCheck). The node calls it on every change of its catalog view;
// it never blocks.
func (r *router) zonesChanged() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range r.lanes {
		select {
		case l.rezone <- struct{}{}:
		default:
		}
	}
}

// refLocked counts a sender (outbox or lane) for node; unrefLocked forgets
// it, and the node's queue gauge with the last one.
func (r *router) refLocked(node string) { r.senders[node]++ }

func (r *router) unrefLocked(node string) {
	if r.senders[node]--; r.senders[node] <= 0 {
		delete(r.senders, node)
		r.m.queue.DeleteLabelValues(node)
	}
}

// postLocked queues p on node's Post FIFO.
func (r *router) postLocked(node string, p *pb.PeerMessage) {
	ob := r.outbox[node]
	if ob == nil {
		ob = &outbox{node: node, wake: make(chan struct{}, 1)}
		r.outbox[node] = ob
		r.refLocked(node)
		r.wg.Add(1)
		go r.run(ob)
	}
	ob.msgs = append(ob.msgs, p)
	r.m.queue.WithLabelValues(node).Inc()
	select {
	case ob.wake <- struct{}{}:
	default:
	}
}

// kindOf is the metrics label of a queued message.
func kindOf(p *pb.PeerMessage) string { return string(kindFromPB[p.GetKind()]) }

// run is one node's Post FIFO sender: it posts what is queued, batch by
// batch, and exits when the queue stayed empty for IdleTimeout or at
// Close.
func (r *router) run(ob *outbox) {
	defer r.wg.Done()
	idle := time.NewTimer(r.cfg.IdleTimeout)
	defer idle.Stop()
	for {
		r.mu.Lock()
		if r.closed {
			r.dropLocked(ob, ob.msgs)
			ob.msgs = nil
			r.removeLocked(ob)
			r.mu.Unlock()
			return
		}
		if len(ob.msgs) == 0 {
			r.mu.Unlock()
			idle.Reset(r.cfg.IdleTimeout)
			select {
			case <-ob.wake:
			case <-r.ctx.Done():
			case <-idle.C:
				r.mu.Lock()
				if len(ob.msgs) == 0 {
					r.removeLocked(ob)
					r.mu.Unlock()
					return
				}
				r.mu.Unlock()
			}
			continue
		}
		req, bad := r.takeLocked(ob)
		r.mu.Unlock()
		for _, u := range bad {
			r.undeliverable(ob.node, u.p, nil, u.reason, u.err)
		}
		if req != nil {
			r.post(ob, req)
		}
	}
}

// rejected is a queued message no transport can carry.
type rejected struct {
	p      *pb.PeerMessage
	reason string
	err    error
}

// takeLocked removes the next batch from ob: every queued message, up to
// maxPost bytes, numbered from the router's counter. A message that alone
// exceeds maxPost, or has no valid wire form, can never be sent: it is
// taken out and returned in bad, to be reported. Nil when only such
// messages were queued.
func (r *router) takeLocked(ob *outbox) (req *pb.PostRequest, bad []rejected) {
	var size, n int
	for n < len(ob.msgs) {
		p := ob.msgs[n]
		cost := protowire.SizeTag(3) + protowire.SizeBytes(proto.Size(p))
		reason, err := "", error(nil)
		if cost > r.maxPost {
			reason, err = ReasonTooLarge, fmt.Errorf("%d bytes, over the peer message limit of %d", cost, r.maxPost)
		} else if err = wireValid(p); err != nil {
			reason = ReasonEncoding
		}
		if err != nil {
			if n > 0 {
				break // send what precedes it first, in order
			}
			bad = append(bad, rejected{p, reason, err})
			ob.msgs[0] = nil
			ob.msgs = ob.msgs[1:]
			continue
		}
		if size+cost > r.maxPost {
			break
		}
		size += cost
		n++
	}
	if n == 0 {
		return nil, bad
	}
	req = &pb.PostRequest{Session: r.session, FirstSeq: r.seq, Messages: make([]*pb.PeerMessage, n)}
	copy(req.Messages, ob.msgs[:n])
	clear(ob.msgs[:n])
	ob.msgs = ob.msgs[n:]
	if len(ob.msgs) == 0 {
		ob.msgs = nil // let the backing array go
	}
	r.seq += uint64(n)
	return req, bad
}

// post sends one batch to ob's node, resending it unchanged until it is
// handed over, the node leaves the catalog, the peer refuses it for good,
// or the router closes. The batch counts in the queue gauge until then.
func (r *router) post(ob *outbox, req *pb.PostRequest) {
	for attempt := 0; ; attempt++ {
		addr, ok := r.cfg.Addr(ob.node)
		if !ok {
			r.mu.Lock()
			n := len(req.Messages) + len(ob.msgs)
			r.dropLocked(ob, req.Messages)
			r.dropLocked(ob, ob.msgs)
			ob.msgs = nil
			r.mu.Unlock()
			r.log.Warn("dropped routing messages to a node that left the catalog", "node", ob.node, "messages", n)
			return
		}
		err := r.postOnce(addr, req)
		if err == nil {
			r.mu.Lock()
			for _, p := range req.Messages {
				r.m.messages.WithLabelValues(kindOf(p)).Inc()
			}
			r.m.queue.WithLabelValues(ob.node).Sub(float64(len(req.Messages)))
			r.mu.Unlock()
			return
		}
		if r.ctx.Err() == nil {
			r.m.sendFailures.Inc()
		}
		if r.ctx.Err() != nil || permanent(err) {
			r.mu.Lock()
			r.dropLocked(ob, req.Messages)
			r.mu.Unlock()
			if r.ctx.Err() == nil {
				r.log.Error("dropped routing messages the peer refused", "node", ob.node, "addr", addr, "messages", len(req.Messages), "err", err)
			}
			return
		}
		lvl := slog.LevelDebug
		if attempt == 0 {
			lvl = slog.LevelWarn
		}
		r.log.Log(r.ctx, lvl, "post to peer failed; resending", "node", ob.node, "addr", addr, "messages", len(req.Messages), "attempt", attempt+1, "err", err)
		if !r.sleep(r.ctx, attempt) {
			r.mu.Lock()
			r.dropLocked(ob, req.Messages)
			r.mu.Unlock()
			return
		}
	}
}

func (r *router) postOnce(addr string, req *pb.PostRequest) error {
	cc, err := r.client.Conn(addr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(r.ctx, r.cfg.AttemptTimeout)
	defer cancel()
	_, err = pb.NewPeerServiceClient(cc).Post(ctx, req)
	return err
}

// dropLocked counts msgs, no longer queued for ob's node, as dropped.
func (r *router) dropLocked(ob *outbox, msgs []*pb.PeerMessage) {
	for _, p := range msgs {
		r.m.dropped.WithLabelValues(kindOf(p)).Inc()
	}
	if len(msgs) > 0 {
		r.m.queue.WithLabelValues(ob.node).Sub(float64(len(msgs)))
	}
}

// removeLocked forgets ob, whose queue is empty and whose sender exits.
func (r *router) removeLocked(ob *outbox) {
	delete(r.outbox, ob.node)
	r.unrefLocked(ob.node)
}
