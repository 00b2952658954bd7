package catalog

// This file moves a node's records to a new etcd lease after etcd elects a
// leader, so that a leader deposed while it could not run cannot delete
// them (docs/cluster.md, "A deposed etcd leader's revokes").
//
// etcd's leader alone expires leases: its lessor revokes a lease whose TTL
// passed without a renewal reaching it. A leader whose process was frozen
// (SIGSTOP, docker pause, a VM stalled) for longer than the TTL wakes still
// believing it leads, finds every lease expired in its own view (the
// renewals went to the new leader meanwhile), and revokes them. etcd checks
// its leadership first (etcd-io/etcd#15247), but skips the check when its
// raft loop ticked within the last three heartbeats, and the first tick
// after a freeze comes at once; by the time the revoke is proposed the
// member has heard from the new leader and forwards the proposal to it,
// which applies it. Every other node's records then vanish while those
// nodes are alive and renewing: they fence, their jobs end node_shutdown,
// and the deletion is taken by every peer as proof that they stopped,
// which it is not.
//
// A deposed leader can only revoke the leases it knew when it stopped. So
// each node watches the raft term in the answers to its renewals, and once
// it grows moves its records to a lease granted under the new term and
// revokes the old lease itself. The records are rewritten in place (the
// lease changes, nothing is deleted), the node keeps its incarnation and
// its fence deadline only moves later (the new lease's grant was sent after
// the last renewal). The node rotates within a renewal of the election,
// while a deposed leader needs a whole TTL without renewals before it sees
// any lease expired, so the old lease is gone, and holds nothing, by then.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// rotateBatch is how many keys one transaction moves: under etcd's default
// --max-txn-ops (128), counting a compare and a put per key.
const rotateBatch = 64

// termAdvanced records term, the raft term of an answer to a renewal, and
// reports whether it is greater than the last one seen: etcd has elected
// a leader since. The lease keeps the old term until rotate succeeds, so
// a rotation that fails is tried again at the next renewal.
func (l *lease) termAdvanced(term uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.term == 0 {
		l.term = term
		return false
	}
	return term > l.term
}

// rotate moves the node's records from l's etcd lease to a new one granted
// now, then revokes the old lease (see the top of this file). It runs in
// the renewal loop, which waits for it, so it must not cost the node its
// fence budget:
//
//   - Until it moves anything (grant, take c.rot, list the records) it gives
//     way at the time the next renewal falls due: a step that fails or is
//     still waiting then (a write holding c.rot waits on etcd for up to
//     RequestTimeout) changes nothing, the new lease is revoked, and the
//     rotation is tried again after the next renewal.
//   - The move is bounded by the fence deadline, which the node would meet
//     anyway without a renewal. One whose outcome is unknown (a call failed)
//     may have left records on either lease: the node then fences, and
//     both leases are revoked, as for any lost lease.
//
// A rotation that moved the records moves the fence deadline to the new
// lease's grant, which was sent after the last renewal.
func (c *Catalog) rotate(ctx context.Context, l *lease, term uint64) {
	start := time.Now()
	prep, cancel := context.WithDeadline(ctx, l.lastSent().Add(renewInterval(c.cfg.LeaseTTL, c.cfg.FenceMargin)))
	defer cancel()
	g, sent, err := c.grantLease(prep)
	if err != nil {
		c.log.Warn("catalog lease rotation after an etcd leader change: grant failed; retrying after the next renewal", l.attr(), "err", err)
		return
	}
	next := g.ID
	keys, old, err := c.lockRecords(prep, l)
	if err != nil {
		c.revokeBestEffort(ctx, next)
		if !errors.Is(err, ErrLeaseLost) {
			c.log.Warn("catalog lease rotation after an etcd leader change: retrying after the next renewal", l.attr(), "err", err)
		}
		return
	}
	mctx, mcancel := context.WithDeadline(ctx, l.deadline())
	moved, err := c.moveRecords(mctx, keys, old, next)
	mcancel()
	if err == nil {
		l.id.Store(int64(next))
		l.renewed(sent, time.Duration(g.TTL)*time.Second)
		l.mu.Lock()
		l.term = max(term, g.ResponseHeader.GetRaftTerm())
		l.mu.Unlock()
	}
	c.rot.Unlock()

	if err != nil {
		c.fenceLease(l, fmt.Sprintf("lease rotation failed part way: %v", err))
		c.revokeBestEffort(ctx, next)
		return
	}
	c.cfg.Metrics.rotations.Inc()
	c.revokeBestEffort(ctx, old)
	c.log.Info("catalog lease rotated after an etcd leader change", "previous", fmt.Sprintf("%x", int64(old)),
		l.attr(), "incarnation", l.incarnation, "term", term, "records", moved, "took", time.Since(start).Round(time.Millisecond))
}

