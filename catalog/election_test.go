package catalog_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/switchyard/switchyard/catalog"
	"github.com/switchyard/switchyard/core"
)

// cluster opens n catalogs on one embedded etcd: node-a embeds it, node-b…
// are its clients through Endpoints. Every node publishes an Online node
// record, and cluster returns once every view has every node Online.
func cluster(t *testing.T, n int) []*catalog.Catalog {
	t.Helper()
	a := open(t, embeddedConfig(t, "node-a"))
	cs := []*catalog.Catalog{a}
	for i := 1; i < n; i++ {
		cs = append(cs, open(t, catalog.Config{
			Name:      fmt.Sprintf("node-%c", 'a'+i),
			Endpoints: []string{"https://" + a.ClientAddr()},
			LeaseTTL:  2 * time.Second,
		}))
	}
	for _, c := range cs {
		setState(t, c, core.StateOnline)
	}
	for _, c := range cs {
		for _, other := range cs {
			waitNodeState(t, c, other.Name(), core.StateOnline)
		}
	}
	return cs
}

func setState(t *testing.T, c *catalog.Catalog, s core.PeerState) {
	t.Helper()
	if err := c.PublishNode(context.Background(), core.NodeInfo{State: s}); err != nil {
		t.Fatalf("%s.PublishNode(%s): %v", c.Name(), s, err)
	}
}

func waitNodeState(t *testing.T, c *catalog.Catalog, node string, s core.PeerState) {
	t.Helper()
	eventually(t, 2*time.Second, fmt.Sprintf("%s sees %s %s", c.Name(), node, s), func() bool {
		n, ok := c.Node(node)
		return ok && n.State == s
	})
}

// addConsumer publishes a consumer of queue on c and waits until every
// catalog in seers has it in its view.
func addConsumer(t *testing.T, c *catalog.Catalog, queue, id string, seers ...*catalog.Catalog) {
	t.Helper()
	if err := c.PublishConsumer(context.Background(), core.ConsumerInfo{ID: id, Queue: queue}); err != nil {
		t.Fatalf("%s.PublishConsumer(%s/%s): %v", c.Name(), queue, id, err)
	}
	for _, s := range append(seers, c) {
		eventually(t, 2*time.Second, fmt.Sprintf("%s sees consumer %s/%s", s.Name(), queue, id), func() bool {
			for _, ci := range s.Consumers(queue) {
				if ci.ID == id && ci.Node == c.Name() {
					return true
				}
			}
			return false
		})
	}
}

func elect(t *testing.T, c *catalog.Catalog, queue string, claim catalog.Claim) core.DispatchInfo {
	t.Helper()
	d, err := c.Elect(context.Background(), queue, claim)
	if err != nil {
		t.Fatalf("%s.Elect(%s, %s): %v", c.Name(), queue, claim, err)
	}
	if d.Epoch == 0 {
		t.Fatalf("%s.Elect(%s, %s) = %+v: no epoch", c.Name(), queue, claim, d)
	}
	return sansEpoch(d)
}

// sansEpoch is d without its epoch, for comparing records by content.
func sansEpoch(d core.DispatchInfo) core.DispatchInfo {
	d.Epoch = 0
	return d
}

// stored reads queue's dispatch record straight from etcd; nil if absent.
func stored(t *testing.T, c *catalog.Catalog, queue string) *mvccpb.KeyValue {
	t.Helper()
	resp, err := c.Client().Get(context.Background(), catalog.DispatchKey(queue))
	if err != nil {
		t.Fatalf("get %s: %v", catalog.DispatchKey(queue), err)
	}
	if len(resp.Kvs) == 0 {
		return nil
	}
	return resp.Kvs[0]
}

// storedDispatch parses the stored record, failing the test if there is none.
func storedDispatch(t *testing.T, c *catalog.Catalog, queue string) (core.DispatchInfo, *mvccpb.KeyValue) {
	t.Helper()
	kv := stored(t, c, queue)
	if kv == nil {
		t.Fatalf("no dispatch record for %s", queue)
	}
	d, err := catalog.ParseDispatch(kv.Value)
	if err != nil {
		t.Fatalf("stored record %s: %v", kv.Value, err)
	}
	d.Epoch = uint64(kv.ModRevision)
	return d, kv
}

