package core

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"time"
)

// This file is the roles across nodes: the seam between the engine and the
// node-to-node transport, and the outbound glue between roles.
//
// The seam: Transport is what the engine calls to reach other nodes,
// Receiver what the transport calls with what other nodes sent. package
// peer implements Transport over gRPC; *Engine implements Receiver
// (receive.go). Both carry Messages.
//
// The glue (from sendLocked on): each role calls the next in-process when
// it is on this node and through Transport.Send when it is not, so the
// single-node path (ingress, dispatcher and consumer host on one node)
// never touches the network, and the cluster path is the same code with a
// message in the middle. membership.go and relocate.go react to the
// catalog.

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
	// creates a second job.
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
	// Nothing here bounds a reply leg: its job's output credit does
	// (credit.go), and a grant travels back to the host as a message too.
	Send(node string, m Message)
	// Expect tells the transport that this node is about to offer binding
	// (job, gen), whose ingress is node, to a worker: the reply leg may be
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
	// lane, a binding's reply leg, or the node's FIFO of lone messages.
	HandleMessage(from string, m Message)
	// Undeliverable is told about a message Send queued that no transport
	// can carry (too large, or with no valid wire form) or that must not
	// go to node (ReasonZone). It is never sent nor retried.
	Undeliverable(node string, m Message, reason string)
	// ReplyLegOpened is told that host opened the reply leg of binding
	// (id, gen): the job runs there. Hosts open it when they offer the job
	// to their worker, before its first output.
	ReplyLegOpened(host, id string, gen uint64)
	// ReplyLegSilent is told that nothing, not even a heartbeat, arrived on
	// the reply leg of binding (id, gen) from host for several heartbeat
	// intervals while its connection stayed open (a host paused,
	// partitioned or swapping). The leg's stream is ended first.
	ReplyLegSilent(host, id string, gen uint64)
}

var _ Receiver = (*Engine)(nil)

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
	// offered the job again); otherwise the worker was lost.
	Rejected bool
	Reason   string

	// Cancel: the code the job ended with.
	Code Code

	// Grant: the binding's output credit, cumulative.
	Credit OutputCredit

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

// sendLocked queues a peer message. With no cluster every role is local
// and nothing may be sent: that would be a routing bug, so it is logged.
func (e *Engine) sendLocked(node string, m Message) {
	if e.transport == nil || node == e.cfg.Node {
		e.logJob(e.traceOfLocked(m), slog.LevelError, "bug: peer message with no peer", "kind", m.Kind, "node", node, "job", m.JobID)
		return
	}
	e.transport.Send(node, m)
}

// goLocked runs f on a goroutine the engine owns: Close cancels its context
// and waits for it. Catalog writes go this way, never under mu.
func (e *Engine) goLocked(f func(ctx context.Context)) {
	if e.closed {
		return
	}
	e.bg.Go(func() { f(e.bgCtx) })
}

// replyLocked sends a worker's answer (m's Accepted, Output or End) for d
// to d's remote ingress. A node whose lease may be gone forwards nothing:
// the cluster may already have handed the job to another worker.
func (e *Engine) replyLocked(w *Worker, d Delivery, m Message) {
	if !e.cluster.LeaseValid() {
		e.m.FencedMessages.Inc()
		return
	}
	m.Kind, m.JobID, m.Gen, m.Queue, m.Consumer, m.WorkerName = MsgReply, d.JobID, d.Gen, d.Queue, w.ID, w.Name
	if b := w.bindings[d.JobID]; b != nil {
		m.TTL = b.t.budget.Remaining(time.Now())
	}
	e.sendLocked(d.Ingress, m)
}

// releaseToIngressLocked hands a binding that ended without an outcome back
// to the job's ingress, which decides whether it runs again.
func (e *Engine) releaseToIngressLocked(d Delivery, consumer string, rejected bool, reason string) {
	if d.Ingress == e.cfg.Node {
		e.releaseAtIngressLocked(d.JobID, d.Gen, consumer, rejected, reason)
		return
	}
	if e.cluster.LeaseValid() {
		e.sendLocked(d.Ingress, Message{Kind: MsgRelease, JobID: d.JobID, Gen: d.Gen, Queue: d.Queue, Consumer: consumer, Rejected: rejected, Reason: reason})
	}
}

