package switchyard

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/switchyard/switchyard/catalog"
	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/peer"
)

// nodeCluster is core.Cluster for a node: routing decisions from the
// catalog's watched view and this node's peer tracker, elections and
// releases as catalog transactions.
type nodeCluster struct {
	self    string
	cat     *catalog.Catalog
	tracker *peer.Tracker
}

var _ core.Cluster = (*nodeCluster)(nil)

func (c *nodeCluster) Dispatcher(ctx context.Context, queue string) (string, error) {
	if node, ok := c.CachedDispatcher(queue); ok {
		return node, nil
	}
	rec, err := c.cat.Elect(ctx, queue, catalog.ClaimProducer)
	if err != nil {
		return "", err
	}
	if !c.Routable(rec.Dispatcher) {
		return "", fmt.Errorf("queue %s: dispatcher %s is not routable from here", queue, rec.Dispatcher)
	}
	return rec.Dispatcher, nil
}

func (c *nodeCluster) CachedDispatcher(queue string) (string, bool) {
	rec, ok := c.cat.Dispatch(queue)
	if !ok || !c.Routable(rec.Dispatcher) {
		return "", false
	}
	return rec.Dispatcher, true
}

func (c *nodeCluster) ClaimConsumer(ctx context.Context, queue string) error {
	_, err := c.cat.Elect(ctx, queue, catalog.ClaimConsumer)
	return err
}

func (c *nodeCluster) ReleaseQueue(ctx context.Context, queue string) error {
	return c.cat.Release(ctx, queue)
}