// putRaw writes a dispatch record value as is, under lease (0: none).
func putRaw(t *testing.T, c *catalog.Catalog, queue, value string, lease clientv3.LeaseID) {
	t.Helper()
	var opts []clientv3.OpOption
	if lease != 0 {
		opts = append(opts, clientv3.WithLease(lease))
	}
	if _, err := c.Client().Put(context.Background(), catalog.DispatchKey(queue), value, opts...); err != nil {
		t.Fatalf("put %s: %v", catalog.DispatchKey(queue), err)
	}
}

// wantClaimedBy checks that the stored record is d and is attached to
// owner's lease.
func wantClaimedBy(t *testing.T, owner *catalog.Catalog, queue string, d core.DispatchInfo) *mvccpb.KeyValue {
	t.Helper()
	got, kv := storedDispatch(t, owner, queue)
	if d.Epoch == 0 {
		got = sansEpoch(got)
	}
	if got != d {
		t.Fatalf("stored record for %s = %+v, want %+v (an epoch, when wanted, is the record's revision)", queue, got, d)
	}
	if clientv3.LeaseID(kv.Lease) != owner.LeaseID() {
		t.Fatalf("record for %s on lease %x, want %s's lease %x", queue, kv.Lease, owner.Name(), owner.LeaseID())
	}
	return kv
}

func TestElectUnclaimedProducerClaims(t *testing.T) {
	cs := cluster(t, 2)
	a, b := cs[0], cs[1]
	want := core.DispatchInfo{Dispatcher: "node-a"}
	if d := elect(t, a, "jobs", catalog.ClaimProducer); d != want {
		t.Fatalf("Elect = %+v, want %+v", d, want)
	}
	kv := wantClaimedBy(t, a, "jobs", want)
	if kv.Version != 1 {
		t.Fatalf("record version %d, want 1", kv.Version)
	}
	for _, c := range cs {
		eventually(t, 2*time.Second, c.Name()+" sees the claim", func() bool { d, ok := c.Dispatch("jobs"); return ok && sansEpoch(d) == want })
	}
	// Electing again changes nothing, for either claim.
	for _, claim := range []catalog.Claim{catalog.ClaimProducer, catalog.ClaimConsumer} {
		if d := elect(t, a, "jobs", claim); d != want {
			t.Fatalf("a re-Elect(%s) = %+v", claim, d)
		}
	}
	if kv := stored(t, b, "jobs"); kv.Version != 1 {
		t.Fatalf("record rewritten by a repeated election: version %d", kv.Version)
	}
}

func TestElectProducerAdoptsLiveRecord(t *testing.T) {
	cs := cluster(t, 3)
	a, b, c := cs[0], cs[1], cs[2]
	want := core.DispatchInfo{Dispatcher: "node-b"}
	if d := elect(t, b, "jobs", catalog.ClaimProducer); d != want {
		t.Fatalf("b.Elect = %+v", d)
	}
	// A producer-only node adopts the record even though node-b hosts no
	// consumer: only a consumer's node takes over.
	for _, p := range []*catalog.Catalog{a, c} {
		if d := elect(t, p, "jobs", catalog.ClaimProducer); d != want {
			t.Fatalf("%s.Elect(producer) = %+v, want %+v", p.Name(), d, want)
		}
	}
	if kv := wantClaimedBy(t, b, "jobs", want); kv.Version != 1 {
		t.Fatalf("record version %d after adoptions, want 1", kv.Version)
	}
}

