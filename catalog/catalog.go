// Package catalog is Switchyard's catalog on etcd: the registries of nodes
// (/nodes/{id}), dispatch records (/q/{queue}) and consumers
// (/q/{queue}/c/{id}), written under this node's lease and read from an
// in-memory view that a watch keeps current, so routing never waits on etcd.
//
// By default a Catalog runs an embedded single-member etcd in the node's data
// directory; with Config.Endpoints it is a client of an external cluster.
//
// A Catalog also fences its node: LeaseLost is closed before the lease can
// have expired anywhere else, which is what lets other nodes take a lease's
// expiry as proof that its holder has stopped (see FenceDeadline).
package catalog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/switchyard/switchyard/core"
)

var _ core.Catalog = (*Catalog)(nil)

// Catalog is a node's handle on the catalog. It owns its goroutines (lease
// renewal, fencing, the watch) and, when embedded, the etcd member; Close
// ends them all. Its methods are safe for concurrent use.
type Catalog struct {
	cfg    Config
	log    *slog.Logger
	etcd   *embed.Etcd // nil with external Endpoints
	client *clientv3.Client
	// lease is the lease the node holds now: replaced by Recover after it
	// was lost, so read it once per operation (held).
	lease atomic.Pointer[lease]
	// rot is held for writing while rotate moves the records to a new etcd
	// lease, and for reading by every write that attaches a key to the
	// lease or compares a key's lease with it: no such write sees the
	// records half moved, or attaches a key to the lease being left.
	rot sync.RWMutex
	// runCtx is the Catalog's lifetime, which the goroutines of a lease
	// granted by Recover run under.
	runCtx context.Context

	clientAddr, peerAddr string

	view *view
	subs subscribers

	cancel context.CancelFunc
	wg     sync.WaitGroup

	closeOnce sync.Once
	closeErr  error
	// mu orders Recover against Close: no goroutine is started once
	// closing is set (wg.Add after wg.Wait).
	mu         sync.Mutex
	closing    bool
	recovering bool
	// reach is this node's verdict on its peers (SetReachable).
	reach atomic.Pointer[func(string) bool]
}

// Open starts (or connects to) etcd, grants this node's lease, loads the
// registries and starts watching them. It returns once the view is loaded
// and the watch established, so the first read already reflects the store.
// ctx bounds the start only; the Catalog lives until Close.
func Open(ctx context.Context, cfg Config) (_ *Catalog, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	c := &Catalog{cfg: cfg, log: cfg.Logger, view: newView()}
	runCtx, cancel := context.WithCancel(context.Background())
	c.runCtx, c.cancel = runCtx, cancel
	defer func() {
		if err != nil {
			// Undo whatever was started; the error that matters is err.
			_ = c.shutdown(ctx)
		}
	}()

	if cfg.embedded() {
		c.etcd, err = startEmbedded(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("open catalog: %w", err)
		}
		c.clientAddr = c.etcd.Clients[0].Addr().String()
		c.peerAddr = c.etcd.Peers[0].Addr().String()
		// The in-process client calls the server's handlers directly: no
		// socket, no gRPC encoding. It bypasses the gRPC interceptors, so
		// WithRequireLeader has no effect on it; RequestTimeout still
		// bounds every write.
		c.client = v3client.New(c.etcd.Server)
		c.wg.Add(1)
		go c.embedLoop(runCtx)
	} else {
		tc, err := cfg.clientTLS()
		if err != nil {
			return nil, fmt.Errorf("open catalog: %w", err)
		}
		if cfg.Dir != "" || cfg.ClientAddr != "" || cfg.PeerAddr != "" || cfg.UnsafeNoFsync || cfg.FastElection {
			c.log.Debug("catalog: external endpoints; ignoring the embedded-only settings",
				"endpoints", cfg.Endpoints, "dir", cfg.Dir, "client_addr", cfg.ClientAddr, "peer_addr", cfg.PeerAddr,
				"unsafe_no_fsync", cfg.UnsafeNoFsync, "fast_election", cfg.FastElection)
		}
		c.client, err = clientv3.New(clientv3.Config{
			Endpoints:   cfg.Endpoints,
			DialTimeout: cfg.DialTimeout,
			// A connection to an endpoint that went silent (no FIN, no RST:
			// a blackhole, a paused host) is found dead by keepalive pings
			// rather than by TCP's minutes, and the client's balancer sends
			// calls to the other endpoints; a reconnection attempt that
			// gets no answer is abandoned after ExternalConnectTimeout, not
			// gRPC's default 20s (docs/cluster.md, "An external etcd").
			DialKeepAliveTime:    ExternalKeepAliveTime,
			DialKeepAliveTimeout: ExternalKeepAliveTimeout,
			DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
				Backoff:           backoff.Config{BaseDelay: 250 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 5 * time.Second},
				MinConnectTimeout: ExternalConnectTimeout,
			})},
			Logger:   zap.NewNop(),
			TLS:      tc,
			Username: cfg.Username,
			Password: cfg.Password,
		})
		if err != nil {
			return nil, fmt.Errorf("open catalog: connect to %v: %w", cfg.Endpoints, err)
		}
	}

	cfg.Metrics.instrument(c.client)

	// A record of this node's name on a lease is a previous incarnation's:
	// a process that was killed, or restarted, inside its lease. Its
	// records go now rather than at the lease's expiry, so nothing routes
	// to consumers and queues no process holds any more, and this start
	// does not wait for them (docs/cluster.md, "Incarnations").
	if err := c.revokePrevious(ctx); err != nil {
		return nil, fmt.Errorf("open catalog: %w", err)
	}
	l, err := c.grant(ctx)
	if err != nil {
		return nil, fmt.Errorf("open catalog: %w", err)
	}
	c.lease.Store(l)

	rev, err := c.load(ctx)
	if err != nil {
		return nil, fmt.Errorf("open catalog: %w", err)
	}
	ws, err := c.startWatch(runCtx, ctx, rev+1)
	if err != nil {
		return nil, fmt.Errorf("open catalog: %w", err)
	}
	c.wg.Add(3)
	go c.watchLoop(runCtx, ws)
	go c.renewLoop(runCtx, l)
	go c.fenceLoop(runCtx, l)
	return c, nil
}

