package catalog_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/switchyard/switchyard/catalog"
	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/internal/tcptest"
)

func mustCaps(t *testing.T, pairs ...string) core.Capabilities {
	t.Helper()
	c, err := core.ParseCapabilities(pairs)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func consumerIDs(cs []core.ConsumerInfo) []string {
	var ids []string
	for _, c := range cs {
		ids = append(ids, c.ID)
	}
	return ids
}

func TestEmbeddedPublishWithdrawRepublish(t *testing.T) {
	c := open(t, embeddedConfig(t, "node-a"))
	ctx := context.Background()
	if c.ClientAddr() == "" || c.PeerAddr() == "" {
		t.Fatalf("bound addresses: client %q peer %q", c.ClientAddr(), c.PeerAddr())
	}
	if c.LeaseID() == 0 {
		t.Fatal("LeaseID() = 0")
	}
	changes, unsubscribe := c.Watch()
	defer unsubscribe()

	node := core.NodeInfo{PeerAddr: "127.0.0.1:7001", HTTPAddr: "127.0.0.1:8080", GRPCAddr: "127.0.0.1:9090", Zone: "z1", State: core.StateOnline}
	if err := c.PublishNode(ctx, node); err != nil {
		t.Fatalf("PublishNode: %v", err)
	}
	node.ID, node.Incarnation = "node-a", c.Incarnation()
	eventually(t, 2*time.Second, "node record in view", func() bool {
		n, ok := c.Node("node-a")
		return ok && n == node
	})
	if got := c.Nodes(); len(got) != 1 || got[0] != node {
		t.Fatalf("Nodes() = %+v, want [%+v]", got, node)
	}
	select {
	case <-changes:
	case <-time.After(2 * time.Second):
		t.Fatal("Watch channel not woken by a view change")
	}

	w := core.ConsumerInfo{ID: "w2", Queue: "jobs", Name: "demo worker", Capabilities: mustCaps(t, "model=demo"), Concurrency: 4, Zone: "z1"}
	for _, id := range []string{"w2", "w1"} {
		w.ID = id
		if err := c.PublishConsumer(ctx, w); err != nil {
			t.Fatalf("PublishConsumer(%s): %v", id, err)
		}
	}
	took := eventually(t, 2*time.Second, "two consumers in view", func() bool { return len(c.Consumers("jobs")) == 2 })
	t.Logf("own write visible in the view after %v", took)
	got := c.Consumers("jobs")
	if ids := consumerIDs(got); !slices.Equal(ids, []string{"w1", "w2"}) {
		t.Fatalf("Consumers ids = %v, want sorted [w1 w2]", ids)
	}
	g := got[0]
	if g.Node != "node-a" || g.Queue != "jobs" || g.Name != "demo worker" || g.Concurrency != 4 || g.Zone != "z1" ||
		!slices.Equal(g.Capabilities.Strings(), []string{"model=demo"}) {
		t.Fatalf("consumer record = %+v", g)
	}
	// A snapshot shared until the queue's consumers change: a second read
	// is the same array, not a copy (view_test.go holds the rest).
	if again := c.Consumers("jobs"); &again[0] != &got[0] {
		t.Fatal("Consumers copied the snapshot on a second read")
	}
	if q := c.Queues(); !slices.Equal(q, []string{"jobs"}) {
		t.Fatalf("Queues() = %v", q)
	}

	if err := c.WithdrawConsumer(ctx, "jobs", "w1"); err != nil {
		t.Fatalf("WithdrawConsumer: %v", err)
	}
	eventually(t, 2*time.Second, "withdrawn consumer gone", func() bool {
		return slices.Equal(consumerIDs(c.Consumers("jobs")), []string{"w2"})
	})
	// Withdrawing what is not there is not an error.
	if err := c.WithdrawConsumer(ctx, "jobs", "w1"); err != nil {
		t.Fatalf("WithdrawConsumer again: %v", err)
	}

	w.ID, w.Capabilities = "w2", mustCaps(t, "model=demo", "model=big", "gpu=a100")
	if err := c.PublishConsumer(ctx, w); err != nil {
		t.Fatalf("PublishConsumer (republish): %v", err)
	}
	want := []string{"gpu=a100", "model=big", "model=demo"}
	eventually(t, 2*time.Second, "republished capabilities in view", func() bool {
		cs := c.Consumers("jobs")
		return len(cs) == 1 && slices.Equal(cs[0].Capabilities.Strings(), want)
	})

	if err := c.WithdrawConsumer(ctx, "jobs", "w2"); err != nil {
		t.Fatalf("WithdrawConsumer: %v", err)
	}
	eventually(t, 2*time.Second, "queue without consumers or dispatch record leaves Queues", func() bool {
		return len(c.Queues()) == 0 && c.Consumers("jobs") == nil
	})
}

func TestPublishRejectsBadInput(t *testing.T) {
	c := open(t, embeddedConfig(t, "node-a"))
	ctx := context.Background()
	good := core.ConsumerInfo{ID: "w1", Queue: "jobs", Capabilities: mustCaps(t, "model=demo")}
	for name, ci := range map[string]core.ConsumerInfo{
		"queue with slash":  {ID: "w1", Queue: "a/c/b"},
		"empty id":          {Queue: "jobs"},
		"id with slash":     {ID: "x/y", Queue: "jobs"},
		"other node":        {ID: "w1", Queue: "jobs", Node: "node-b"},
		"negative conc":     {ID: "w1", Queue: "jobs", Concurrency: -1},
		"zone with a space": {ID: "w1", Queue: "jobs", Zone: "z 1"},
	} {
		if err := c.PublishConsumer(ctx, ci); err == nil {
			t.Errorf("PublishConsumer(%s) = nil, want an error", name)
		}
	}
	for name, n := range map[string]core.NodeInfo{
		"other id":      {ID: "node-b", State: core.StateOnline},
		"no state":      {},
		"unknown state": {State: "sleeping"},
	} {
		if err := c.PublishNode(ctx, n); err == nil {
			t.Errorf("PublishNode(%s) = nil, want an error", name)
		}
	}
	if err := c.WithdrawConsumer(ctx, "jobs", "a/b"); err == nil {
		t.Error("WithdrawConsumer with a bad id = nil, want an error")
	}
	// Nothing above reached the store: the only record is the good one.
	if err := c.PublishConsumer(ctx, good); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "good consumer", func() bool { return len(c.Consumers("jobs")) == 1 })
	if q := c.Queues(); !slices.Equal(q, []string{"jobs"}) {
		t.Fatalf("Queues() = %v after rejected writes", q)
	}
}