func TestElectConsumerTakesOverFromNonHost(t *testing.T) {
	cs := cluster(t, 3)
	a, b, c := cs[0], cs[1], cs[2]
	if d := elect(t, a, "jobs", catalog.ClaimProducer); d.Dispatcher != "node-a" {
		t.Fatalf("a.Elect = %+v", d)
	}
	// node-a hosts a consumer of another queue only: it does not count.
	addConsumer(t, a, "other", "wa", b)
	addConsumer(t, b, "jobs", "wb", a, c)
	want := core.DispatchInfo{Dispatcher: "node-b"}
	if d := elect(t, b, "jobs", catalog.ClaimConsumer); d != want {
		t.Fatalf("b.Elect(consumer) over a non-hosting dispatcher = %+v, want %+v", d, want)
	}
	wantClaimedBy(t, b, "jobs", want)
	// Now the dispatcher hosts a consumer: a producer adopts it, and so
	// does a node that hosts another consumer of the queue.
	if d := elect(t, a, "jobs", catalog.ClaimProducer); d != want {
		t.Fatalf("a.Elect(producer) = %+v", d)
	}
	addConsumer(t, c, "jobs", "wc", b)
	if d := elect(t, c, "jobs", catalog.ClaimConsumer); d != want {
		t.Fatalf("c.Elect(consumer) = %+v, want b's record to stand", d)
	}
	// Once node-b's consumer leaves, node-c takes over.
	if err := b.WithdrawConsumer(context.Background(), "jobs", "wb"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "c sees wb withdrawn", func() bool { return len(c.Consumers("jobs")) == 1 })
	if d := elect(t, c, "jobs", catalog.ClaimConsumer); d.Dispatcher != "node-c" {
		t.Fatalf("c.Elect(consumer) after b's consumer left = %+v, want node-c", d)
	}
}

func TestElectConsumerLeavesDispatcherHostingConsumer(t *testing.T) {
	cs := cluster(t, 2)
	a, b := cs[0], cs[1]
	addConsumer(t, a, "jobs", "wa", b)
	want := core.DispatchInfo{Dispatcher: "node-a"}
	if d := elect(t, a, "jobs", catalog.ClaimConsumer); d != want {
		t.Fatalf("a.Elect(consumer) = %+v", d)
	}
	addConsumer(t, b, "jobs", "wb", a)
	// Two consumers on two nodes: the first stays.
	if d := elect(t, b, "jobs", catalog.ClaimConsumer); d != want {
		t.Fatalf("b.Elect(consumer) = %+v, want a's record to stand", d)
	}
	if kv := wantClaimedBy(t, a, "jobs", want); kv.Version != 1 {
		t.Fatalf("record version %d, want 1", kv.Version)
	}
}

func TestElectVoidRecordReelected(t *testing.T) {
	cs := cluster(t, 3)
	a, b, c := cs[0], cs[1], cs[2]
	// node-c ends up Spare: a record naming it is void.
	setState(t, c, core.StateSpare)
	waitNodeState(t, a, "node-c", core.StateSpare)
	waitNodeState(t, b, "node-c", core.StateSpare)
	// node-x is a node that is not in the catalog at all; node-p one that is
	// joining.
	if _, err := a.Client().Put(context.Background(), catalog.NodeKey("node-p"), `{"v":1,"state":"in_progress"}`); err != nil {
		t.Fatal(err)
	}
	waitNodeState(t, a, "node-p", core.StateInProgress)
	waitNodeState(t, b, "node-p", core.StateInProgress)

	for _, named := range []string{"node-x", "node-c", "node-p"} {
		for _, claim := range []catalog.Claim{catalog.ClaimProducer, catalog.ClaimConsumer} {
			for _, elector := range []*catalog.Catalog{a, b} {
				q := fmt.Sprintf("q-%s-%s-%s", named, claim, elector.Name())
				putRaw(t, a, q, fmt.Sprintf(`{"v":1,"dispatcher":%q}`, named), 0)
				want := core.DispatchInfo{Dispatcher: elector.Name()}
				if d := elect(t, elector, q, claim); d != want {
					t.Errorf("%s.Elect(%s) over a record naming %s = %+v, want %+v", elector.Name(), claim, named, d, want)
					continue
				}
				wantClaimedBy(t, elector, q, want)
			}
		}
	}
	// A record that is not a record at all is void too.
	putRaw(t, a, "garbage", `{"dispatcher":`, 0)
	if d := elect(t, b, "garbage", catalog.ClaimProducer); d.Dispatcher != "node-b" {
		t.Fatalf("Elect over garbage = %+v", d)
	}
}