// reforwardLocked sends a job back to its queue under a new generation:
// whatever the earlier binding still says is stale from now on. The job
// goes to the queue's dispatcher as the view names it now, which is how a
// job whose dispatcher died is re-forwarded safely.
func (e *Engine) reforwardLocked(j *Job) {
	now := time.Now()
	j.gen++
	// No node holds the job until it is forwarded again: a node death
	// seen meanwhile must not release it a second time.
	j.state, j.consumer, j.worker, j.host, j.dispatcher, j.settled = StateQueued, "", "", "", "", false
	// The new binding's credit starts from its window again.
	window, sent := j.pace.window, j.pace.sent
	e.paceEndedLocked(j)
	j.pace = newPace(window, sent)
	d := e.deliveryLocked(j, now)
	d.Front = true
	if d.TTL <= 0 {
		e.finishLocked(j, CodeExpired, "the job's TTL ran out before it could go back to its queue", nil)
		return
	}
	node := e.cfg.Node
	if e.cluster != nil {
		var ok bool
		if node, ok = e.cluster.CachedDispatcher(j.Queue); !ok {
			if !e.drain.started {
				e.awaitDispatcherLocked(j)
				return
			}
			// A draining node claims no queue: it dispatches its own
			// requester's job itself, to a consumer on another node.
			node = e.cfg.Node
		}
	}
	e.forwardToLocked(j, node, d)
}

func (e *Engine) forwardToLocked(j *Job, node string, d Delivery) {
	j.dispatcher = node
	if j.await != nil {
		endSpan(j.await, "found", "", AttrPeer.String(node))
		j.await = nil
	}
	if node != e.cfg.Node {
		e.sendLocked(node, Message{Kind: MsgForward, JobID: d.JobID, Gen: d.Gen, Queue: d.Queue, Delivery: &d})
		return
	}
	if err := e.enqueueLocked(d, time.Now()); err != nil {
		e.finishLocked(j, codeOr(err, CodeDispatcherUnavailable), err.Error(), nil)
		return
	}
	e.dispatchLocked(e.queues[d.Queue])
}

// withdrawLocked stops an ended job wherever it is: out of this node's
// queue, off this node's worker, or by a cancel to the node that holds it
// (its consumer host when known, else its dispatcher, which passes the
// cancel on).
func (e *Engine) withdrawLocked(j *Job, code Code) {
	sent := e.cancelHereLocked(j.Queue, j.ID, j.gen, code)
	if j.settled || e.cluster == nil {
		return
	}
	to := ""
	switch {
	case j.host != "" && j.host != e.cfg.Node:
		to = j.host
	case j.host == "" && j.dispatcher != "" && j.dispatcher != e.cfg.Node:
		to = j.dispatcher
	}
	if to != "" && to != sent {
		e.sendLocked(to, Message{Kind: MsgCancel, JobID: j.ID, Gen: j.gen, Queue: j.Queue, Code: code})
	}
}

// cancelHereLocked stops job (id, gen) in whatever role this node holds it:
// a pending job leaves the queue; a job bound to a consumer elsewhere gets
// its cancel passed on; a job on a worker here is cancelled on the worker,
// which keeps its credit until it acknowledges. It returns the node it
// passed the cancel on to, if any.
func (e *Engine) cancelHereLocked(queue, id string, gen uint64, code Code) (sentTo string) {
	if q := e.queues[queue]; q != nil {
		for _, t := range q.pending {
			if t.d.JobID == id {
				e.removePendingLocked(q, t)
				break
			}
		}
		if t := q.bound[id]; t != nil && t.d.Gen == gen && t.remote != nil {
			sentTo = t.remote.info.Node
			e.sendLocked(sentTo, Message{Kind: MsgCancel, JobID: id, Gen: gen, Queue: queue, Code: code})
		}
	}
	if w := e.hosted[id]; w != nil {
		if b := w.bindings[id]; b != nil && b.t.d.Gen == gen {
			e.cancelOnWorkerLocked(w, id, gen, code)
		}
	}
	return sentTo
}

// codeOr returns err's code, or def when err is not an *Error.
func codeOr(err error, def Code) Code {
	if c, ok := CodeOf(err); ok {
		return c
	}
	return def
}