func TestExternalEndpointsSeeEachOtherAndRevokeOnClose(t *testing.T) {
	a := open(t, embeddedConfig(t, "node-a"))
	bcfg := catalog.Config{Name: "node-b", Endpoints: []string{"https://" + a.ClientAddr()}, LeaseTTL: 2 * time.Second}
	b := open(t, bcfg)
	ctx := context.Background()

	if err := a.PublishConsumer(ctx, core.ConsumerInfo{ID: "wa", Queue: "jobs", Capabilities: mustCaps(t, "model=demo")}); err != nil {
		t.Fatalf("a.PublishConsumer: %v", err)
	}
	if err := b.PublishNode(ctx, core.NodeInfo{State: core.StateOnline, Zone: "z2"}); err != nil {
		t.Fatalf("b.PublishNode: %v", err)
	}
	if err := b.PublishConsumer(ctx, core.ConsumerInfo{ID: "wb", Queue: "jobs", Capabilities: mustCaps(t, "model=demo")}); err != nil {
		t.Fatalf("b.PublishConsumer: %v", err)
	}
	for _, c := range []*catalog.Catalog{a, b} {
		eventually(t, 2*time.Second, c.Name()+" sees both consumers", func() bool {
			return slices.Equal(consumerIDs(c.Consumers("jobs")), []string{"wa", "wb"})
		})
	}
	if n, ok := a.Node("node-b"); !ok || n.Zone != "z2" || n.State != core.StateOnline {
		t.Fatalf("a.Node(node-b) = %+v, %v", n, ok)
	}
	if cs := a.Consumers("jobs"); cs[1].Node != "node-b" {
		t.Fatalf("wb's node = %q", cs[1].Node)
	}

	start := time.Now()
	if err := b.Close(ctx); err != nil {
		t.Fatalf("b.Close: %v", err)
	}
	closeTook := time.Since(start)
	gone := eventually(t, time.Second, "b's records gone from a's view after b closed", func() bool {
		_, ok := a.Node("node-b")
		return !ok && slices.Equal(consumerIDs(a.Consumers("jobs")), []string{"wa"})
	})
	t.Logf("b.Close took %v; its records left a's view %v after Close returned (lease TTL 2s)", closeTook.Round(time.Millisecond), gone)
	select {
	case <-b.LeaseLost():
	default:
		t.Error("LeaseLost not closed after Close")
	}
	if err := b.Close(ctx); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := b.PublishConsumer(ctx, core.ConsumerInfo{ID: "wb", Queue: "jobs"}); !errors.Is(err, catalog.ErrLeaseLost) {
		t.Errorf("PublishConsumer after Close = %v, want ErrLeaseLost", err)
	}
}

