package catalog_test

import (
	"context"
	"testing"
	"time"

	"github.com/switchyard/switchyard/catalog"
	"github.com/switchyard/switchyard/core"
)

// TestOpenRevokesPreviousIncarnation: a node's process dies without
// revoking its lease (its member stopped abruptly) and is started again on
// its data directory, inside that lease. The new process does not wait for
// the old lease: Open revokes it, so the old process's records (here a
// consumer it registered) are gone at once, and the node record it
// publishes carries a new incarnation.
func TestOpenRevokesPreviousIncarnation(t *testing.T) {
	cfg := embeddedConfig(t, "node-a")
	cfg.LeaseTTL = 30 * time.Second // far longer than the test: only a revoke removes its records
	ctx := context.Background()
	first, err := catalog.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	setState(t, first, core.StateOnline)
	if err := first.PublishConsumer(ctx, core.ConsumerInfo{ID: "old", Queue: "jobs"}); err != nil {
		t.Fatal(err)
	}
	was := first.Incarnation()
	catalog.CrashMember(first)
	_ = first.Close(ctx) // its revoke fails: the member is stopped

	start := time.Now()
	again := open(t, cfg)
	took := time.Since(start)
	if again.Incarnation() == was {
		t.Fatalf("incarnation %s kept across a restart", was)
	}
	if ok, _ := getLinearizable(t, again, catalog.ConsumerKey("jobs", "old")); ok {
		t.Fatal("the previous incarnation's consumer record survived the restart")
	}
	if ok, _ := getLinearizable(t, again, catalog.NodeKey("node-a")); ok {
		t.Fatal("the previous incarnation's node record survived the restart")
	}
	setState(t, again, core.StateOnline)
	eventually(t, 2*time.Second, "the new incarnation in the view", func() bool {
		n, ok := again.Node("node-a")
		return ok && n.Incarnation == again.Incarnation()
	})
	t.Logf("restarted inside a 30s lease: open took %v; incarnation %s → %s", took.Round(time.Millisecond), was, again.Incarnation())
}

// TestRecoverNoopWhileLeaseHolds: Recover does nothing to a lease that is
// not lost.
func TestRecoverNoopWhileLeaseHolds(t *testing.T) {
	c := open(t, embeddedConfig(t, "node-a"))
	id, inc := c.LeaseID(), c.Incarnation()
	if err := c.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	if c.LeaseID() != id || c.Incarnation() != inc || !c.LeaseValid() {
		t.Fatal("Recover changed a lease that holds")
	}
}
