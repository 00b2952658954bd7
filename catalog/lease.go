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

	"github.com/switchyard/switchyard/internal/chans"
)

// ErrLeaseLost is returned by writes once the node has treated its lease as
// lost (see Catalog.LeaseLost). The Catalog cannot recover from it: its
// owner closes it and opens a new one, which holds a new lease.
var ErrLeaseLost = errors.New("catalog: lease lost")

// FenceDeadline returns the instant from which a node must treat its lease
// as lost: renewSent + ttl - margin, where renewSent is the local time at
// which the keepalive that last renewed the lease was sent.
//
// Why this is safe: etcd computes a lease's expiry from the moment its
// leader handles the renewal (now + the TTL it reports back, which is the
// ttl to pass here), and that moment is after the client sent it, so the
// lease cannot expire anywhere before renewSent + ttl. A leader change only
// pushes expiry later. Fencing margin before that instant leaves room for
// what the arithmetic does not see: the two machines' clocks running at
// slightly different rates, the time between this deadline passing and the
// fenced node actually stopping its work (cancelling bound jobs, refusing
// output), and scheduling delays. With the default margin of ttl/3 a 5s
// lease fences 3.33s after the last renewal was sent, 1.67s before the
// earliest possible expiry. Times from time.Now carry a monotonic reading,
// so wall-clock jumps do not move the deadline.
//
// A negative margin is treated as zero (fencing later than the earliest
// possible expiry would defeat the point), and a margin of ttl or more
// fences at renewSent.
func FenceDeadline(renewSent time.Time, ttl, margin time.Duration) time.Time {
	if margin < 0 {
		margin = 0
	}
	if margin >= ttl {
		return renewSent
	}
	return renewSent.Add(ttl - margin)
}

// renewInterval is how often the lease is renewed: a quarter of the time
// between a renewal and its fence deadline (TTL-FenceMargin), so that when
// a renewal falls due just as the catalog stops answering (its etcd leader
// lost, and the others electing a new one) three quarters of that time are
// left to retry before the node fences. With the default margin (TTL/3) it
// is TTL/6: 1s for a 6s lease. The arithmetic is in docs/cluster.md,
// "The catalog's own leader election".
func renewInterval(ttl, margin time.Duration) time.Duration {
	return (ttl - margin) / 4
}

// renewAttemptTimeout bounds one renewal attempt: an eighth of
// TTL-FenceMargin, at least minRenewAttempt and at most RequestTimeout.
// A renewal that reaches a member whose leader is gone (partitioned, not
// crashed, so nothing answers with a reset) is forwarded to that leader and
// hangs until its deadline; one attempt must therefore not eat the retry
// budget, and the next attempt, sent once the members have elected a new
// leader, goes through at once (etcd's new leader extends every lease).
func renewAttemptTimeout(ttl, margin, request time.Duration) time.Duration {
	return min(max((ttl-margin)/8, minRenewAttempt), request)
}

// minRenewAttempt is the shortest renewal attempt: well above a renewal's
// round trip on a loaded machine (one forwarded HTTP call between members).
const minRenewAttempt = 200 * time.Millisecond

// renewRetryGap is the pause between a failed renewal attempt and the next.
// KeepAliveOnce itself retries "no leader" until its context ends, so an
// attempt that fails has used its whole deadline or met an error that a
// pause does not cure; the gap only keeps a fast failure from spinning.
const renewRetryGap = 50 * time.Millisecond

// lease is the node's hold on the catalog for one incarnation: the etcd
// lease its records are attached to and its fencing state. The etcd lease
// under it can change without a new incarnation (rotate.go); the
// incarnation, the fence deadline's history and the lost channel stay.
type lease struct {
	// id is the etcd lease the node's records are attached to now. It
	// changes only in rotate, under Catalog.rot; a write that attaches a
	// key to it, or compares a key's lease with it, holds Catalog.rot for
	// reading around the call.
	id          atomic.Int64
	incarnation string
	margin      time.Duration

	mu      sync.Mutex
	ttl     time.Duration // as granted or last renewed by the server
	sent    time.Time     // send time of the last successful renewal (or grant)
	fenceAt time.Time     // FenceDeadline(sent, ttl, margin)
	// term is the etcd raft term of the last answer to a grant or a
	// renewal: a greater one means etcd elected a leader since, and the
	// lease is rotated (rotate.go).
	term uint64

	lost     chan struct{}
	lostOnce sync.Once
}

// newLease is a new incarnation's lease: the incarnation is the granted
// lease's id in etcdctl's hex form. Every start and every recovery grants
// a new lease, so it is new each time, and unique in the etcd cluster.
func newLease(id clientv3.LeaseID, sent time.Time, ttl, margin time.Duration) *lease {
	l := &lease{incarnation: fmt.Sprintf("%x", int64(id)), margin: margin, lost: make(chan struct{})}
	l.id.Store(int64(id))
	l.renewed(sent, ttl)
	return l
}

// leaseID is the etcd lease the node's records are attached to now.
func (l *lease) leaseID() clientv3.LeaseID { return clientv3.LeaseID(l.id.Load()) }

// renewed records a renewal whose request was sent at sent.
func (l *lease) renewed(sent time.Time, ttl time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	// Responses can only arrive in the order their requests were sent here
	// (one renewal in flight at a time), but guard anyway: moving the
	// deadline backwards is harmless, moving it forwards on an old send
	// time is not.
	if sent.Before(l.sent) {
		return
	}
	l.sent, l.ttl = sent, ttl
	l.fenceAt = FenceDeadline(sent, ttl, l.margin)
}