// TestWithdrawLeavesAnotherNodesRecord: a late withdrawal from the node a
// worker left must not delete the record the node it moved to wrote.
func TestWithdrawLeavesAnotherNodesRecord(t *testing.T) {
	a := open(t, embeddedConfig(t, "node-a"))
	b := open(t, catalog.Config{Name: "node-b", Endpoints: []string{"https://" + a.ClientAddr()}})
	ctx := context.Background()
	if err := b.PublishConsumer(ctx, core.ConsumerInfo{ID: "w1", Queue: "jobs"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "a sees w1", func() bool { return len(a.Consumers("jobs")) == 1 })
	if err := a.WithdrawConsumer(ctx, "jobs", "w1"); err != nil {
		t.Fatalf("WithdrawConsumer of another node's record: %v", err)
	}
	// A marker written after the withdrawal: once a sees it, it has seen
	// anything the withdrawal did.
	if err := a.PublishConsumer(ctx, core.ConsumerInfo{ID: "marker", Queue: "other"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "marker", func() bool { return len(a.Consumers("other")) == 1 })
	if cs := a.Consumers("jobs"); len(cs) != 1 || cs[0].Node != "node-b" {
		t.Fatalf("Consumers(jobs) = %+v: another node's record was withdrawn", cs)
	}
}

func TestRecordFormats(t *testing.T) {
	c := open(t, embeddedConfig(t, "node-a"))
	ctx := context.Background()
	raw := map[string]string{
		// A bare node id, as older nodes write it.
		"/q/legacy": "node-x",
		// Versioned JSON with fields this version does not know.
		"/q/modern":       `{"v":7,"dispatcher":"node-y","reply_to":"node-z","zone":"z1","epoch":12,"extra":{"a":[1,2]}}`,
		"/q/modern/c/w1":  `{"v":7,"node":"node-y","capabilities":["model=demo","bad cap","gpu=a100"],"concurrency":2,"future":true}`,
		"/nodes/node-y":   `{"v":3,"peer_addr":"10.0.0.1:7001","zone":"z1","state":"online","load":0.5}`,
		"/nodes/node-new": `{"v":1,"state":"rebalancing"}`,
		// Garbage under /q/: wrong segment counts or markers, bad names,
		// values that do not parse. None may show up, none may break the view.
		"/q/":             `node-a`,
		"/q/a/b":          `node-a`,
		"/q/a/x/w":        `{"v":1,"node":"node-a"}`,
		"/q/a/c/w/extra":  `{"v":1,"node":"node-a"}`,
		"/q/a/c/":         `{"v":1,"node":"node-a"}`,
		"/q//c/w":         `{"v":1,"node":"node-a"}`,
		"/q/.hidden":      `node-a`,
		"/q/badjson":      `{"dispatcher":`,
		"/q/badid":        `not a node id!`,
		"/q/nodisp":       `{"v":1}`,
		"/q/badc/c/w":     `[1,2,3]`,
		"/q/nonode/c/w":   `{"v":1,"capabilities":[]}`,
		"/nodes/":         `{"state":"online"}`,
		"/nodes/a/b":      `{"state":"online"}`,
		"/nodes/badjson":  `{{`,
		"/qq/jobs":        `node-a`,
		"/elsewhere/jobs": `node-a`,
	}
	for k, v := range raw {
		if _, err := c.Client().Put(ctx, k, v); err != nil {
			t.Fatalf("put %s: %v", k, err)
		}
	}
	// A marker written last: once it is in the view, so is everything above.
	if _, err := c.Client().Put(ctx, "/q/zz-marker", "node-a"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "marker", func() bool { _, ok := c.Dispatch("zz-marker"); return ok })

	check := func(c *catalog.Catalog, how string) {
		t.Helper()
		if d, ok := c.Dispatch("legacy"); !ok || sansEpoch(d) != (core.DispatchInfo{Dispatcher: "node-x"}) {
			t.Errorf("%s: Dispatch(legacy) = %+v, %v; want {Dispatcher: node-x}", how, d, ok)
		}
		if d, ok := c.Dispatch("modern"); !ok || sansEpoch(d) != (core.DispatchInfo{Dispatcher: "node-y", ReplyTo: "node-z", Zone: "z1"}) {
			t.Errorf("%s: Dispatch(modern) = %+v, %v", how, d, ok)
		}
		cs := c.Consumers("modern")
		if len(cs) != 1 || cs[0].ID != "w1" || cs[0].Node != "node-y" || cs[0].Concurrency != 2 ||
			!slices.Equal(cs[0].Capabilities.Strings(), []string{"gpu=a100", "model=demo"}) {
			t.Errorf("%s: Consumers(modern) = %+v", how, cs)
		}
		if n, ok := c.Node("node-y"); !ok || n.PeerAddr != "10.0.0.1:7001" || n.State != core.StateOnline {
			t.Errorf("%s: Node(node-y) = %+v, %v", how, n, ok)
		}
		// An unknown state is kept, and so never taken for Online.
		if n, ok := c.Node("node-new"); !ok || n.State == core.StateOnline {
			t.Errorf("%s: Node(node-new) = %+v, %v", how, n, ok)
		}
		if q := c.Queues(); !slices.Equal(q, []string{"legacy", "modern", "zz-marker"}) {
			t.Errorf("%s: Queues() = %v, want [legacy modern zz-marker]", how, q)
		}
		var ids []string
		for _, n := range c.Nodes() {
			ids = append(ids, n.ID)
		}
		if !slices.Equal(ids, []string{"node-new", "node-y"}) {
			t.Errorf("%s: Nodes() ids = %v", how, ids)
		}
		if cs := c.Consumers("a"); cs != nil {
			t.Errorf("%s: Consumers(a) = %+v, want none", how, cs)
		}
	}
	check(c, "watched")

	// The same records read by the initial load of a second catalog.
	b := open(t, catalog.Config{Name: "node-b", Endpoints: []string{"https://" + c.ClientAddr()}})
	check(b, "loaded")

	// A record that turns into garbage leaves the view.
	if _, err := c.Client().Put(ctx, "/q/modern", "{broken"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "broken dispatch record dropped", func() bool { _, ok := c.Dispatch("modern"); return !ok })
	// Deleting a dispatch record leaves the queue's consumers alone.
	if _, err := c.Client().Delete(ctx, "/q/legacy"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "deleted dispatch record", func() bool { _, ok := c.Dispatch("legacy"); return !ok })
	if len(c.Consumers("modern")) != 1 {
		t.Error("consumer lost with its queue's dispatch record")
	}
}

func TestParseDispatch(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    core.DispatchInfo
		wantErr bool
	}{
		{in: "node-a", want: core.DispatchInfo{Dispatcher: "node-a"}},
		{in: " node-a\n", want: core.DispatchInfo{Dispatcher: "node-a"}},
		{in: `"node-a"`, want: core.DispatchInfo{Dispatcher: "node-a"}},
		{in: `{"v":1,"dispatcher":"node-a"}`, want: core.DispatchInfo{Dispatcher: "node-a"}},
		{in: `{"v":1,"dispatcher":"n","reply_to":"r","zone":"z","new":[1]}`, want: core.DispatchInfo{Dispatcher: "n", ReplyTo: "r", Zone: "z"}},
		{in: ``, wantErr: true},
		{in: `{`, wantErr: true},
		{in: `{"v":1}`, wantErr: true},
		{in: `{"dispatcher":"a/b"}`, wantErr: true},
		{in: `node a`, wantErr: true},
		{in: `[1]`, wantErr: true},
		{in: `"unterminated`, wantErr: true},
	} {
		got, err := catalog.ParseDispatch([]byte(tc.in))
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("ParseDispatch(%q) = %+v, %v; want %+v, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
	// What EncodeDispatch writes, ParseDispatch reads.
	d := core.DispatchInfo{Dispatcher: "node-a", ReplyTo: "node-b", Zone: "z1"}
	b, err := catalog.EncodeDispatch(d)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := catalog.ParseDispatch(b); err != nil || got != d {
		t.Errorf("round trip of %s = %+v, %v", b, got, err)
	}
	if _, err := catalog.EncodeDispatch(core.DispatchInfo{}); err == nil {
		t.Error("EncodeDispatch without a dispatcher = nil error")
	}
}

func TestKeys(t *testing.T) {
	if got := catalog.NodeKey("n1"); got != "/nodes/n1" {
		t.Errorf("NodeKey = %q", got)
	}
	if got := catalog.DispatchKey("jobs"); got != "/q/jobs" {
		t.Errorf("DispatchKey = %q", got)
	}
	if got := catalog.ConsumerKey("jobs", "w1"); got != "/q/jobs/c/w1" {
		t.Errorf("ConsumerKey = %q", got)
	}
}

func TestReopenSameDir(t *testing.T) {
	cfg := embeddedConfig(t, "node-a")
	cfg.Logger = testLogger(t)
	ctx := context.Background()
	for i := range 2 {
		c, err := catalog.Open(ctx, cfg)
		if err != nil {
			t.Fatalf("Open #%d: %v", i+1, err)
		}
		if _, err := c.Client().Put(ctx, "/q/kept", "node-a"); err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			// Unleased data written by the first run survived the restart
			// and was loaded before Open returned.
			if _, ok := c.Dispatch("kept"); !ok {
				t.Error("record from the previous run not in the loaded view")
			}
		}
		if err := c.Close(ctx); err != nil {
			t.Fatalf("Close #%d: %v", i+1, err)
		}
	}
}

func TestOpenFailsFast(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := catalog.Open(ctx, catalog.Config{}); err == nil {
		t.Fatal("Open with an empty config = nil error")
	}
	// Unreachable external endpoints: Open gives up within its timeouts and
	// leaves nothing running (TestMain checks for goroutines).
	start := time.Now()
	_, err := catalog.Open(ctx, catalog.Config{Name: "n", Endpoints: []string{"http://127.0.0.1:1"}, DialTimeout: 200 * time.Millisecond, RequestTimeout: 500 * time.Millisecond})
	if err == nil {
		t.Fatal("Open against a closed port = nil error")
	}
	t.Logf("Open against a closed port failed after %v: %v", time.Since(start).Round(time.Millisecond), err)
	// The address is already taken.
	a := open(t, embeddedConfig(t, "node-a"))
	cfg := embeddedConfig(t, "node-b")
	cfg.ClientAddr = a.ClientAddr()
	if _, err := catalog.Open(ctx, cfg); err == nil {
		t.Fatal("Open on a client address in use = nil error")
	}
}

// TestViewRecoversFromCompactedWatch: a client cut off while the revisions
// it was watching from are compacted away cannot resume its watch; the view
// must reload and follow the store again rather than freeze.
func TestViewRecoversFromCompactedWatch(t *testing.T) {
	a := open(t, embeddedConfig(t, "node-a"))
	p := tcptest.NewRelay(t, a.ClientAddr())
	b := open(t, catalog.Config{Name: "node-b", Endpoints: []string{"https://" + p.Addr}, LeaseTTL: 10 * time.Second})
	ctx := context.Background()
	if err := a.PublishConsumer(ctx, core.ConsumerInfo{ID: "w1", Queue: "jobs"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "b sees w1", func() bool { return len(b.Consumers("jobs")) == 1 })

	p.Refuse()
	if err := a.WithdrawConsumer(ctx, "jobs", "w1"); err != nil {
		t.Fatal(err)
	}
	if err := a.PublishConsumer(ctx, core.ConsumerInfo{ID: "w2", Queue: "jobs"}); err != nil {
		t.Fatal(err)
	}
	resp, err := a.Client().Put(ctx, catalog.DispatchKey("jobs"), "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Client().Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatalf("Compact: %v", err)
	}
	p.Heal()
	took := eventually(t, 15*time.Second, "b's view follows after the compaction", func() bool {
		d, ok := b.Dispatch("jobs")
		return ok && d.Dispatcher == "node-a" && slices.Equal(consumerIDs(b.Consumers("jobs")), []string{"w2"})
	})
	t.Logf("b's view caught up %v after the proxy let it through again", took.Round(time.Millisecond))
	// And it keeps following.
	if err := a.PublishConsumer(ctx, core.ConsumerInfo{ID: "w3", Queue: "jobs"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "b sees w3 on the new watch", func() bool { return len(b.Consumers("jobs")) == 2 })
}

// A node without a record is only "not seen yet" until the view sees its
// record deleted: AwaitNode waits for a record published after it was
// called, NodeLeft is true only once the record was seen and then deleted,
// and AwaitNode answers false for a node that left at once.
func TestNotSeenYetIsNotLeft(t *testing.T) {
	a := open(t, embeddedConfig(t, "node-a"))
	ctx := context.Background()
	if a.NodeLeft("node-b") {
		t.Fatal("NodeLeft(node-b) before node-b ever published")
	}
	got := make(chan core.NodeInfo, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		n, _ := a.AwaitNode(wctx, "node-b")
		got <- n
	}()
	time.Sleep(50 * time.Millisecond) // AwaitNode is waiting: the record does not exist yet
	b := open(t, catalog.Config{Name: "node-b", Endpoints: []string{"https://" + a.ClientAddr()}, LeaseTTL: 2 * time.Second})
	if err := b.PublishNode(ctx, core.NodeInfo{State: core.StateOnline, PeerAddr: "127.0.0.1:7002"}); err != nil {
		t.Fatalf("b.PublishNode: %v", err)
	}
	select {
	case n := <-got:
		if n.ID != "node-b" || n.PeerAddr != "127.0.0.1:7002" {
			t.Fatalf("AwaitNode = %+v, want node-b's record", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("AwaitNode did not return once the record was published")
	}
	if a.NodeLeft("node-b") {
		t.Fatal("NodeLeft(node-b) while its record is in the view")
	}
	if err := b.Close(ctx); err != nil {
		t.Fatalf("b.Close: %v", err)
	}
	eventually(t, 5*time.Second, "node-b seen leaving", func() bool { return a.NodeLeft("node-b") })
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if n, ok := a.AwaitNode(wctx, "node-b"); ok {
		t.Fatalf("AwaitNode(node-b) after it left = %+v", n)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("AwaitNode for a node that left took %v: it must not wait", took)
	}
	if a.NodeLeft("node-c") {
		t.Error("NodeLeft(node-c), a node never seen")
	}
}