func TestElectLegacyBareRecord(t *testing.T) {
	cs := cluster(t, 3)
	a, b, c := cs[0], cs[1], cs[2]

	// A bare id naming an Online node stands against a producer, and is
	// left as it was written.
	putRaw(t, a, "live", "node-b", 0)
	if d := elect(t, a, "live", catalog.ClaimProducer); d != (core.DispatchInfo{Dispatcher: "node-b"}) {
		t.Fatalf("Elect over a live bare record = %+v", d)
	}
	if kv := stored(t, a, "live"); string(kv.Value) != "node-b" || kv.Version != 1 {
		t.Fatalf("live bare record rewritten: %q version %d", kv.Value, kv.Version)
	}
	// …and against a consumer whose dispatcher hosts a consumer (the JSON
	// string form of a bare id, too).
	putRaw(t, a, "hosted", `"node-b"`, 0)
	addConsumer(t, b, "hosted", "wb", c)
	addConsumer(t, c, "hosted", "wc")
	if d := elect(t, c, "hosted", catalog.ClaimConsumer); d != (core.DispatchInfo{Dispatcher: "node-b"}) {
		t.Fatalf("Elect(consumer) over a bare record naming a host = %+v", d)
	}
	// A consumer takes over a bare record naming a non-host.
	putRaw(t, a, "unhosted", "node-b", 0)
	addConsumer(t, c, "unhosted", "wc")
	if d := elect(t, c, "unhosted", catalog.ClaimConsumer); d != (core.DispatchInfo{Dispatcher: "node-c"}) {
		t.Fatalf("Elect(consumer) over a bare record naming a non-host = %+v", d)
	}
	wantClaimedBy(t, c, "unhosted", core.DispatchInfo{Dispatcher: "node-c"})
	// A bare id naming a node that is gone is void.
	putRaw(t, a, "dead", "node-x", 0)
	if d := elect(t, b, "dead", catalog.ClaimProducer); d != (core.DispatchInfo{Dispatcher: "node-b"}) {
		t.Fatalf("Elect over a void bare record = %+v", d)
	}
	// Re-elected records are written in the current format.
	if kv := stored(t, a, "dead"); kv.Value[0] != '{' {
		t.Fatalf("re-elected record written as %q, want versioned JSON", kv.Value)
	}
}

func TestElectPreservesReplyToAndZone(t *testing.T) {
	cs := cluster(t, 2)
	a, b := cs[0], cs[1]
	link := `{"v":1,"dispatcher":%q,"reply_to":"replies","zone":"z1","future":1}`

	// Void: the dispatcher is gone.
	putRaw(t, a, "void", fmt.Sprintf(link, "node-x"), 0)
	want := core.DispatchInfo{Dispatcher: "node-a", ReplyTo: "replies", Zone: "z1"}
	if d := elect(t, a, "void", catalog.ClaimProducer); d != want {
		t.Fatalf("re-election of a void record = %+v, want %+v", d, want)
	}
	wantClaimedBy(t, a, "void", want)

	// Takeover from a live dispatcher hosting no consumer.
	putRaw(t, b, "taken", fmt.Sprintf(link, "node-b"), b.LeaseID())
	addConsumer(t, a, "taken", "wa")
	if d := elect(t, a, "taken", catalog.ClaimConsumer); d != want {
		t.Fatalf("takeover = %+v, want %+v", d, want)
	}
	wantClaimedBy(t, a, "taken", want)
	eventually(t, 2*time.Second, "b sees the takeover", func() bool { d, ok := b.Dispatch("taken"); return ok && sansEpoch(d) == want })

	// The dispatcher's record vanishing with its lease takes the link with
	// it: an unclaimed queue has nothing to preserve.
	if err := a.Release(context.Background(), "taken"); err != nil {
		t.Fatal(err)
	}
	if d := elect(t, b, "taken", catalog.ClaimProducer); d != (core.DispatchInfo{Dispatcher: "node-b"}) {
		t.Fatalf("Elect of a released queue = %+v", d)
	}
}