// embedLoop logs the embedded member failing after it started. The Catalog
// does not restart it: a node whose catalog died stops renewing its lease
// and fences, which is the behaviour the rest of the system expects.
func (c *Catalog) embedLoop(ctx context.Context) {
	defer c.wg.Done()
	select {
	case <-ctx.Done():
	case err := <-c.etcd.Err():
		c.log.Error("embedded etcd failed", "err", err)
	case <-c.etcd.Server.StopNotify():
		c.log.Error("embedded etcd stopped")
	}
}

// Close stops the Catalog: it ends the renewal and watch goroutines, revokes
// the lease so that this node's records vanish at once rather than after
// LeaseTTL, closes the client and the embedded member, and waits for every
// goroutine it started. It closes LeaseLost, since the node no longer holds
// a lease. A revoke that fails is only logged: the records then expire with
// the lease. Close is idempotent; later calls return the first result.
func (c *Catalog) Close(ctx context.Context) error {
	c.closeOnce.Do(func() { c.closeErr = c.shutdown(ctx) })
	return c.closeErr
}

// shutdown tears down whatever Open got as far as starting.
func (c *Catalog) shutdown(ctx context.Context) error {
	c.mu.Lock()
	c.closing = true
	c.mu.Unlock()
	if c.cancel != nil {
		c.cancel()
	}
	c.wg.Wait()
	if l := c.lease.Load(); l != nil {
		// The caller's ctx may already be cancelled (shutdown on a signal);
		// the revoke must still get its chance.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(c.cfg.RequestTimeout, time.Second))
		_, err := c.client.Revoke(rctx, l.leaseID())
		cancel()
		if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			c.log.Warn("catalog: revoke lease on close; records expire with it", l.attr(), "err", err)
		}
		l.fence()
	}
	var errs []error
	if c.client != nil {
		if err := c.client.Close(); err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, fmt.Errorf("close catalog client: %w", err))
		}
	}
	if c.etcd != nil {
		c.etcd.Close()
	}
	return errors.Join(errs...)
}

// LeaseLost is closed when this node must treat its lease as lost: a renewal
// found it gone, or it was not renewed by its fence deadline (see
// FenceDeadline), or the Catalog was closed. From then on the node cancels
// the jobs bound to its consumers and forwards no output, and the Catalog's
// writes fail with ErrLeaseLost.
//
// The channel is the current lease's: after Recover, LeaseLost returns the
// new lease's channel, so a watcher asks again after each recovery.
func (c *Catalog) LeaseLost() <-chan struct{} { return c.held().lost }

// LeaseValid reports whether the node may still act on its lease: it has
// not been declared lost and its fence deadline (FenceDeadline) has not
// passed on this node's own monotonic clock. It is checked on the hot path,
// synchronously, because the goroutine that would close LeaseLost may not
// have run yet when a paused process wakes up with its worker's output
// already waiting.
func (c *Catalog) LeaseValid() bool {
	l := c.held()
	return !l.isLost() && time.Now().Before(l.deadline())
}

