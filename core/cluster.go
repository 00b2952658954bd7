package core

import (
	"context"
	"encoding/json"
	"time"
)

// Cluster is what an engine needs to route jobs across nodes. A nil Cluster
// is a single node: every role is local and nothing touches the network.
//
// The engine calls Send with Engine.mu held, so Send must queue and return;
// every other method is called without the lock.
//
// Who decides what (docs/cluster.md):
//   - the ingress node owns the job's outcome and allocates its
//     generations: every (re)forward carries a fresh one, so a message from
//     an earlier binding is stale everywhere;
//   - the dispatcher holds the only copy of a pending job and binds it to
//     one consumer, local first, then remote by least outstanding jobs;
//   - the consumer host relays its worker's answers straight to the ingress
//     (one hop), and hands a binding that ended without an outcome (reject,
//     lost worker) back to the ingress, which alone knows whether the job
//     produced output and so whether it may run again.
type Cluster interface {
	// Dispatcher returns the node that dispatches queue, electing this node
	// (a producer's claim) when the record is missing or void. It may write
	// to the catalog.
	Dispatcher(ctx context.Context, queue string) (string, error)
	// CachedDispatcher is Dispatcher from the watched view alone: false when
	// the view names no routable dispatcher.
	CachedDispatcher(queue string) (string, bool)
	// ClaimConsumer claims queue's dispatch for this node because it now
	// hosts a consumer of it.
	ClaimConsumer(ctx context.Context, queue string) error
	// ReleaseQueue deletes queue's dispatch record if it still names this
	// node: the queue was reaped, or is handed over to its consumers' node
	// (which claims it when it sees the record gone).
	ReleaseQueue(ctx context.Context, queue string) error
	// Routable reports whether jobs may be routed to node: it is Online in
	// the catalog and this node's peer tracker does not hold it spare.
	Routable(node string) bool
	// NodeZone is node's zone label as its catalog record says now ("" for
	// none, or for a node with no record). The zone test uses it rather
	// than the zone a consumer record was published with, so a node that
	// changes zones is judged by its new one.
	NodeZone(node string) string
	// Alive reports whether node has a record in the catalog view now.
	Alive(node string) bool
	// Gone reports whether node's record was seen deleted (and not written
	// again): its lease is gone, its death proven. A node without a record
	// that is not gone is only not seen yet (the view may apply its record a
	// moment after a message from it arrives), and is not dead.
	Gone(node string) bool
	// LeaseValid is false once this node must treat its own lease as lost
	// (by its own clock, before it can expire anywhere else). A consumer host
	// forwards no output after that.
	LeaseValid() bool
	// Forward hands a job to the dispatcher on node and waits for its
	// verdict: nil once the dispatcher holds it, or the *Error it refused
	// it with. Retrying a Forward with the same (job, generation) never
	// creates a second job.
	Forward(ctx context.Context, node string, d Delivery) error
	// Send queues m for node and returns at once. Messages to one node
	// arrive in the order they were sent.
	Send(node string, m Message)
	// Room is the reply leg's flow control: nil when the replies of job to
	// node may keep coming, or a channel closed once they may. The worker
	// session waits on it before it reads its worker's next message, so a
	// slow ingress slows the worker down and no output is dropped.
	Room(node, job string) <-chan struct{}
	// Expect tells the transport that this node is about to offer binding
	// (job, gen), whose ingress is node, to a worker: the reply leg may be
	// set up now, off the path of the first output. Must not block.
	Expect(node, job string, gen uint64, queue string, ttl time.Duration)
}

// MessageKind names a peer message. The kinds are the label values of
// switchyard_peer_messages_total{kind}.
type MessageKind string

// Message kinds, by the leg they travel.
const (
	// MsgForward ingress → dispatcher: a job that goes back to its queue
	// (reject, lost worker) travelling asynchronously. A first forward is
	// the synchronous Cluster.Forward.
	MsgForward MessageKind = "forward"
	// MsgDeliver dispatcher → consumer host: a job bound to one consumer.
	MsgDeliver MessageKind = "deliver"
	// MsgReply consumer host → ingress: accepted, one output, or the end.
	MsgReply MessageKind = "reply"
	// MsgRelease consumer host or dispatcher → ingress: a binding ended
	// without an outcome (rejected, worker lost, could not be offered).
	MsgRelease MessageKind = "release"
	// MsgUnbind consumer host → dispatcher: a remote consumer's credit is
	// free again.
	MsgUnbind MessageKind = "unbind"
	// MsgCancel ingress → dispatcher or consumer host, and dispatcher →
	// consumer host: stop the job.
	MsgCancel MessageKind = "cancel"
)

// Message is one peer message. Every message names the job and the
// generation it belongs to; a receiver refuses a stale generation.
type Message struct {
	Kind  MessageKind
	JobID string
	Gen   uint64
	Queue string

	// Delivery is the job, for forward and deliver.
	Delivery *Delivery
	// Consumer is the consumer a deliver is for, or the one a reply,
	// release or unbind comes from; WorkerName is its worker's name.
	Consumer   string
	WorkerName string

	// Reply: Accepted alone, or one Output, or End.
	Accepted bool
	Output   json.RawMessage
	End      *End

	// Release: Rejected is true for a worker's refusal (the consumer is not
	// offered the job again); otherwise the worker was lost.
	Rejected bool
	Reason   string

	// Cancel: the code the job ended with.
	Code Code

	// TTL is, on a reply, what was left of the job's TTL when the host sent
	// it: a transport bounds the job's reply stream by it, since a reply leg
	// is closed by the job's end or its TTL, never by an idle timer.
	TTL time.Duration
}

// End is a job's end as its worker reported it: Code "" is success.
type End struct {
	Code   Code
	Detail string
	Result json.RawMessage
}
