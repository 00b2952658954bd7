package catalog

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrClosed is returned by Recover once Close has begun.
var ErrClosed = errors.New("catalog: closed")

// Recover gives a node whose lease was lost a new one, once the catalog
// answers again: it revokes the lost lease if etcd still holds it (its
// records, the node's previous incarnation's, go at once), grants a new
// lease and starts renewing and fencing it. From then on LeaseValid is
// true, LeaseLost returns the new lease's channel, writes go through
// again, and Incarnation is new. The caller republishes what the node
// holds (its node record, its consumers) under the new lease: nothing of
// the old one survives.
//
// It returns nil at once when the current lease is not lost, and an error
// when the catalog does not answer (the caller retries) or the Catalog is
// closing (ErrClosed). Calls do not overlap: a second one while the first
// runs fails.
func (c *Catalog) Recover(ctx context.Context) error {
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return ErrClosed
	}
	if c.recovering {
		c.mu.Unlock()
		return errors.New("catalog: recover: already recovering")
	}
	c.recovering = true
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.recovering = false
		c.mu.Unlock()
	}()

	old := c.held()
	if !old.isLost() {
		return nil
	}
	// Each round is short: while the catalog has no quorum every call
	// waits out its deadline (the in-process client waits for a leader),
	// and the round in flight when the quorum comes back delays the
	// recovery by what is left of it.
	ctx, cancel := context.WithTimeout(ctx, min(c.cfg.RequestTimeout, recoverRound))
	defer cancel()
	// The old lease first: were the new one granted while the old one
	// lived on, two sets of this node's records would stand at once, and
	// the old consumers and dispatch records would route jobs to a node
	// that no longer holds them.
	if err := c.revoke(ctx, old.leaseID()); err != nil {
		return fmt.Errorf("recover: revoke lost lease %x: %w", int64(old.leaseID()), err)
	}
	l, err := c.grant(ctx)
	if err != nil {
		return fmt.Errorf("recover: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		// Close revokes the lease it finds; this one it would not.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(c.cfg.RequestTimeout, time.Second))
		_, _ = c.client.Revoke(rctx, l.leaseID())
		cancel()
		return ErrClosed
	}
	c.lease.Store(l)
	c.wg.Add(2)
	go c.renewLoop(c.runCtx, l)
	go c.fenceLoop(c.runCtx, l)
	c.log.Info("catalog lease recovered: new lease, new incarnation", l.attr(),
		"previous", fmt.Sprintf("%x", int64(old.leaseID())), "incarnation", l.incarnation)
	return nil
}

// recoverRound bounds one Recover call: a revoke and a grant, two raft
// commits, which take milliseconds when the catalog has a quorum.
const recoverRound = time.Second

// grant grants a new lease of LeaseTTL for a new incarnation.
func (c *Catalog) grant(ctx context.Context) (*lease, error) {
	g, sent, err := c.grantLease(ctx)
	if err != nil {
		return nil, err
	}
	l := newLease(g.ID, sent, time.Duration(g.TTL)*time.Second, c.cfg.FenceMargin)
	l.term = g.ResponseHeader.GetRaftTerm()
	c.log.Debug("catalog lease granted", l.attr(), "ttl", time.Duration(g.TTL)*time.Second,
		"fence_margin", c.cfg.FenceMargin, "renew_every", renewInterval(c.cfg.LeaseTTL, c.cfg.FenceMargin),
		"renew_attempt_timeout", renewAttemptTimeout(c.cfg.LeaseTTL, c.cfg.FenceMargin, c.cfg.RequestTimeout))
	return l, nil
}

// grantLease asks etcd for a lease of LeaseTTL and returns the answer and
// when the request was sent (the origin of its fence deadline).
func (c *Catalog) grantLease(ctx context.Context) (*clientv3.LeaseGrantResponse, time.Time, error) {
	gctx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
	defer cancel()
	sent := time.Now()
	g, err := c.client.Grant(clientv3.WithRequireLeader(gctx), int64(c.cfg.LeaseTTL/time.Second))
	if err != nil {
		return nil, sent, fmt.Errorf("grant lease: %w", err)
	}
	return g, sent, nil
}

// revoke revokes lease id; one etcd no longer holds is no error.
func (c *Catalog) revoke(ctx context.Context, id clientv3.LeaseID) error {
	rctx, cancel := c.writeCtx(ctx)
	defer cancel()
	if _, err := c.client.Revoke(rctx, id); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return err
	}
	return nil
}

// revokePrevious revokes the lease of the record this node's name has in
// the store, if any: at Open, before this process has a lease, such a
// record is a previous incarnation's.
//
// Node names are unique by configuration, and an embedded member's data
// directory cannot be opened by two processes, so that incarnation is a
// process that died (or a node of the same name started by mistake: its
// next renewal finds its lease gone and it fences).
func (c *Catalog) revokePrevious(ctx context.Context) error {
	kv, err := c.getKey(ctx, NodeKey(c.cfg.Name))
	if err != nil {
		return fmt.Errorf("read previous node record: %w", err)
	}
	if kv == nil || kv.Lease == 0 {
		return nil
	}
	prev := clientv3.LeaseID(kv.Lease)
	if err := c.revoke(ctx, prev); err != nil {
		return fmt.Errorf("revoke previous incarnation's lease %x: %w", int64(prev), err)
	}
	inc := ""
	if n, err := parseNode(c.cfg.Name, kv.Value); err == nil {
		inc = n.Incarnation
	}
	c.log.Info("catalog: revoked a previous incarnation's lease; its records are gone", "lease", fmt.Sprintf("%x", int64(prev)), "incarnation", inc)
	return nil
}
