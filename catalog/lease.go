package catalog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
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

// renewInterval is how often the lease is renewed: half of the time between
// a renewal and its fence deadline, so that a renewal that fails leaves as
// long again for retries before the node fences. With the default margin
// (ttl/3) it is ttl/3.
func renewInterval(ttl, margin time.Duration) time.Duration {
	return (ttl - margin) / 2
}

// lease is the node's etcd lease and its fencing state.
type lease struct {
	id     clientv3.LeaseID
	margin time.Duration

	mu      sync.Mutex
	ttl     time.Duration // as granted or last renewed by the server
	sent    time.Time     // send time of the last successful renewal (or grant)
	fenceAt time.Time     // FenceDeadline(sent, ttl, margin)

	lost     chan struct{}
	lostOnce sync.Once
}

func newLease(id clientv3.LeaseID, sent time.Time, ttl, margin time.Duration) *lease {
	l := &lease{id: id, margin: margin, lost: make(chan struct{})}
	l.renewed(sent, ttl)
	return l
}

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
func (l *lease) attr() slog.Attr { return slog.String("lease", fmt.Sprintf("%x", int64(l.id))) }

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

func (l *lease) isLost() bool {
	select {
	case <-l.lost:
		return true
	default:
		return false
	}
}

// fence closes lost once and reports whether this call closed it.
func (l *lease) fence() (first bool) {
	l.lostOnce.Do(func() {
		close(l.lost)
		first = true
	})
	return first
}

// fence marks the lease lost for reason and logs it once.
func (c *Catalog) fence(reason string) {
	if c.lease.fence() {
		c.log.Warn("catalog lease lost: fencing", c.lease.attr(), "reason", reason)
	}
}

// renewLoop renews the lease with KeepAliveOnce rather than clientv3's
// KeepAlive, because KeepAlive's channel does not tell when the renewing
// request was sent, and the send time is what bounds the lease's expiry.
// It ends when ctx is done or the lease is lost. A lease fenced because it
// could not be renewed in time may still be alive in etcd; the loop then
// revokes it, best effort, so that the node's records go at once instead of
// lingering while nobody renews them.
func (c *Catalog) renewLoop(ctx context.Context) {
	defer c.wg.Done()
	interval := renewInterval(c.cfg.LeaseTTL, c.cfg.FenceMargin)
	retry := max(interval/4, 10*time.Millisecond)
	// Renewals are timed from the send time of the last one that worked
	// (the grant, at first), the same origin as the fence deadline, so a
	// slow Open or a slow renewal does not eat into the retry budget.
	t := time.NewTimer(time.Until(c.lease.lastSent().Add(interval)))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.lease.lost:
			c.revokeAfterFence(ctx)
			return
		case <-t.C:
		}
		err := c.renewOnce(ctx)
		switch {
		case err == nil:
			t.Reset(time.Until(c.lease.lastSent().Add(interval)))
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			// Gone already: nothing left to revoke.
			c.fence("lease not found on renewal")
			return
		case ctx.Err() != nil:
			return
		default:
			// Keep trying until the fence deadline; fenceLoop fences
			// when it passes.
			c.log.Warn("catalog lease renewal failed; retrying", c.lease.attr(), "err", err, "fence_in", time.Until(c.lease.deadline()).Round(time.Millisecond))
			t.Reset(retry)
		}
	}
}

// renewOnce sends one keepalive and records its send time on success.
func (c *Catalog) renewOnce(ctx context.Context) error {
	// A renewal answered after the fence deadline cannot un-fence the node,
	// so that deadline (capped by RequestTimeout) bounds the call.
	deadline := c.lease.deadline()
	if d := time.Now().Add(c.cfg.RequestTimeout); d.Before(deadline) {
		deadline = d
	}
	// No WithRequireLeader here, unlike writes: KeepAliveOnce retries
	// "no leader" (codes.Unavailable) at once, in a tight loop, until its
	// context ends. Without it, a member with no leader holds the renewal
	// until one is elected or the deadline passes, which is what we want.
	cctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	sent := time.Now()
	resp, err := c.client.KeepAliveOnce(cctx, c.lease.id)
	if err != nil {
		return fmt.Errorf("renew lease: %w", err)
	}
	c.lease.renewed(sent, time.Duration(resp.TTL)*time.Second)
	return nil
}

// revokeAfterFence revokes a lease this node has fenced, best effort.
func (c *Catalog) revokeAfterFence(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
	defer cancel()
	_, err := c.client.Revoke(clientv3.WithRequireLeader(rctx), c.lease.id)
	// A cancelled ctx means Close is running; it revokes the lease itself.
	if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) && ctx.Err() == nil {
		c.log.Warn("catalog: revoke fenced lease", c.lease.attr(), "err", err)
	}
}

// fenceLoop closes LeaseLost when the fence deadline passes without a
// renewal. It is separate from renewLoop so that a renewal call stuck past
// its context cannot delay the fence.
func (c *Catalog) fenceLoop(ctx context.Context) {
	defer c.wg.Done()
	t := time.NewTimer(time.Until(c.lease.deadline()))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.lease.lost:
			return
		case <-t.C:
		}
		left := time.Until(c.lease.deadline())
		if left <= 0 {
			c.fence(fmt.Sprintf("not renewed within LeaseTTL-FenceMargin (%v)", c.cfg.LeaseTTL-c.cfg.FenceMargin))
			return
		}
		t.Reset(left)
	}
}
