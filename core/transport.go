package core

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

// This file is the seam between the engine and the node-to-node
// transport: Transport is what the engine calls to reach other nodes,
// Receiver what the transport calls with what other nodes sent. Package
// peer implements Transport over gRPC; *Engine implements Receiver
// (receive.go). Both carry Messages. roles.go is the engine's side of it.

// Transport is the message half of a cluster: it carries the engine's
// messages to other nodes. A Cluster (the decisions) and a Transport come
// together; both are nil on a single node.
//
// Locking: Send and Expect are called with Engine.mu held, so they queue
// and return: they never block on the network, and never call the engine
// (a Receiver method) from within. Forward is called without it.
type Transport interface {
	// Forward hands a job to the dispatcher on node and waits for its
	// verdict: nil once the dispatcher holds it, or the *Error it refused
	// it with. Retrying a Forward with the same (job, generation) never
	// creates a second job. Once ctx ends without a verdict, it returns
	// soon, with an error that wraps ctx's (Submit waits on its caller's
	// goroutine for a verdict only so long).
	//
	// A Forward that wraps ErrNodeReplaced was meant for an incarnation
	// of node that is dead now (replaced by a new one, or come back from
	// a fence): that incarnation took nothing of it since, and the caller
	// treats it as the dispatcher's node gone.
	Forward(ctx context.Context, node string, d Delivery) error
	// Send queues m for node and returns at once. A job's messages to one
	// node arrive in the order they were sent on each of its two legs: the
	// request leg (forward, deliver, cancel, unbind; ordered per queue) and
	// a binding's replies and release. The legs are not ordered with each
	// other. A message no transport can carry is not sent: the transport
	// tells Receiver.Undeliverable, later, from a goroutine of its own.
	// Nothing here bounds a response leg: its job's output credit does
	// (credit.go), and a grant travels back to the host as a message too.
	Send(node string, m Message)
	// Expect tells the transport that this node is about to offer binding
	// (job, gen), whose ingress is node, to a worker: the response leg may be
	// set up now, off the path of the first output.
	Expect(node, job string, gen uint64, queue string, ttl time.Duration)
}

// Receiver is what the transport hands what other nodes send: *Engine
// implements it. from (or host) is the authenticated id of the sending
// node.
//
// Locking: every method takes Engine.mu. The transport calls them from its
// own goroutines, never from within a Transport method, and holding none
// of the locks its Transport methods take. They never block on anything
// but Engine.mu: what they send in turn goes through Transport.Send.
type Receiver interface {
	// HandleForward takes a job as its queue's dispatcher: nil once it
	// holds it, a *Error to refuse it (an answer the caller passes on),
	// any other error when it cannot decide (the caller may retry). It is
	// called again with the same (job id, generation) when a caller lost
	// the answer, and creates no second job.
	HandleForward(from string, d Delivery) error
	// HandleMessage acts on one message. Messages from one node arrive one
	// at a time, in the order that node sent them on one path: a queue's
	// delivery stream, a binding's response leg, or the node's unicast
	// queue of lone messages. m.Output is valid during the call only (a
	// transport may decode it into a buffer it reuses for the next
	// message): a receiver that keeps it keeps a copy.
	HandleMessage(from string, m Message)
	// Undeliverable is told about a message Send queued that no transport
	// can carry (too large, or with no valid wire form) or that must not
	// go to node (ReasonZone). It is never sent nor retried.
	Undeliverable(node string, m Message, reason string)
	// ResponseLegOpened is told that host opened the response leg of
	// binding (id, gen): the job runs there. Hosts open it when they offer the job
	// to their worker, before its first output.
	ResponseLegOpened(host, id string, gen uint64)
	// ResponseLegSilent is told that nothing, not even a heartbeat, arrived
	// on the response leg of binding (id, gen) from host for several
	// heartbeat intervals while its connection stayed open (a host paused,
	// partitioned or swapping). The leg's stream is ended first.
	ResponseLegSilent(host, id string, gen uint64)
}

var _ Receiver = (*Engine)(nil)

// IngressLoad is implemented by a Receiver that tells, without a lock, how
// many jobs it holds as their ingress (Engine.IngressJobs). A transport may
// read it on its hot path to favour the latency of a job alone at its
// ingress over batching; a Receiver without it is taken as never alone.
type IngressLoad interface {
	IngressJobs() int
}

var _ IngressLoad = (*Engine)(nil)

// ErrNodeReplaced is wrapped by a Transport.Forward whose job was meant
// for an incarnation of its node other than the one there now: the one it
// was meant for is dead (docs/cluster.md, "Incarnations"), and the one
// there now dropped the job, or the sender did before sending it.
var ErrNodeReplaced = errors.New("core: the node the job was sent to was replaced by a new incarnation")

// ReasonZone is the reason Undeliverable is given for a zone-scoped
// delivery the transport would not send: its node is not in the job's zone
// (any more). The job is routed again, not failed.
const ReasonZone = "zone"

// MessageKind names a peer message. The kinds are the label values of
// switchyard_peer_messages_total{kind}.
type MessageKind string

// Message kinds, by the leg they travel.
const (
	// MsgForward ingress → dispatcher: a job that goes back to its queue
	// (reject, lost worker) travelling asynchronously. A first forward is
	// the synchronous Transport.Forward.
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
	// MsgGrant ingress → consumer host: more output credit for a binding,
	// its reader having taken some of its output (credit.go).
	MsgGrant MessageKind = "grant"
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
	// offered the job again); otherwise the worker was lost. Running says
	// the worker may still be running the job (its node was only sent a
	// cancel): such a job is never restarted (restart.go).
	Rejected bool
	Running  bool
	Reason   string

	// Cancel: the code the job ended with.
	Code Code

	// Grant: the binding's output credit, cumulative.
	Credit OutputCredit

	// TTL is, on a reply, what was left of the job's TTL when the host sent
	// it: a transport bounds the job's response leg by it, since a response
	// leg is closed by the job's end or its TTL, never by an idle timer.
	TTL time.Duration
}

// End is a job's end as its worker reported it: Code "" is success.
type End struct {
	Code   Code
	Detail string
	Result json.RawMessage
}
