package peer

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/switchyard/switchyard/core"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// RouterConfig is what a Router needs from its node.
type RouterConfig struct {
	// Client is the node's connection pool (shared with the Tracker).
	Client *Client
	// Addr resolves a node id to its peer address; false when the catalog
	// view has no record of the node: its lease is gone, it is dead.
	Addr func(node string) (string, bool)
	// MaxMessageBytes bounds one call, as the peers' servers do (node
	// config); default: the Client's, else 4 MiB.
	MaxMessageBytes int
	// AttemptTimeout bounds one Forward or Post attempt (default 10s), so a
	// peer that stopped answering without closing its connection is tried
	// again rather than waited on.
	AttemptTimeout time.Duration
	// RetryMin and RetryMax bound the backoff between attempts (default
	// 50ms and 2s): it doubles from RetryMin up to RetryMax, with jitter.
	RetryMin, RetryMax time.Duration
	// IdleTimeout is how long a node's sender goroutine waits for a new
	// message before it exits (default 30s); the next Send to that node
	// starts another.
	IdleTimeout time.Duration
	Metrics     *Metrics
	Logger      *slog.Logger
}

// ErrUnknownNode is wrapped by a Forward to a node the catalog view has no
// record of.
var ErrUnknownNode = errors.New("node not in the catalog")

// Router is the transport half of core.Cluster: it sends jobs and routing
// messages to other nodes' peer servers. It is safe for concurrent use.
//
// Send queues each message on its destination node's FIFO and returns at
// once. One goroutine per node with something queued sends everything
// queued so far as one Post (up to MaxMessageBytes), and keeps at most one
// Post in flight per node: a failed batch is resent unchanged, with
// backoff, before anything queued after it, so messages to one node arrive
// in the order they were sent. Each batch carries this Router's session and
// sequence numbers, so a resend whose first attempt was handled after all
// is not handled twice.
//
// A node's FIFO is unbounded: it holds control messages and outputs, which
// the engine has already bounded per job, and a node that stops answering
// either comes back or loses its lease, and its queue goes with it. Its
// length is switchyard_peer_queue_messages{node}.
//
// Forward and Send are not ordered with each other.
type Router struct {
	cfg     RouterConfig
	m       *Metrics
	log     *slog.Logger
	session string

	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	seq     uint64
	outbox  map[string]*outbox // by node id, while its sender runs
	maxPost int                // bytes of messages in one Post
}

// outbox is one node's FIFO and its sender's wake-up.
type outbox struct {
	node string
	msgs []*pb.PeerMessage
	wake chan struct{} // capacity 1: "something was queued"
}

// postOverhead is what a PostRequest adds around its messages (session,
// first_seq, field tags), with room to spare.
const postOverhead = 1 << 10

// NewRouter returns a router; it starts goroutines only as messages are
// sent. Close stops them.
func NewRouter(cfg RouterConfig) (*Router, error) {
	if cfg.Client == nil || cfg.Addr == nil {
		return nil, errors.New("peer router: Client and Addr are required")
	}
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = cfg.Client.cfg.MaxMessageBytes
	}
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = 4 << 20
	}
	if cfg.AttemptTimeout <= 0 {
		cfg.AttemptTimeout = 10 * time.Second
	}
	if cfg.RetryMin <= 0 {
		cfg.RetryMin = 50 * time.Millisecond
	}
	if cfg.RetryMax < cfg.RetryMin {
		cfg.RetryMax = max(2*time.Second, cfg.RetryMin)
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 30 * time.Second
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Router{
		cfg: cfg, m: cfg.Metrics, log: cfg.Logger, session: crand.Text(),
		ctx: ctx, cancel: cancel,
		outbox: map[string]*outbox{}, maxPost: max(cfg.MaxMessageBytes-postOverhead, 1),
	}, nil
}

// Close stops every sender and waits for them. Messages still queued are
// dropped and counted; Forward calls in flight fail; later Sends are
// dropped and counted. It does not close the Client.
func (r *Router) Close() error {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.cancel()
	r.wg.Wait()
	return nil
}

// Forward hands d to the dispatcher on node and returns its verdict: nil
// once the dispatcher holds the job, the *core.Error it refused it with,
// or an error when no verdict could be had: node is not in the catalog
// (wraps ErrUnknownNode), it failed in a way retrying cannot cure, or ctx
// ended (wraps ctx.Err()) while it kept failing transiently (Unavailable, or
// an attempt that timed out). Retrying is safe: the dispatcher takes a
// (job id, generation) once.
func (r *Router) Forward(ctx context.Context, node string, d core.Delivery) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(r.ctx, cancel)()
	req := &pb.ForwardRequest{Delivery: DeliveryToPB(d)}
	fail := func(err error) error {
		return fmt.Errorf("peer: forward job %s to %s: %w", d.JobID, node, err)
	}
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
		addr, ok := r.cfg.Addr(node)
		if !ok {
			return fail(ErrUnknownNode)
		}
		res, err := r.forwardOnce(ctx, addr, req)
		if err == nil {
			r.m.messages.WithLabelValues(string(core.MsgForward)).Inc()
			return ForwardError(res)
		}
		if r.ctx.Err() == nil {
			r.m.sendFailures.Inc()
		}
		if ctx.Err() != nil {
			return ended(err)
		}
		if !transient(err) {
			return fail(err)
		}
		last = err
		r.log.Debug("forward failed; retrying", "node", node, "addr", addr, "job", d.JobID, "attempt", attempt+1, "err", err)
		if !r.sleep(ctx, attempt) {
			return ended(err)
		}
	}
}

