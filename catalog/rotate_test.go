package catalog_test

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/switchyard/switchyard/catalog"
	"github.com/switchyard/switchyard/core"
)

// TestRotationOutlivesADeposedLeader: after etcd elects a leader, every
// node moves its records to a lease granted under the new term, keeps its
// incarnation, and revokes the old lease. A revoke of the old leases, as a
// leader deposed while frozen sends when it wakes (rotate.go), then deletes
// nothing: no record vanishes, no node fences, every view still holds
// every node and consumer.
func TestRotationOutlivesADeposedLeader(t *testing.T) {
	ms := startServing(t, nil)
	cs := catalogs(ms)
	type before struct {
		lease       clientv3.LeaseID
		incarnation string
	}
	was := map[string]before{}
	for _, c := range cs {
		was[c.Name()] = before{c.LeaseID(), c.Incarnation()}
	}

	leader, followers := leaderOf(t, ms)
	to := status(t, followers[0].cat).Header.MemberId
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_, err := leader.cat.Client().MoveLeader(ctx, to)
	cancel()
	if err != nil {
		t.Fatalf("move the etcd leadership from %s to %s: %v", leader.cat.Name(), followers[0].cat.Name(), err)
	}
	moved := time.Now()
	// A node rotates at its first renewal under the new term: within a
	// renewal interval (1s for the 6s lease), with room for a loaded machine.
	for _, c := range cs {
		eventually(t, 10*time.Second, c.Name()+" moves to a new lease", func() bool {
			return c.LeaseID() != was[c.Name()].lease
		})
	}
	t.Logf("every node rotated its lease within %v of the leader change", time.Since(moved).Round(time.Millisecond))

	for _, c := range cs {
		name := c.Name()
		if got := c.Incarnation(); got != was[name].incarnation {
			t.Errorf("%s: incarnation %s after the rotation, want %s unchanged", name, got, was[name].incarnation)
		}
		for _, key := range []string{catalog.NodeKey(name), catalog.ConsumerKey("jobs", "w-"+name)} {
			ok, on := getLinearizable(t, c, key)
			if !ok || on != c.LeaseID() {
				t.Errorf("%s: %s present %v on lease %x, want present on the new lease %x", name, key, ok, int64(on), int64(c.LeaseID()))
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		ttl, err := c.Client().TimeToLive(ctx, was[name].lease)
		cancel()
		if err != nil || ttl.TTL != -1 {
			t.Errorf("%s: old lease %x: TTL %v, err %v; want revoked (TTL -1)", name, int64(was[name].lease), ttl.TTL, err)
		}
	}

	// What a deposed leader would do: revoke every lease it knew.
	for _, c := range cs {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, _ = cs[0].Client().Revoke(ctx, was[c.Name()].lease)
		cancel()
	}
	// A write through every node after the revokes: it goes through on the
	// new lease, and every view has applied the revokes' revision by the
	// time it sees the write.
	for _, c := range cs {
		addConsumer(t, c, "after", "w-"+c.Name(), cs...)
	}
	for _, c := range cs {
		select {
		case <-c.LeaseLost():
			t.Fatalf("%s fenced after the old leases were revoked", c.Name())
		default:
		}
		for _, other := range cs {
			n, ok := c.Node(other.Name())
			if !ok || n.State != core.StateOnline {
				t.Errorf("%s's view: node %s %v (present %v), want online", c.Name(), other.Name(), n.State, ok)
			}
			if !hasConsumer(c, "jobs", "w-"+other.Name(), other.Name()) {
				t.Errorf("%s's view: consumer jobs/w-%s gone", c.Name(), other.Name())
			}
		}
	}
}

// TestRotationGivesWayToAStuckWrite: a write that holds the writes lock (as
// one waiting on etcd does) when etcd elects a leader delays the node's
// rotation, never its renewals. Held for longer than the fence budget (4s
// of the 6s lease), it leaves the node unfenced on its old lease; once it
// ends, the node rotates after a renewal.
func TestRotationGivesWayToAStuckWrite(t *testing.T) {
	ms := startServing(t, nil)
	leader, followers := leaderOf(t, ms)
	held := followers[1].cat
	before := held.LeaseID()
	release := catalog.HoldWrites(held)
	released := false
	defer func() {
		if !released {
			release()
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_, err := leader.cat.Client().MoveLeader(ctx, status(t, followers[0].cat).Header.MemberId)
	cancel()
	if err != nil {
		t.Fatalf("move the etcd leadership: %v", err)
	}
	budget := followers[1].cfg.LeaseTTL - followers[1].cfg.LeaseTTL/3
	time.Sleep(budget + time.Second)
	select {
	case <-held.LeaseLost():
		t.Fatalf("%s fenced while a write held its lock through an election", held.Name())
	default:
	}
	if got := held.LeaseID(); got != before {
		t.Fatalf("%s moved to lease %x while a write held the lock", held.Name(), int64(got))
	}

	release()
	released = true
	eventually(t, 10*time.Second, held.Name()+" rotates once the write ended", func() bool {
		return held.LeaseID() != before
	})
	select {
	case <-held.LeaseLost():
		t.Fatalf("%s fenced", held.Name())
	default:
	}
}