// attr is the lease id as a log attribute, in etcdctl's hex form.
func (l *lease) attr() slog.Attr { return slog.String("lease", fmt.Sprintf("%x", int64(l.leaseID()))) }

func (l *lease) lastSent() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sent
}

func (l *lease) deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fenceAt
}

func (l *lease) isLost() bool { return chans.Closed(l.lost) }

// fence closes lost once and reports whether this call closed it.
func (l *lease) fence() (first bool) {
	l.lostOnce.Do(func() {
		close(l.lost)
		first = true
	})
	return first
}

// fenceLease marks l lost for reason and logs it once.
func (c *Catalog) fenceLease(l *lease, reason string) {
	if l.fence() {
		c.log.Warn("catalog lease lost: fencing", l.attr(), "reason", reason)
	}
}

// renewLoop renews l with KeepAliveOnce rather than clientv3's KeepAlive,
// because KeepAlive's channel does not tell when the renewing request was
// sent, and the send time is what bounds the lease's expiry. Each attempt
// has a short deadline of its own (renewAttemptTimeout) and a failed one is
// retried at once, until the fence deadline. It ends when ctx is done or l
// is lost. A lease fenced because it could not be renewed in time may still
// be alive in etcd; the loop then revokes it, best effort, so that the
// node's records go at once instead of lingering while nobody renews them.
func (c *Catalog) renewLoop(ctx context.Context, l *lease) {
	defer c.wg.Done()
	interval := renewInterval(c.cfg.LeaseTTL, c.cfg.FenceMargin)
	// Renewals are timed from the send time of the last one that worked
	// (the grant, at first), the same origin as the fence deadline, so a
	// slow Open or a slow renewal does not eat into the retry budget.
	t := time.NewTimer(time.Until(l.lastSent().Add(interval)))
	defer t.Stop()
	failed := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.lost:
			c.revokeAfterFence(ctx, l)
			return
		case <-t.C:
		}
		term, err := c.renewOnce(ctx, l)
		switch {
		case err == nil:
			if failed > 0 {
				c.log.Info("catalog lease renewed after failed attempts", l.attr(), "failed_attempts", failed,
					"fence_in", time.Until(l.deadline()).Round(time.Millisecond))
			}
			failed = 0
			if l.termAdvanced(term) {
				c.rotate(ctx, l, term)
			}
			t.Reset(time.Until(l.lastSent().Add(interval)))
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			// Gone already: nothing left to revoke.
			c.fenceLease(l, "lease not found on renewal")
			return
		case ctx.Err() != nil:
			return
		default:
			// Keep trying until the fence deadline; fenceLoop fences
			// when it passes. One line per outage, not per attempt.
			failed++
			if failed == 1 {
				c.log.Warn("catalog lease renewal failed; retrying", l.attr(), "err", err, "fence_in", time.Until(l.deadline()).Round(time.Millisecond))
			} else {
				c.log.Debug("catalog lease renewal failed; retrying", l.attr(), "attempt", failed, "err", err, "fence_in", time.Until(l.deadline()).Round(time.Millisecond))
			}
			t.Reset(renewRetryGap)
		}
	}
}

// renewOnce sends one keepalive and records its send time on success. It
// returns the raft term of the member that answered.
func (c *Catalog) renewOnce(ctx context.Context, l *lease) (term uint64, err error) {
	// A renewal answered after the fence deadline cannot un-fence the node,
	// so that deadline bounds the call too.
	deadline := l.deadline()
	if d := time.Now().Add(renewAttemptTimeout(c.cfg.LeaseTTL, c.cfg.FenceMargin, c.cfg.RequestTimeout)); d.Before(deadline) {
		deadline = d
	}
	// No WithRequireLeader here, unlike writes: KeepAliveOnce retries
	// "no leader" (codes.Unavailable) at once, in a tight loop, until its
	// context ends. Without it, a member with no leader holds the renewal
	// until one is elected or the attempt's deadline passes.
	cctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	sent := time.Now()
	resp, err := c.client.KeepAliveOnce(cctx, l.leaseID())
	if err != nil {
		return 0, fmt.Errorf("renew lease: %w", err)
	}
	l.renewed(sent, time.Duration(resp.TTL)*time.Second)
	return resp.ResponseHeader.GetRaftTerm(), nil
}

// revokeAfterFence revokes a lease this node has fenced, best effort.
func (c *Catalog) revokeAfterFence(ctx context.Context, l *lease) {
	rctx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
	defer cancel()
	_, err := c.client.Revoke(clientv3.WithRequireLeader(rctx), l.leaseID())
	// A cancelled ctx means Close is running; it revokes the lease itself.
	if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) && ctx.Err() == nil {
		c.log.Warn("catalog: revoke fenced lease", l.attr(), "err", err)
	}
}

// fenceLoop closes l's lost channel when the fence deadline passes without
// a renewal. It is separate from renewLoop so that a renewal call stuck
// past its context cannot delay the fence.
func (c *Catalog) fenceLoop(ctx context.Context, l *lease) {
	defer c.wg.Done()
	t := time.NewTimer(time.Until(l.deadline()))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.lost:
			return
		case <-t.C:
		}
		left := time.Until(l.deadline())
		if left <= 0 {
			c.fenceLease(l, fmt.Sprintf("not renewed within LeaseTTL-FenceMargin (%v)", c.cfg.LeaseTTL-c.cfg.FenceMargin))
			return
		}
		t.Reset(left)
	}
}