// held is the lease the node holds now (possibly lost).
func (c *Catalog) held() *lease { return c.lease.Load() }

// Incarnation is this node's incarnation: new at every start and every
// recovery (it is the hex id of the lease granted then; a rotation moves
// the records to another lease and keeps it). PublishNode writes it into
// the node record, so peers tell a node that came back from the one that
// was there before (docs/cluster.md, "Incarnations").
func (c *Catalog) Incarnation() string { return c.held().incarnation }

// LeaseID returns the id of the etcd lease this node's records are
// attached to now.
func (c *Catalog) LeaseID() clientv3.LeaseID { return c.held().leaseID() }

// Client returns the etcd client, for other adapters (dispatcher claims use
// transactions on it). It is closed by Close.
func (c *Catalog) Client() *clientv3.Client { return c.client }

// ClientAddr returns the host:port the embedded member serves clients on,
// or "" with external Endpoints.
func (c *Catalog) ClientAddr() string { return c.clientAddr }

// PeerAddr returns the host:port the embedded member serves peers on, or ""
// with external Endpoints.
func (c *Catalog) PeerAddr() string { return c.peerAddr }

// Name returns this node's id.
func (c *Catalog) Name() string { return c.cfg.Name }

// writeCtx bounds a write by RequestTimeout and makes it fail at once on a
// member with no leader instead of waiting for one.
func (c *Catalog) writeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
	return clientv3.WithRequireLeader(ctx), cancel
}

// putLeased writes key under this node's lease.
func (c *Catalog) putLeased(ctx context.Context, key string, value []byte) error {
	c.rot.RLock()
	defer c.rot.RUnlock()
	l := c.held()
	if l.isLost() {
		return fmt.Errorf("put %s: %w", key, ErrLeaseLost)
	}
	ctx, cancel := c.writeCtx(ctx)
	defer cancel()
	if _, err := c.client.Put(ctx, key, string(value), clientv3.WithLease(l.leaseID())); err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			c.fenceLease(l, "lease not found on write")
			return fmt.Errorf("put %s: %w: %w", key, ErrLeaseLost, err)
		}
		return fmt.Errorf("put %s: %w", key, err)
	}
	return nil
}

// PublishNode writes this node's record (/nodes/{Name}) under its lease,
// with its current Incarnation (n.Incarnation is ignored). n.ID may be
// empty; otherwise it must be this node's Name.
func (c *Catalog) PublishNode(ctx context.Context, n core.NodeInfo) error {
	if n.ID == "" {
		n.ID = c.cfg.Name
	}
	if n.ID != c.cfg.Name {
		return fmt.Errorf("publish node: id %q is not this node (%q)", n.ID, c.cfg.Name)
	}
	switch n.State {
	case core.StateOnline, core.StateInProgress, core.StateDraining, core.StateSpare:
	default:
		return fmt.Errorf("publish node: state %q is not one of %s, %s, %s, %s", n.State, core.StateOnline, core.StateInProgress, core.StateDraining, core.StateSpare)
	}
	if n.Zone != "" && !core.ValidName(n.Zone) {
		return fmt.Errorf("publish node: zone %q is not 1-128 of [A-Za-z0-9._-]", n.Zone)
	}
	n.Incarnation = c.Incarnation()
	b, err := encodeNode(n)
	if err != nil {
		return fmt.Errorf("publish node: %w", err)
	}
	if err := c.putLeased(ctx, NodeKey(n.ID), b); err != nil {
		return fmt.Errorf("publish node: %w", err)
	}
	return nil
}

// PublishConsumer writes (or rewrites) a consumer record under this node's
// lease. c.Node may be empty; otherwise it must be this node's Name, because
// the record lives and dies with this node's lease.
func (c *Catalog) PublishConsumer(ctx context.Context, ci core.ConsumerInfo) error {
	if ci.Node == "" {
		ci.Node = c.cfg.Name
	}
	switch {
	case !core.ValidName(ci.Queue):
		return fmt.Errorf("publish consumer: queue %q is not 1-128 of [A-Za-z0-9._-]", ci.Queue)
	case !core.ValidName(ci.ID):
		return fmt.Errorf("publish consumer: id %q is not 1-128 of [A-Za-z0-9._-]", ci.ID)
	case ci.Node != c.cfg.Name:
		return fmt.Errorf("publish consumer %s/%s: node %q is not this node (%q)", ci.Queue, ci.ID, ci.Node, c.cfg.Name)
	case ci.Concurrency < 0:
		return fmt.Errorf("publish consumer %s/%s: concurrency %d is negative", ci.Queue, ci.ID, ci.Concurrency)
	case ci.Zone != "" && !core.ValidName(ci.Zone):
		return fmt.Errorf("publish consumer %s/%s: zone %q is not 1-128 of [A-Za-z0-9._-]", ci.Queue, ci.ID, ci.Zone)
	}
	b, err := encodeConsumer(ci)
	if err != nil {
		return fmt.Errorf("publish consumer %s/%s: %w", ci.Queue, ci.ID, err)
	}
	if err := c.putLeased(ctx, ConsumerKey(ci.Queue, ci.ID), b); err != nil {
		return fmt.Errorf("publish consumer %s/%s: %w", ci.Queue, ci.ID, err)
	}
	return nil
}

