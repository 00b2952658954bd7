package catalog_test

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/switchyard/switchyard/catalog"
	"github.com/switchyard/switchyard/core"
)

// A leaving dispatcher hands its record to another node: the record names
// the heir, keeps its link and zone, and lives on the heir's lease (the heir
// may release it, and it goes when the heir does), so it survives the
// leaver's own lease.
func TestHandOver(t *testing.T) {
	cs := cluster(t, 3)
	// a embeds etcd: b leaves, c inherits.
	a, b, c := cs[0], cs[1], cs[2]
	ctx := context.Background()
	putRaw(t, b, "jobs", `{"v":1,"dispatcher":"node-b","reply_to":"r","zone":"z1"}`, b.LeaseID())
	want := core.DispatchInfo{Dispatcher: "node-c", ReplyTo: "r", Zone: "z1"}

	moved, err := b.HandOver(ctx, "jobs", "node-c")
	if err != nil || !moved {
		t.Fatalf("HandOver = %v, %v; want true", moved, err)
	}
	wantClaimedBy(t, c, "jobs", want)
	eventually(t, 2*time.Second, "a sees the heir", func() bool { d, ok := a.Dispatch("jobs"); return ok && sansEpoch(d) == want })
	if d := elect(t, c, "jobs", catalog.ClaimConsumer); d != want {
		t.Fatalf("the heir's own election = %+v, want its record to stand", d)
	}

	// A record that is no longer the leaver's is not moved again.
	if moved, err := b.HandOver(ctx, "jobs", "node-a"); err != nil || moved {
		t.Fatalf("HandOver of c's record by b = %v, %v; want false", moved, err)
	}
	wantClaimedBy(t, c, "jobs", want)

	// The leaver goes (its lease revoked): the record stays. The heir
	// releases it: it goes.
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "b gone from a's view", func() bool { _, ok := a.Node("node-b"); return !ok })
	wantClaimedBy(t, c, "jobs", want)
	if err := c.Release(ctx, "jobs"); err != nil {
		t.Fatal(err)
	}
	if kv := stored(t, a, "jobs"); kv != nil {
		t.Fatalf("the heir's Release left %q", kv.Value)
	}
}

// HandOver moves nothing to a node that is not online, or not there, or to
// the leaver itself, and refuses bad input.
func TestHandOverRefusals(t *testing.T) {
	cs := cluster(t, 3)
	a, b, c := cs[0], cs[1], cs[2]
	ctx := context.Background()
	putRaw(t, b, "jobs", `{"v":1,"dispatcher":"node-b"}`, b.LeaseID())
	before := stored(t, a, "jobs")

	setState(t, c, core.StateDraining)
	if moved, err := b.HandOver(ctx, "jobs", "node-c"); err != nil || moved {
		t.Fatalf("HandOver to a draining node = %v, %v; want false", moved, err)
	}
	if moved, err := b.HandOver(ctx, "jobs", "node-x"); err != nil || moved {
		t.Fatalf("HandOver to an unknown node = %v, %v; want false", moved, err)
	}
	if kv := stored(t, a, "jobs"); kv.ModRevision != before.ModRevision || clientv3.LeaseID(kv.Lease) != b.LeaseID() {
		t.Fatal("a refused HandOver changed the record")
	}
	if _, err := b.HandOver(ctx, "jobs", "node-b"); err == nil {
		t.Fatal("HandOver to itself = nil error")
	}
	if _, err := b.HandOver(ctx, "a/b", "node-a"); err == nil {
		t.Fatal("HandOver of an invalid queue name = nil error")
	}
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.HandOver(ctx, "jobs", "node-a"); !errors.Is(err, catalog.ErrLeaseLost) {
		t.Fatalf("HandOver from a closed catalog = %v, want ErrLeaseLost", err)
	}
}
