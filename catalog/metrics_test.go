package catalog_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/catalog"
	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/internal/promtest"
)

// The catalog counts what it asks of etcd by op, the watch events it
// applies and its elections; and Related names the nodes a node works with
// by the catalog: the dispatcher of a queue it hosts a consumer of, the
// hosts of a queue it dispatches, nobody else.
func TestCatalogMetricsAndRelated(t *testing.T) {
	reg := prometheus.NewRegistry()
	cfg := embeddedConfig(t, "node-a")
	cfg.Metrics = catalog.NewMetrics(reg)
	a := open(t, cfg)
	client := func(name string) *catalog.Catalog {
		return open(t, catalog.Config{Name: name, Endpoints: []string{"https://" + a.ClientAddr()}, LeaseTTL: 2 * time.Second})
	}
	b, d := client("node-b"), client("node-d")
	for _, c := range []*catalog.Catalog{a, b, d} {
		setState(t, c, core.StateOnline)
	}
	for _, n := range []string{"node-a", "node-b", "node-d"} {
		waitNodeState(t, a, n, core.StateOnline)
	}
	ops := func(op string) float64 {
		return gathered(t, reg, "switchyard_catalog_requests_total", map[string]string{"op": op})
	}
	events := func() float64 { return gathered(t, reg, "switchyard_catalog_watch_events_total", nil) }
	if ops("lease_grant") < 1 {
		t.Errorf("lease_grant = %v after Open, want at least 1", ops("lease_grant"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	putsBefore, eventsBefore := ops("put"), events()
	if err := a.PublishConsumer(ctx, core.ConsumerInfo{ID: "w1", Queue: "mine", Node: "node-a"}); err != nil {
		t.Fatal(err)
	}
	if err := d.PublishConsumer(ctx, core.ConsumerInfo{ID: "w3", Queue: "other", Node: "node-d"}); err != nil {
		t.Fatal(err)
	}
	if got := ops("put") - putsBefore; got != 1 {
		t.Errorf("a's puts for its one consumer record: %v, want 1", got)
	}
	// b dispatches mine, which a hosts a consumer of; a's own election
	// leaves b's record standing (a producer claims only an unclaimed
	// queue).
	if _, err := b.Elect(ctx, "mine", catalog.ClaimProducer); err != nil {
		t.Fatal(err)
	}
	waitNodeState(t, b, "node-b", core.StateOnline)
	if dp, err := a.Elect(ctx, "mine", catalog.ClaimProducer); err != nil || dp.Dispatcher != "node-b" {
		t.Fatalf("a's election of mine: %+v, %v; want node-b's record to stand", dp, err)
	}
	if got := gathered(t, reg, "switchyard_catalog_elections_total", nil); got != 1 {
		t.Errorf("a's elections = %v, want 1", got)
	}
	eventually(t, 5*time.Second, "a sees b dispatch mine and both consumers", func() bool {
		dp, ok := a.Dispatch("mine")
		return ok && dp.Dispatcher == "node-b" && len(a.Consumers("other")) == 1
	})
	if got := events() - eventsBefore; got < 3 {
		t.Errorf("a's watch events for two consumer records and a dispatch record: %v, want at least 3", got)
	}
	if got := a.Related("node-a"); len(got) != 1 || !got["node-b"] {
		t.Errorf("Related(node-a) = %v, want node-b (dispatches mine, hosted here)", got)
	}
	if got := a.Related("node-b"); len(got) != 1 || !got["node-a"] {
		t.Errorf("Related(node-b) = %v, want node-a (hosts mine, dispatched there)", got)
	}
	if got := a.Related("node-d"); len(got) != 0 {
		t.Errorf("Related(node-d) = %v, want none (other has no dispatcher)", got)
	}
}

// gathered is the value of counter name in reg: its series with labels,
// or its first series (nil). A series that is missing fails t: the
// catalog registers every one of them at start.
func gathered(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	v, ok := promtest.Value(t, reg, name, labels)
	if !ok {
		t.Fatalf("%s%v not gathered", name, labels)
	}
	return v
}