// TestElectOwnRecordMovedOntoLease: a record naming this node that is not on
// its lease (written by an older node, say) stands, but is rewritten onto the
// lease so that it goes with the node.
func TestElectOwnRecordMovedOntoLease(t *testing.T) {
	cs := cluster(t, 2)
	a, b := cs[0], cs[1]
	putRaw(t, a, "jobs", `{"v":1,"dispatcher":"node-b","reply_to":"r"}`, 0)
	want := core.DispatchInfo{Dispatcher: "node-b", ReplyTo: "r"}
	if d := elect(t, b, "jobs", catalog.ClaimProducer); d != want {
		t.Fatalf("Elect = %+v", d)
	}
	kv := wantClaimedBy(t, b, "jobs", want)
	if d := elect(t, b, "jobs", catalog.ClaimConsumer); d != want {
		t.Fatalf("second Elect = %+v", d)
	}
	if again := stored(t, a, "jobs"); again.ModRevision != kv.ModRevision {
		t.Fatal("a record already on the lease was rewritten")
	}
}

// TestElectRace: nodes electing at once on a fresh queue agree on one
// dispatcher, and exactly one of them wrote the record.
func TestElectRace(t *testing.T) {
	const n, rounds = 5, 8
	// The racers are all etcd clients over the network: node-a, whose
	// in-process client skips the network, would win every race.
	all := cluster(t, n+1)
	cs := all[1:]
	race := func(queue string, claims []catalog.Claim) []core.DispatchInfo {
		t.Helper()
		got := make([]core.DispatchInfo, n)
		errs := make([]error, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i, c := range cs {
			wg.Go(func() {
				<-start
				got[i], errs[i] = c.Elect(context.Background(), queue, claims[i])
			})
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("%s.Elect(%s, %s): %v", cs[i].Name(), queue, claims[i], err)
			}
		}
		return got
	}
	same := func(claim catalog.Claim) []catalog.Claim {
		out := make([]catalog.Claim, n)
		for i := range out {
			out[i] = claim
		}
		return out
	}
	byName := map[string]*catalog.Catalog{}
	for _, c := range cs {
		byName[c.Name()] = c
	}

	for _, claim := range []catalog.Claim{catalog.ClaimProducer, catalog.ClaimConsumer} {
		for r := range rounds {
			q := fmt.Sprintf("race-%s-%d", claim, r)
			if claim == catalog.ClaimConsumer {
				for _, c := range cs {
					addConsumer(t, c, q, "w-"+c.Name(), all...)
				}
			}
			got := race(q, same(claim))
			for i, d := range got {
				if d != got[0] {
					t.Fatalf("%s: %s elected %+v, %s elected %+v", q, cs[0].Name(), got[0], cs[i].Name(), d)
				}
			}
			winner := byName[got[0].Dispatcher]
			if winner == nil {
				t.Fatalf("%s: elected %q, not one of the nodes", q, got[0].Dispatcher)
			}
			if kv := wantClaimedBy(t, winner, q, got[0]); kv.Version != 1 {
				t.Fatalf("%s: record version %d, want exactly one write", q, kv.Version)
			}
		}
	}

	// Mixed: nodes b, d, f host consumers, c and e only produce. A producer
	// may get in first, but the consumers' nodes then agree on one of them,
	// and no consumer's node is displaced.
	hosts := map[string]bool{"node-b": true, "node-d": true, "node-f": true}
	claims := make([]catalog.Claim, n)
	for i, c := range cs {
		claims[i] = catalog.ClaimProducer
		if hosts[c.Name()] {
			claims[i] = catalog.ClaimConsumer
		}
	}
	for r := range rounds {
		q := fmt.Sprintf("race-mixed-%d", r)
		for _, c := range cs {
			if hosts[c.Name()] {
				addConsumer(t, c, q, "w-"+c.Name(), all...)
			}
		}
		got := race(q, claims)
		final, kv := storedDispatch(t, cs[0], q)
		if !hosts[final.Dispatcher] {
			t.Fatalf("%s: final dispatcher %s hosts no consumer", q, final.Dispatcher)
		}
		if kv.Version > 2 {
			t.Fatalf("%s: record written %d times, want at most one producer claim and one takeover", q, kv.Version)
		}
		for i, d := range got {
			switch {
			case claims[i] == catalog.ClaimConsumer && d != final:
				t.Fatalf("%s: consumer node %s elected %+v, final record %+v", q, cs[i].Name(), d, final)
			case claims[i] == catalog.ClaimProducer && d != final && hosts[d.Dispatcher]:
				t.Fatalf("%s: producer node %s elected %+v, neither the final record %+v nor a producer's", q, cs[i].Name(), d, final)
			}
		}
	}
}

