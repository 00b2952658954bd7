package switchyard

import (
	"context"
	"fmt"
	"time"

	"github.com/switchyard/switchyard/catalog"
	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/peer"
)

// transport is the half of core.Cluster that moves messages between nodes
// (peer.Router): the request leg, the reply legs and their flow control.
type transport interface {
	Forward(ctx context.Context, node string, d core.Delivery) error
	Send(node string, m core.Message)
	Room(node, job string) <-chan struct{}
	Expect(node, job string, gen uint64, queue string, ttl time.Duration)
}

// nodeCluster is core.Cluster for a node: routing decisions from the
// catalog's watched view and this node's peer tracker, elections and
// releases as catalog transactions, messages over the peer transport.
type nodeCluster struct {
	self    string
	cat     *catalog.Catalog
	tracker *peer.Tracker
	transport
}

var (
	_ core.Cluster = (*nodeCluster)(nil)
	// The engine hears of reply legs opened, and of those whose host went
	// silent.
	_ transport           = (*peer.Router)(nil)
	_ peer.LegWatcher     = (*core.Engine)(nil)
	_ peer.LegOpenWatcher = (*core.Engine)(nil)
)

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

// Routable: this node always is (while its lease holds, which LeaseValid
// covers on the paths that matter); another node when its record says
// online and it answers this node's pings.
func (c *nodeCluster) Routable(node string) bool {
	if node == c.self {
		return true
	}
	n, ok := c.cat.Node(node)
	return ok && n.State == core.StateOnline && !c.tracker.Spare(peer.NodeAddr{ID: n.ID, PeerAddr: n.PeerAddr})
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