func (r *Router) forwardOnce(ctx context.Context, addr string, req *pb.ForwardRequest) (*pb.ForwardResponse, error) {
	cc, err := r.cfg.Client.Conn(addr)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.AttemptTimeout)
	defer cancel()
	return pb.NewPeerServiceClient(cc).Forward(ctx, req)
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
// node's credentials, does not know the call (an older version), or finds
// the batch malformed or too large.
func permanent(err error) bool {
	if errors.Is(err, ErrClosed) {
		return true
	}
	switch status.Code(err) {
	case codes.Unauthenticated, codes.PermissionDenied, codes.Unimplemented, codes.InvalidArgument, codes.ResourceExhausted:
		return true
	}
	return false
}

// sleep waits out the backoff before attempt+1: false when ctx ended first.
func (r *Router) sleep(ctx context.Context, attempt int) bool {
	d := r.cfg.RetryMax
	if attempt < 30 {
		d = min(r.cfg.RetryMin<<attempt, r.cfg.RetryMax)
	}
	d = d/2 + rand.N(d/2+1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Send queues m for node and returns at once: it never blocks on the
// network, so the engine calls it with its lock held. Messages to one node
// are sent in the order they were queued.
func (r *Router) Send(node string, m core.Message) {
	p, err := MessageToPB(m)
	if err != nil {
		r.m.dropped.WithLabelValues(string(m.Kind)).Inc()
		r.log.Error("dropped a routing message that has no wire form", "node", node, "job", m.JobID, "err", err)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		r.m.dropped.WithLabelValues(string(m.Kind)).Inc()
		return
	}
	ob := r.outbox[node]
	if ob == nil {
		ob = &outbox{node: node, wake: make(chan struct{}, 1)}
		r.outbox[node] = ob
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

// run is one node's sender: it posts what is queued, batch by batch, and
// exits when the queue stayed empty for IdleTimeout or at Close.
func (r *Router) run(ob *outbox) {
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
		req := r.takeLocked(ob)
		r.mu.Unlock()
		if req != nil {
			r.post(ob, req)
		}
	}
}

// takeLocked removes the next batch from ob: every queued message, up to
// maxPost bytes, numbered from the router's counter. A message that alone
// exceeds maxPost can never be sent: it is dropped. Nil when only such
// messages were queued.
func (r *Router) takeLocked(ob *outbox) *pb.PostRequest {
	var size, n int
	for n < len(ob.msgs) {
		p := ob.msgs[n]
		cost := protowire.SizeTag(3) + protowire.SizeBytes(proto.Size(p))
		if cost > r.maxPost {
			if n > 0 {
				break // send what precedes it first, in order
			}
			r.log.Error("dropped a routing message larger than the peer message limit", "node", ob.node, "kind", kindOf(p), "job", p.GetJobId(), "bytes", cost, "limit", r.maxPost)
			r.dropLocked(ob, ob.msgs[:1])
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
		return nil
	}
	req := &pb.PostRequest{Session: r.session, FirstSeq: r.seq, Messages: make([]*pb.PeerMessage, n)}
	copy(req.Messages, ob.msgs[:n])
	clear(ob.msgs[:n])
	ob.msgs = ob.msgs[n:]
	if len(ob.msgs) == 0 {
		ob.msgs = nil // let the backing array go
	}
	r.seq += uint64(n)
	return req
}

// post sends one batch to ob's node, resending it unchanged until it is
// handed over, the node leaves the catalog, the peer refuses it for good,
// or the router closes. The batch counts in the queue gauge until then.
func (r *Router) post(ob *outbox, req *pb.PostRequest) {
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

func (r *Router) postOnce(addr string, req *pb.PostRequest) error {
	cc, err := r.cfg.Client.Conn(addr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(r.ctx, r.cfg.AttemptTimeout)
	defer cancel()
	_, err = pb.NewPeerServiceClient(cc).Post(ctx, req)
	return err
}

// dropLocked counts msgs, no longer queued for ob's node, as dropped.
func (r *Router) dropLocked(ob *outbox, msgs []*pb.PeerMessage) {
	for _, p := range msgs {
		r.m.dropped.WithLabelValues(kindOf(p)).Inc()
	}
	if len(msgs) > 0 {
		r.m.queue.WithLabelValues(ob.node).Sub(float64(len(msgs)))
	}
}

// removeLocked forgets ob, whose queue is empty and whose sender exits.
func (r *Router) removeLocked(ob *outbox) {
	delete(r.outbox, ob.node)
	r.m.queue.DeleteLabelValues(ob.node)
}