func TestRelease(t *testing.T) {
	cs := cluster(t, 2)
	a, b := cs[0], cs[1]
	ctx := context.Background()
	elect(t, a, "jobs", catalog.ClaimProducer)
	before := stored(t, a, "jobs")
	if err := b.Release(ctx, "jobs"); err != nil {
		t.Fatalf("b.Release of a's record: %v", err)
	}
	if kv := stored(t, a, "jobs"); kv == nil || kv.ModRevision != before.ModRevision {
		t.Fatal("b.Release deleted or changed a's record")
	}
	if err := a.Release(ctx, "jobs"); err != nil {
		t.Fatalf("a.Release: %v", err)
	}
	if kv := stored(t, a, "jobs"); kv != nil {
		t.Fatalf("record %q survived its owner's Release", kv.Value)
	}
	eventually(t, 2*time.Second, "b sees the release", func() bool { _, ok := b.Dispatch("jobs"); return !ok })
	if err := a.Release(ctx, "jobs"); err != nil {
		t.Fatalf("Release of an absent record: %v", err)
	}

	// A late Release from the node that was taken over from leaves the new
	// dispatcher alone; so does one for a record written without a lease.
	elect(t, a, "moved", catalog.ClaimProducer)
	addConsumer(t, b, "moved", "wb")
	elect(t, b, "moved", catalog.ClaimConsumer)
	if err := a.Release(ctx, "moved"); err != nil {
		t.Fatal(err)
	}
	if d, _ := storedDispatch(t, a, "moved"); d.Dispatcher != "node-b" {
		t.Fatalf("record after a's late Release = %+v", d)
	}
	putRaw(t, a, "unleased", "node-a", 0)
	if err := a.Release(ctx, "unleased"); err != nil {
		t.Fatal(err)
	}
	if stored(t, a, "unleased") == nil {
		t.Fatal("Release deleted a record not on this node's lease")
	}
	if err := a.Release(ctx, "a/b"); err == nil {
		t.Fatal("Release of an invalid queue name = nil error")
	}
}

// TestDispatchRecordGoesWithLease: a dispatcher that stops takes its record
// with it, and the queue is unclaimed again.
func TestDispatchRecordGoesWithLease(t *testing.T) {
	cs := cluster(t, 2)
	a, b := cs[0], cs[1]
	want := core.DispatchInfo{Dispatcher: "node-b"}
	if d := elect(t, b, "jobs", catalog.ClaimProducer); d != want {
		t.Fatalf("b.Elect = %+v", d)
	}
	eventually(t, 2*time.Second, "a sees b's claim", func() bool { d, ok := a.Dispatch("jobs"); return ok && sansEpoch(d) == want })
	if err := b.Close(context.Background()); err != nil {
		t.Fatalf("b.Close: %v", err)
	}
	took := eventually(t, time.Second, "b's dispatch record gone from a's view", func() bool { _, ok := a.Dispatch("jobs"); return !ok })
	t.Logf("dispatch record left a's view %v after b closed (lease TTL 2s)", took.Round(time.Millisecond))
	if kv := stored(t, a, "jobs"); kv != nil {
		t.Fatalf("record %q still stored after its lease was revoked", kv.Value)
	}
	if d := elect(t, a, "jobs", catalog.ClaimProducer); d != (core.DispatchInfo{Dispatcher: "node-a"}) {
		t.Fatalf("a.Elect after b left = %+v", d)
	}
	if _, err := b.Elect(context.Background(), "other", catalog.ClaimConsumer); !errors.Is(err, catalog.ErrLeaseLost) {
		t.Fatalf("Elect on a closed catalog = %v, want ErrLeaseLost", err)
	}
	if stored(t, a, "other") != nil {
		t.Fatal("a closed catalog claimed a queue")
	}
}

func TestElectRejectsBadInput(t *testing.T) {
	a := cluster(t, 1)[0]
	ctx := context.Background()
	if _, err := a.Elect(ctx, "a/c/b", catalog.ClaimProducer); err == nil {
		t.Error("Elect of an invalid queue name = nil error")
	}
	if _, err := a.Elect(ctx, "jobs", catalog.Claim(7)); err == nil {
		t.Error("Elect with an unknown claim = nil error")
	}
	if stored(t, a, "jobs") != nil {
		t.Error("a rejected Elect wrote a record")
	}
	if got := catalog.Claim(7).String(); got != "Claim(7)" {
		t.Errorf("Claim(7).String() = %q", got)
	}
}

