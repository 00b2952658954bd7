package peer

import (
	"context"
	crand "crypto/rand"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/switchyard/switchyard/core"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// router is the outbound half of the transport, the state behind
// Transport.Forward and Transport.Send: it sends the engine's jobs and
// messages to other nodes' servers, each message by one of three ordered
// paths (docs/cluster.md, "Peer streams"):
//
//   - the request leg's kinds (forward, deliver, cancel, unbind) and
//     synchronous Forwards by their queue's delivery stream to the node
//     (delivery_send.go), except a cancel for a job whose response leg from
//     that node this node's server holds: it goes back on the leg;
//   - a binding's replies and release by its response leg (leg_send.go), the
//     legs to one node multiplexed on its reply stream (reply_send.go);
//   - a binding's only message (an end or a release with no leg open) by
//     the node's unicast queue (unicast_send.go).
//
// Every message carries the router's session and a number from one counter,
// so a receiver skips what it handled already whichever path resent it.
// Delivery stream queues and the unicast queue are unbounded: they hold
// control messages, and a node that stops answering either comes back or
// loses its lease; outputs ride response legs, which their jobs' output
// credit bounds (a grant is a control message too).
type router struct {
	cfg     Config
	client  *Client
	m       *Metrics
	log     *slog.Logger
	session string

	// srv is this node's server: a cancel or grant for a job whose reply
	// leg it holds goes back on that leg, and one that comes back on a
	// response leg here is handed to its receiver.
	srv *server

	ctx    context.Context // ends at close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// mu guards what follows and each delivery stream's, leg's and
	// unicastQueue's queue. It is taken under Engine.mu (Send, Expect) and
	// takes server.mu (cancelOnLeg, grantOnLeg); never the other way round.
	mu           sync.Mutex
	closed       bool
	seq          uint64
	unicastQueue map[string]*unicastQueue        // by node id, while its sender runs
	deliveries   map[deliveryKey]*deliveryStream // while their goroutine runs
	legs         map[legKey]*responseLeg         // response legs, while open
	jobLegs      map[string][]*responseLeg       // legs by job id (legCancelled)
	replyStreams map[string]*replyStream         // reply streams by node id, while open
	legSenders   map[string]*legSender           // by node id, while their goroutine runs
	senders      map[string]int                  // unicast queues, delivery streams and legs per node id
	maxUnicast   int                             // bytes of messages in one Post (or one frame)
}

// unicastOverhead is what a PostRequest, ForwardRequest or DeliverFrame
// adds around its messages (session, sequence numbers, delivery stream,
// field tags), with room to spare.
const unicastOverhead = 1 << 10

// newRouter returns a router; it starts goroutines only as messages are
// sent, and close stops them. cfg has its defaults.
func newRouter(cfg Config, client *Client) *router {
	ctx, cancel := context.WithCancel(context.Background())
	return &router{
		cfg: cfg, client: client, m: cfg.Metrics, log: cfg.Logger, session: crand.Text(),
		ctx: ctx, cancel: cancel,
		unicastQueue: map[string]*unicastQueue{}, deliveries: map[deliveryKey]*deliveryStream{}, senders: map[string]int{},
		legs: map[legKey]*responseLeg{}, jobLegs: map[string][]*responseLeg{},
		replyStreams: map[string]*replyStream{}, legSenders: map[string]*legSender{},
		maxUnicast: max(cfg.MaxMessageBytes-unicastOverhead, 1),
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
// cannot be carried by any transport: the reason label and the error. extra
// is what its frame adds beyond the message (a delivery stream's queue
// name).
func (r *router) wireCheck(p wireMessage, extra int) (string, error) {
	return r.wireCheckSize(p, p.SizeVT()+extra)
}

// wireMessage is a message of ours a peer connection carries (codec.go).
type wireMessage interface {
	proto.Message
	SizeVT() int
}

// wireCheckSize is wireCheck for a message whose frame is n bytes.
func (r *router) wireCheckSize(p proto.Message, n int) (string, error) {
	if n > r.maxUnicast {
		return ReasonTooLarge, fmt.Errorf("%d bytes, over the peer message limit of %d", n, r.maxUnicast)
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

// refLocked counts a sender (unicastQueue or delivery stream) for node;
// unrefLocked forgets it, and the node's queue gauge with the last one.
func (r *router) refLocked(node string) { r.senders[node]++ }

func (r *router) unrefLocked(node string) {
	if r.senders[node]--; r.senders[node] <= 0 {
		delete(r.senders, node)
		r.m.queue.DeleteLabelValues(node)
	}
}

// kindOf is the metrics label of a queued message.
func kindOf(p *pb.PeerMessage) string { return string(kindFromPB[p.GetKind()]) }

// awaitEnd waits, after a stream's half-close, for the receiver to end it
// (done): at most silentIntervals heartbeat intervals, and not past the
// router's close.
func (r *router) awaitEnd(done <-chan struct{}) {
	t := time.NewTimer(silentIntervals * r.cfg.Heartbeat)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	case <-r.ctx.Done():
	}
}