// WithdrawConsumer deletes a consumer record if it is still attached to this
// node's lease. A record that is gone, or that another node has since
// published under the same id, is left alone and is not an error: a late
// withdrawal must not remove a worker that reconnected elsewhere.
func (c *Catalog) WithdrawConsumer(ctx context.Context, queue, id string) error {
	if !core.ValidName(queue) || !core.ValidName(id) {
		return fmt.Errorf("withdraw consumer: %q/%q is not a valid queue/id", queue, id)
	}
	c.rot.RLock()
	defer c.rot.RUnlock()
	ctx, cancel := c.writeCtx(ctx)
	defer cancel()
	key := ConsumerKey(queue, id)
	_, err := c.client.Txn(ctx).
		If(clientv3.Compare(clientv3.LeaseValue(key), "=", c.held().leaseID())).
		Then(clientv3.OpDelete(key)).
		Commit()
	if err != nil {
		return fmt.Errorf("withdraw consumer %s/%s: %w", queue, id, err)
	}
	return nil
}

// Consumers returns the consumers of queue on every node, sorted by id,
// from the watched view: a snapshot shared by every caller until the
// queue's consumers change, which the caller must not modify (neither the
// slice nor a record's Capabilities).
func (c *Catalog) Consumers(queue string) []core.ConsumerInfo { return c.view.consumersOf(queue) }

// Related returns the nodes the catalog ties to node: the dispatchers of
// the queues node hosts a consumer of, and the nodes hosting consumers of
// the queues node dispatches (the peers its tracker pings with or without
// traffic, peer.TrackerConfig.Related).
func (c *Catalog) Related(node string) map[string]bool { return c.view.related(node) }

// Nodes returns every node record, sorted by id, from the watched view.
func (c *Catalog) Nodes() []core.NodeInfo { return c.view.allNodes() }

// Node returns one node's record from the watched view.
func (c *Catalog) Node(id string) (core.NodeInfo, bool) { return c.view.node(id) }

// NodeLeft reports whether the view saw the node's record deleted (and not
// written again): its lease is gone, its death proven. A node without a
// record that has not left is only not seen yet.
func (c *Catalog) NodeLeft(id string) bool { return c.view.hasLeft(id) }

// AwaitNode returns the node's record once the view has it: at once when it
// does, else when the watch brings it. False when the node left, or ctx
// ended first. A node that sends this one a message has published its
// record already, but the member this view watches may apply that write a
// moment after the message arrives; this bridges the gap.
func (c *Catalog) AwaitNode(ctx context.Context, id string) (core.NodeInfo, bool) {
	changed, unsubscribe := c.subs.add()
	defer unsubscribe()
	for {
		if n, ok := c.view.node(id); ok {
			return n, true
		}
		if c.view.hasLeft(id) {
			return core.NodeInfo{}, false
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return core.NodeInfo{}, false
		}
	}
}

// Dispatch returns a queue's dispatch record from the watched view, its
// Epoch the revision that wrote it; or this node's own claim (Elect) when
// the watch has not delivered it yet, so a node that just claimed a queue
// knows it dispatches it, under which epoch, before its view does.
func (c *Catalog) Dispatch(queue string) (core.DispatchInfo, bool) { return c.view.dispatchOf(queue) }

// Queues returns, sorted, every queue that has a dispatch record or at least
// one consumer.
func (c *Catalog) Queues() []string { return c.view.queues() }

// Watch returns a channel that receives a value, without blocking the
// catalog, after each change to the view, and a func that unsubscribes it.
// The channel holds one pending wake-up: a subscriber re-reads the view when
// woken and never misses the latest state, though it may not see every
// intermediate one. The channel is never closed.
func (c *Catalog) Watch() (<-chan struct{}, func()) { return c.subs.add() }