// TestElectViewLagDoesNotVoidLiveRecord: a node's record, its consumer and
// its claim written together and elected over at once, before the elector's
// view can have caught up. Whether or not the view has, the claim stands:
// what the view says against a record is confirmed in the store first.
func TestElectViewLagDoesNotVoidLiveRecord(t *testing.T) {
	b := cluster(t, 2)[1] // over the network, so its view trails the store
	ctx := context.Background()
	for i := range 30 {
		node := fmt.Sprintf("node-x%d", i)
		q := fmt.Sprintf("lag-%d", i)
		if _, err := b.Client().Txn(ctx).Then(
			clientv3.OpPut(catalog.NodeKey(node), `{"v":1,"state":"online"}`),
			clientv3.OpPut(catalog.ConsumerKey(q, "w"), fmt.Sprintf(`{"v":1,"node":%q,"capabilities":[]}`, node)),
			clientv3.OpPut(catalog.DispatchKey(q), node),
		).Commit(); err != nil {
			t.Fatal(err)
		}
		_, seen := b.Node(node)
		claim := catalog.ClaimProducer
		if i%2 == 1 {
			claim = catalog.ClaimConsumer
		}
		if d := elect(t, b, q, claim); d.Dispatcher != node {
			t.Fatalf("Elect(%s) over a live record naming %s (in view before: %v) = %+v", claim, node, seen, d)
		}
	}
}

// Every claim carries an epoch, the revision that wrote the record: the
// claimer knows it at once (Dispatch answers with its own claim before its
// view does), every view learns it from the watch, and a takeover of a
// record naming a node this node cannot reach (suspected: SetReachable)
// gets a greater one.
func TestElectEpochsGrowAcrossTakeover(t *testing.T) {
	cs := cluster(t, 3)
	a, b, c := cs[0], cs[1], cs[2]
	first, err := a.Elect(context.Background(), "jobs", catalog.ClaimProducer)
	if err != nil || first.Dispatcher != "node-a" || first.Epoch == 0 {
		t.Fatalf("a.Elect = %+v, %v; want node-a with an epoch", first, err)
	}
	if d, ok := a.Dispatch("jobs"); !ok || d != first {
		t.Fatalf("a.Dispatch right after its claim = %+v, %v; want %+v", d, ok, first)
	}
	if _, kv := storedDispatch(t, a, "jobs"); uint64(kv.ModRevision) != first.Epoch {
		t.Fatalf("epoch %d, record's revision %d", first.Epoch, kv.ModRevision)
	}
	for _, n := range []*catalog.Catalog{b, c} {
		eventually(t, 2*time.Second, n.Name()+" sees the epoch", func() bool { d, ok := n.Dispatch("jobs"); return ok && d == first })
	}
	// b suspects a: the record is void to it, and it claims.
	b.SetReachable(func(node string) bool { return node != "node-a" })
	second, err := b.Elect(context.Background(), "jobs", catalog.ClaimProducer)
	if err != nil || second.Dispatcher != "node-b" || second.Epoch <= first.Epoch {
		t.Fatalf("b.Elect over a suspected dispatcher = %+v, %v; want node-b with an epoch above %d", second, err, first.Epoch)
	}
	// c, which reaches a, adopts b's record as it stands, epoch and all.
	if got, err := c.Elect(context.Background(), "jobs", catalog.ClaimProducer); err != nil || got != second {
		t.Fatalf("c.Elect = %+v, %v; want %+v", got, err, second)
	}
	eventually(t, 2*time.Second, "a sees the takeover", func() bool { d, ok := a.Dispatch("jobs"); return ok && d == second })
	// An own claim the view has overtaken is forgotten: a release deletes
	// the record, and no stale claim answers for it.
	if err := b.Release(context.Background(), "jobs"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "b sees the release", func() bool { _, ok := b.Dispatch("jobs"); return !ok })
}
