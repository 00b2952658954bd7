package peer

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/switchyard/switchyard/core"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// router is the outbound half of the transport: it sends the engine's
// jobs and messages to other nodes' servers, each message by one of three
// ordered paths (docs/cluster.md, "Peer streams"):
//
//   - the request leg's kinds (forward, deliver, cancel, unbind) and
//     synchronous Forwards by their queue's lane to the node
//     (lane_send.go), except a cancel for a job whose reply leg from that
//     node this node's server holds: it goes back on the leg;
//   - a binding's replies and release by its reply leg (leg_send.go), the
//     legs to one node multiplexed on its reply trunk (trunk_send.go);
//   - a binding's only message (an end or a release with no leg open) by
//     the node's Post FIFO (post_send.go).
//
// Every message carries the router's session and a number from one
// counter, so a receiver skips what it handled already whichever path
// resent it. Lane queues and the Post FIFO are unbounded: they hold
// control messages, and a node that stops answering either comes back or
// loses its lease; outputs ride reply legs, which Room bounds.
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

	// mu guards what follows and each lane's, leg's and outbox's queue. It
	// is taken under Engine.mu (send, room, expect) and takes server.mu
	// (cancelOnLeg); never the other way round.
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

// forward hands d to the dispatcher on node and returns its verdict: nil
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
	c := &forwardCall{r: r, ctx: ctx, node: node, d: d}
	p := DeliveryToPB(d)
	if reason, err := r.wireCheck(p, len(d.Queue)); err != nil {
		r.m.undeliverable.WithLabelValues(string(core.MsgForward), reason).Inc()
		return c.fail(fmt.Errorf("%w (%s): %w", ErrUndeliverable, reason, err))
	}
	timeout := r.ackTimeout(core.Message{Kind: core.MsgForward, JobID: d.JobID, Gen: d.Gen, Queue: d.Queue, Delivery: &d})
	for attempt := 0; ; attempt++ {
		res, err := c.attempt(p, timeout)
		switch {
		case err != nil:
			return err
		case res != nil:
			return ForwardError(res)
		}
		r.log.Debug("forward failed; retrying", "node", node, "job", d.JobID, "attempt", attempt+1, "err", c.last)
		if !r.sleep(ctx, attempt) {
			return c.ended(c.last)
		}
	}
}

// forwardCall is one forward's attempts.
type forwardCall struct {
	r    *router
	ctx  context.Context // the caller's, ended by Close too
	node string
	d    core.Delivery
	// last is the last attempt that failed on its own: when ctx ends
	// during an attempt, that attempt's error only repeats ctx's.
	last error
}

// attempt makes one attempt: the forward as a new item of its lane. It
// returns the verdict, or the error the forward ends with, or neither
// when a transient failure (in last) is worth another attempt.
func (c *forwardCall) attempt(p *pb.PeerDelivery, timeout time.Duration) (*pb.ForwardResponse, error) {
	r := c.r
	if r.ctx.Err() != nil {
		return nil, c.fail(ErrClosed)
	}
	if _, ok := r.cfg.Addr(c.node); !ok {
		return nil, c.fail(ErrUnknownNode)
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
	}
	switch {
	case res.err == nil:
		return res.res, nil
	case errors.Is(res.err, ErrUnknownNode):
		return nil, c.fail(res.err)
	case c.ctx.Err() != nil:
		return nil, c.ended(res.err)
	case !transient(res.err):
		return nil, c.fail(res.err)
	}
	c.last = res.err
	return nil, nil
}

// fail is the forward's error for err.
func (c *forwardCall) fail(err error) error {
	return fmt.Errorf("peer: forward job %s to %s: %w", c.d.JobID, c.node, err)
}

// ended is the forward's error once its context ended (or the router
// closed) during an attempt that failed with err, or after it.
func (c *forwardCall) ended(err error) error {
	if c.last != nil {
		err = c.last
	}
	if c.r.ctx.Err() != nil {
		return c.fail(fmt.Errorf("%w (last attempt: %w)", ErrClosed, err))
	}
	return c.fail(fmt.Errorf("%w (last attempt: %w)", context.Cause(c.ctx), err))
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

// send queues m for node and returns at once: it never blocks on the
// network, so the engine calls it with its lock held. Messages of one
// path to one node (a queue's lane, a job's reply leg, or the node's
// Post FIFO; see router) are sent in the order they were queued.
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

// kindOf is the metrics label of a queued message.
func kindOf(p *pb.PeerMessage) string { return string(kindFromPB[p.GetKind()]) }

// backoff is the wait before attempt+1, with jitter (see sleep).
func (r *router) backoff(attempt int) time.Duration {
	d := r.cfg.RetryMax
	if attempt < 30 {
		d = min(r.cfg.RetryMin<<attempt, r.cfg.RetryMax)
	}
	return d/2 + rand.N(d/2+1)
}