// lockRecords takes c.rot for writing and lists the keys on l's etcd lease,
// giving up when ctx ends. On success the caller holds c.rot and must
// unlock it. It fails with ErrLeaseLost once l is lost: the records then go
// with the old lease.
func (c *Catalog) lockRecords(ctx context.Context, l *lease) ([][]byte, clientv3.LeaseID, error) {
	if !c.lockRotation(ctx) {
		return nil, 0, fmt.Errorf("wait for the writes in flight: %w", ctx.Err())
	}
	if l.isLost() {
		c.rot.Unlock()
		return nil, 0, ErrLeaseLost
	}
	old := l.leaseID()
	rctx, cancel := c.writeCtx(ctx)
	ttl, err := c.client.TimeToLive(rctx, old, clientv3.WithAttachedKeys())
	cancel()
	if err != nil {
		c.rot.Unlock()
		return nil, 0, fmt.Errorf("list the records on lease %x: %w", int64(old), err)
	}
	return ttl.Keys, old, nil
}

// lockRotation takes c.rot for writing unless ctx ends first. It polls
// rather than waits in Lock, which cannot be abandoned: writes are rare
// next to the polling interval.
func (c *Catalog) lockRotation(ctx context.Context) bool {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for !c.rot.TryLock() {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
	return true
}

// moveRecords rewrites keys, attached to lease from, under lease to, value
// unchanged, and returns how many it moved. A key that no longer carries
// lease from (another node claimed it, or it was deleted) is left alone.
// The caller holds c.rot, so none of this node's writes races it.
func (c *Catalog) moveRecords(ctx context.Context, keys [][]byte, from, to clientv3.LeaseID) (int, error) {
	moved := 0
	for batch := range slices.Chunk(keys, rotateBatch) {
		n, err := c.moveBatch(ctx, batch, from, to)
		moved += n
		if err != nil {
			return moved, err
		}
	}
	return moved, nil
}

// moveBatch moves keys in one transaction when they all still carry lease
// from, and one at a time otherwise.
func (c *Catalog) moveBatch(ctx context.Context, keys [][]byte, from, to clientv3.LeaseID) (int, error) {
	if ok, err := c.moveKeys(ctx, keys, from, to); ok || err != nil {
		if ok {
			return len(keys), nil
		}
		return 0, err
	}
	moved := 0
	for i := range keys {
		ok, err := c.moveKeys(ctx, keys[i:i+1], from, to)
		if err != nil {
			return moved, err
		}
		if ok {
			moved++
		}
	}
	return moved, nil
}

// moveKeys rewrites keys under lease to if every one of them carries lease
// from, and reports whether it did.
func (c *Catalog) moveKeys(ctx context.Context, keys [][]byte, from, to clientv3.LeaseID) (bool, error) {
	cmps := make([]clientv3.Cmp, len(keys))
	puts := make([]clientv3.Op, len(keys))
	for i, k := range keys {
		cmps[i] = clientv3.Compare(clientv3.LeaseValue(string(k)), "=", from)
		puts[i] = clientv3.OpPut(string(k), "", clientv3.WithIgnoreValue(), clientv3.WithLease(to))
	}
	wctx, cancel := c.writeCtx(ctx)
	defer cancel()
	resp, err := c.client.Txn(wctx).If(cmps...).Then(puts...).Commit()
	if err != nil {
		return false, fmt.Errorf("move %d records to lease %x: %w", len(keys), int64(to), err)
	}
	return resp.Succeeded, nil
}

// revokeBestEffort revokes lease id, logging a failure: a lease left
// behind expires by itself after LeaseTTL. It runs even when ctx is done
// (Close cancels the renewal that rotates), bounded by RequestTimeout.
func (c *Catalog) revokeBestEffort(ctx context.Context, id clientv3.LeaseID) {
	if err := c.revoke(context.WithoutCancel(ctx), id); err != nil {
		c.log.Warn("catalog: revoke a lease this node left; it expires by itself", "lease", fmt.Sprintf("%x", int64(id)), "err", err)
	}
}
