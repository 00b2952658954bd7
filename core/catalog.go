package core

import "context"

// PeerState is a node's liveness state as the cluster sees it.
//
// Only Online nodes dispatch or receive deliveries. InProgress nodes (joined,
// still syncing their view of the catalog) receive catalog writes but are not
// routed to. Draining nodes are leaving: they finish the jobs they hold, and
// their replies, releases and cancels still flow, but nothing new is routed
// to them (see Engine.Drain). Spare nodes (lease gone, or failing their
// health checks) are skipped. "Spare" is this transport's own liveness word
// and nothing more.
type PeerState string

// Peer states.
const (
	StateInProgress PeerState = "in_progress"
	StateOnline     PeerState = "online"
	StateDraining   PeerState = "draining"
	StateSpare      PeerState = "spare"
	// StateFenced is never in a catalog record: it is how a node's own
	// cluster views show it while it is fenced (its catalog lease lost, not
	// yet recovered), when its record, if its stale view still holds one,
	// may say anything.
	StateFenced PeerState = "fenced"
)

// RelayHTTP is the address other nodes relay HTTP requests to: the relay
// address, else (a record without one) the client-facing address.
func (n NodeInfo) RelayHTTP() string {
	if n.RelayHTTPAddr != "" {
		return n.RelayHTTPAddr
	}
	return n.HTTPAddr
}

// RelayGRPC is RelayHTTP for the gRPC API.
func (n NodeInfo) RelayGRPC() string {
	if n.RelayGRPCAddr != "" {
		return n.RelayGRPCAddr
	}
	return n.GRPCAddr
}

// NodeInfo is a node's record in the catalog (/nodes/{id}).
type NodeInfo struct {
	ID       string
	PeerAddr string
	HTTPAddr string
	GRPCAddr string
	// RelayHTTPAddr and RelayGRPCAddr are where other nodes dial this
	// node's HTTP and gRPC APIs to relay a keyed retry to it
	// (core/relay.go); HTTPAddr and GRPCAddr are for clients and may name
	// an address only they reach (a published port on the client's
	// loopback). Empty in records of nodes that predate them: RelayHTTP
	// and RelayGRPC then fall back to the client addresses.
	RelayHTTPAddr string
	RelayGRPCAddr string
	Zone          string
	State         PeerState
	// Incarnation is new at every start and every recovery of the node
	// (after it fenced): a record whose incarnation changed belongs to a
	// new process, or to the same one come back, and the previous
	// incarnation is dead (docs/cluster.md, "Incarnations"). Empty in
	// records of nodes that predate it.
	Incarnation string
	// Suspected is never in a catalog record: a node's cluster views set it
	// on a peer its own tracker suspects while the peer's record still
	// stands (it missed a ping, or its transport broke; State says spare
	// once it is silent). It is one node's opinion, not proof.
	Suspected bool
}

// ConsumerInfo is a consumer's record in the catalog (/q/{queue}/c/{id}):
// where a worker lives and what it can run.
type ConsumerInfo struct {
	ID           string
	Queue        string
	Node         string
	Name         string
	Capabilities Capabilities
	Concurrency  int
	Zone         string
}

// DispatchInfo is a queue's dispatch record (/q/{queue}).
type DispatchInfo struct {
	Dispatcher string
	ReplyTo    string
	Zone       string
	// Epoch is the record's term: the catalog's revision of the write
	// that named Dispatcher, which only grows across every claim of the
	// queue. It is not part of the stored value. A dispatcher stamps it on
	// every delivery, and a host refuses a delivery whose epoch is older
	// than one it has seen for the queue (docs/cluster.md, "Epochs").
	// Zero: unknown (a record built by hand, or read from no store).
	Epoch uint64
}

// Catalog is the node's handle on the replicated registries. Writes are
// attached to the node's lease, so a node that dies takes its records with
// it. Reads come from a watched in-memory view and never wait on the store:
// routing must not block on the catalog.
type Catalog interface {
	// PublishConsumer writes (or rewrites) a consumer record under the node's
	// lease. It returns once the store has accepted the write.
	PublishConsumer(ctx context.Context, c ConsumerInfo) error
	// WithdrawConsumer deletes a consumer record. Withdrawing a record that
	// does not exist is not an error.
	WithdrawConsumer(ctx context.Context, queue, id string) error
	// Consumers returns the consumers of a queue on every node, from the
	// watched view. The slice, and each record's Capabilities, may be
	// shared with every other caller and with later calls: callers must
	// not modify them (the dispatcher reads them on every job, so they
	// are not copied per call).
	Consumers(queue string) []ConsumerInfo
	// Nodes returns every node record, from the watched view.
	Nodes() []NodeInfo
}

// ClusterView is the catalog as the cluster and queue views read it (the
// HTTP API and the gRPC ClusterService alike): the watched, in-memory
// registries, never a read of the store per request. A node overlays its
// own verdict on each peer's state (see switchyard.Node).
type ClusterView interface {
	// Nodes returns every node record.
	Nodes() []NodeInfo
	// Queues returns the name of every queue with a dispatch record or a
	// consumer.
	Queues() []string
	// Consumers returns the consumers of a queue, on every node, shared
	// as Catalog.Consumers's are: not to be modified.
	Consumers(queue string) []ConsumerInfo
	// Dispatch returns a queue's dispatch record, if it has one.
	Dispatch(queue string) (DispatchInfo, bool)
}

// NoCluster is the ClusterView of a node without a catalog (a transport
// tested alone): no nodes, no queues, no consumers.
type NoCluster struct{}

func (NoCluster) Nodes() []NodeInfo                    { return nil }
func (NoCluster) Queues() []string                     { return nil }
func (NoCluster) Consumers(string) []ConsumerInfo      { return nil }
func (NoCluster) Dispatch(string) (DispatchInfo, bool) { return DispatchInfo{}, false }