// Resign hands each queue this node dispatches to the routable node whose
// consumers of it have the most credits (HandOver), or releases its record
// when no other node hosts one (the next node to need a dispatcher claims
// it), then publishes this node's record as draining. The order matters:
// while the record still says online, nobody takes the queue but its
// heir; once it says draining, a record naming this node would be void and
// any node could claim it, a producer before a consumer's node.
func (c *nodeCluster) Resign(ctx context.Context) error {
	var errs []error
	for _, queue := range c.cat.Queues() {
		if d, ok := c.cat.Dispatch(queue); !ok || d.Dispatcher != c.self {
			continue
		}
		if heir := c.heir(queue); heir != "" {
			moved, err := c.cat.HandOver(ctx, queue, heir)
			if err != nil {
				errs = append(errs, err)
			}
			if moved || err != nil {
				continue
			}
		}
		if err := c.cat.Release(ctx, queue); err != nil {
			errs = append(errs, err)
		}
	}
	rec, ok := c.cat.Node(c.self)
	if !ok {
		return errors.Join(append(errs, fmt.Errorf("resign: no record of %s in the view", c.self))...)
	}
	rec.State = core.StateDraining
	if err := c.cat.PublishNode(ctx, rec); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// heir is the node a resigning dispatcher hands queue to: of the other
// routable nodes hosting its consumers, the one whose consumers declare
// the most credits (ties: the first by name); "" when there is none.
func (c *nodeCluster) heir(queue string) string {
	credits := map[string]int{}
	for _, ci := range c.cat.Consumers(queue) {
		if ci.Node != c.self && c.Routable(ci.Node) {
			credits[ci.Node] += max(ci.Concurrency, 1)
		}
	}
	best := ""
	for node, n := range credits {
		if best == "" || n > credits[best] || n == credits[best] && node < best {
			best = node
		}
	}
	return best
}

// Routable: this node always is (while its lease holds, which LeaseValid
// covers on the paths that matter); another node when its record says
// online and this node's tracker does not suspect it.
func (c *nodeCluster) Routable(node string) bool {
	if node == c.self {
		return true
	}
	n, ok := c.cat.Node(node)
	return ok && n.State == core.StateOnline && !c.tracker.Suspected(peer.NodeAddr{ID: n.ID, PeerAddr: n.PeerAddr})
}

// Serves: this node always does; another node when its record says online
// and this node's tracker does not hold it spare (a suspected node still
// serves: its consumers count, they are only offered nothing new).
func (c *nodeCluster) Serves(node string) bool {
	if node == c.self {
		return true
	}
	n, ok := c.cat.Node(node)
	return ok && n.State == core.StateOnline && !c.tracker.Spare(peer.NodeAddr{ID: n.ID, PeerAddr: n.PeerAddr})
}

func (c *nodeCluster) DispatchRecord(queue string) (core.DispatchInfo, bool) {
	return c.cat.Dispatch(queue)
}

func (c *nodeCluster) NodeZone(node string) string {
	n, _ := c.cat.Node(node)
	return n.Zone
}

func (c *nodeCluster) Alive(node string) bool {
	_, ok := c.cat.Node(node)
	return ok
}

func (c *nodeCluster) Gone(node string) bool { return c.cat.NodeLeft(node) }

func (c *nodeCluster) LeaseValid() bool { return c.cat.LeaseValid() }

// reachable is the catalog's test of a node before it names it dispatcher:
// this node, a node the view has no record of, or one this node's tracker
// does not suspect. A record naming a suspected node is void: the queue is
// taken over within a heartbeat or two of the node falling silent, not at
// its lease's end (docs/cluster.md, "Losing the dispatcher's node").
func (c *nodeCluster) reachable(node string) bool {
	nd, ok := c.cat.Node(node)
	return node == c.self || !ok || !c.tracker.Suspected(peer.NodeAddr{ID: nd.ID, PeerAddr: nd.PeerAddr})
}

// peerBook is where the peer transport finds other nodes: the catalog's
// watched view.
type peerBook struct {
	cat *catalog.Catalog
	// life ends when the node stops: it bounds waits on the view.
	life context.Context
}

// addr is peer.Config.Addr: node's peer address, false once the view saw
// its record deleted (it is dead).
func (c peerBook) addr(node string) (string, bool) {
	nd, ok := c.cat.Node(node)
	if !ok && !c.cat.NodeLeft(node) {
		// Not seen yet is not gone: a node that just published its record
		// (and sent this one a message) may reach this node's view a moment
		// later. Wait for it, boundedly.
		ctx, cancel := context.WithTimeout(c.life, viewLag)
		nd, ok = c.cat.AwaitNode(ctx, node)
		cancel()
	}
	return nd.PeerAddr, ok && nd.PeerAddr != ""
}

// incarnation is peer.Config.Incarnation: node's incarnation in the view,
// "" when the view has no record of it. It never waits: a job queued for
// a node the view has not seen yet carries no stamp.
func (c peerBook) incarnation(node string) string {
	nd, _ := c.cat.Node(node)
	return nd.Incarnation
}

// viewLag bounds how long an address lookup waits for a node this node's
// catalog view has not seen yet (nor seen leave) to appear in it.
const viewLag = 2 * time.Second

// zone is peer.Config.Zone: node's zone label in the view.
func (c peerBook) zone(node string) (string, bool) {
	nd, ok := c.cat.Node(node)
	return nd.Zone, ok
}

// clusterView is the catalog as the cluster views (HTTP and gRPC) show it, with this
// node's verdict on each peer overlaid: a node the tracker suspects (it
// missed a ping, or its transport broke) is suspected while its record
// stands, and one it holds silent is spare besides, whatever its record
// says; and this node is fenced while it is, whatever its stale view
// holds.
type clusterView struct {
	*catalog.Catalog
	tracker *peer.Tracker
	// self is this node (nil in a view of others only).
	self *Node
}

func (v clusterView) Nodes() []core.NodeInfo {
	nodes := v.Catalog.Nodes()
	states, suspected := v.tracker.States(), v.tracker.SuspectedNodes()
	for i, nd := range nodes {
		// The tracker's only state of its own is silence: a state other
		// than the record's is spare over a record that still stands.
		if st, ok := states[nd.ID]; ok && st != nd.State {
			nodes[i].State = st
		}
		nodes[i].Suspected = suspected[nd.ID]
	}
	if v.self == nil || !v.self.fenced.Load() {
		return nodes
	}
	for i, nd := range nodes {
		if nd.ID == v.self.cfg.Name {
			nodes[i].State = core.StateFenced
			return nodes
		}
	}
	// Its view no longer holds its record (the lease went): still listed.
	self := v.self.record
	self.State = core.StateFenced
	nodes = append(nodes, self)
	slices.SortFunc(nodes, func(a, b core.NodeInfo) int { return cmp.Compare(a.ID, b.ID) })
	return nodes
}
