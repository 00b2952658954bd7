package core

import "context"

// Cluster is the routing-decision half of a cluster: what the engine asks
// about other nodes and queues before it routes anything. The node answers
// from its catalog's watched view and its peer tracker; messages themselves
// go by the Transport (transport.go). A nil Cluster is a single node: every
// role is local and nothing touches the network.
//
// Locking: CachedDispatcher, DispatchRecord, Routable, Serves, NodeZone,
// Alive, Gone and LeaseValid
// are called with Engine.mu held, so they answer from memory, never block
// and never call the engine. Dispatcher, ClaimConsumer, ReleaseQueue and
// Resign may write to the catalog and are called without Engine.mu.
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
	// Resign is this node leaving its roles before it shuts down (see
	// Engine.Drain): every queue it dispatches is handed to a routable node
	// that hosts consumers of it, in one catalog write per queue, or
	// released when no such node is left; then its node record says
	// StateDraining, so no node routes anything new to it and its consumers
	// stop counting for the capability check. The handover comes first:
	// once the record says draining, a producer would claim the queues
	// itself. An error leaves the rest as it was: the records still naming
	// this node go with its lease when it closes.
	Resign(ctx context.Context) error
	// DispatchRecord is queue's dispatch record as this node knows it: the
	// watched view's, or this node's own claim when the view has not caught
	// up with it yet. Its Epoch orders the records of a queue.
	DispatchRecord(queue string) (DispatchInfo, bool)
	// Routable reports whether jobs may be routed to node: it is Online in
	// the catalog and this node's peer tracker does not suspect it (it
	// missed no ping, and its transport did not break).
	Routable(node string) bool
	// Serves reports whether node's consumers count for the capability
	// check: it is Online in the catalog and this node's peer tracker does
	// not hold it spare (silent). A suspected node serves but is not
	// Routable: a job that only it can run waits for it rather than being
	// refused no_capable_worker.
	Serves(node string) bool
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
}
