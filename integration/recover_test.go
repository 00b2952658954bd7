package integration_test

import (
	"context"
	"encoding/json"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/internal/syncbuf"
	"github.com/switchyard/switchyard/internal/tcptest"
	"github.com/switchyard/switchyard/worker"
)

// TestFencedNodeRecovers: node B, whose only way to etcd is a proxy, is cut
// off from it (connections closed and refused) while its process, its peer
// port and its worker's session stay up. B fences (its /readyz answers
// 503, and its record leaves A's view with its lease). When the cut heals,
// B comes back on its own, within 2 lease TTLs: a new incarnation in A's
// view, online, ready, and its worker — whose session never dropped —
// takes a job posted to A.
func TestFencedNodeRecovers(t *testing.T) {
	t.Cleanup(func() { awaitNoGoroutine(t, "core.(*Worker).Detach(", 15*time.Second) })
	a := MustStartNode(t, func(c *switchyard.Config) {
		c.Name, c.ClusterSecret = "ra", testSecret
		c.PeerHeartbeatInterval, c.PeerFailureThreshold = 100*time.Millisecond, 5
	})
	proxy := tcptest.NewRelay(t, a.Catalog().ClientAddr())
	logs := &syncbuf.Buffer{}
	b := startZombieNode(t, "rb", proxy.Addr, logs)
	online := func(want func(inc string) bool) func() bool {
		return func() bool {
			nb, ok := a.Catalog().Node("rb")
			return ok && nb.State == "online" && want(nb.Incarnation)
		}
	}
	waitFor(t, 10*time.Second, "rb online in ra's view", online(func(inc string) bool { return inc != "" }))
	first, _ := a.Catalog().Node("rb")

	var runs atomic.Int32
	stop := MustStartWorker(t, b, worker.Config{Name: "wb", Queue: "rq"}, func(context.Context, *worker.Job, *worker.Output) (any, error) {
		runs.Add(1)
		return map[string]any{"by": "wb"}, nil
	})
	defer stop()
	waitFor(t, 10*time.Second, "wb's consumer in ra's view", func() bool { return len(a.Catalog().Consumers("rq")) == 1 })
	complete := func(what string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		res := post(ctx, t, a, "rq", `{"ttl_ms":15000,"input":"x"}`, true)
		defer res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Fatalf("%s: POST: %d", what, res.StatusCode)
		}
		evs, err := readStream(res.Body).wait(15 * time.Second)
		if err != nil || len(evs) == 0 || evs[len(evs)-1].Type != "done" {
			t.Fatalf("%s: stream %v, %+v; want it to end done\n%s", what, err, evs, logs.String())
		}
	}
	complete("before the cut")

	cut := time.Now()
	// Refused rather than blackholed: a connection the etcd client opened
	// into a blackhole stays open after the heal, and the client waits out
	// gRPC's connect timeout (20s) on it, which is the etcd client's
	// business, not the recovery's.
	proxy.Refuse()
	select {
	case <-b.Catalog().LeaseLost():
	case <-time.After(zombieTTL):
		t.Fatalf("rb did not fence within its lease TTL of the cut\n%s", logs.String())
	}
	fenced := time.Since(cut)
	waitFor(t, time.Second, "rb's /readyz 503 while fenced", func() bool { code, _ := readyz(t, b); return code == http.StatusServiceUnavailable })
	if got := clusterNodes(t, b)["rb"].State; got != "fenced" {
		t.Errorf("rb in its own view while fenced: %q, want fenced", got)
	}
	waitFor(t, 3*zombieTTL, "rb's record gone from ra's view", func() bool { _, ok := a.Catalog().Node("rb"); return !ok })
	gone := time.Since(cut)

	proxy.Heal()
	healed := time.Now()
	deadline := time.Now().Add(2 * zombieTTL)
	for {
		code, _ := readyz(t, b)
		if code == http.StatusOK && online(func(inc string) bool { return inc != "" && inc != first.Incarnation })() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rb not online under a new incarnation and ready within 2 lease TTLs of the heal\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	back := time.Since(healed)
	again, _ := a.Catalog().Node("rb")
	if inc := listedIncarnation(t, a, "rb"); inc != again.Incarnation {
		t.Fatalf("GET /v1/cluster/nodes on ra lists rb's incarnation %q, want %q", inc, again.Incarnation)
	}
	waitFor(t, 5*time.Second, "wb's consumer back in ra's view", func() bool { return len(a.Catalog().Consumers("rq")) == 1 })
	before := runs.Load()
	complete("after the recovery")
	if runs.Load() != before+1 {
		t.Fatalf("after the recovery wb ran %d jobs, want 1", runs.Load()-before)
	}
	labels := map[string]string{}
	if f, r := metric(t, b, "switchyard_catalog_fences_total", labels), metric(t, b, "switchyard_catalog_recoveries_total", labels); f != 1 || r != 1 {
		t.Fatalf("fences %v, recoveries %v; want 1 and 1", f, r)
	}
	t.Logf("lease TTL %v: rb fenced %v after the cut, left ra's view %v after it; back online and ready %v after the heal (incarnation %s → %s); its worker's session stayed up and ran the next job",
		zombieTTL, fenced.Round(time.Millisecond), gone.Round(time.Millisecond), back.Round(time.Millisecond), first.Incarnation, again.Incarnation)
}

// listedIncarnation is node's incarnation as GET /v1/cluster/nodes on n
// lists it.
func listedIncarnation(t *testing.T, n *switchyard.Node, node string) string {
	t.Helper()
	res, err := http.Get(baseURL(n) + "/v1/cluster/nodes")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var list struct {
		Nodes []struct {
			ID          string `json:"id"`
			Incarnation string `json:"incarnation"`
		} `json:"nodes"`
	}
	if err := json.NewDecoder(res.Body).Decode(&list); err != nil {
		t.Fatalf("GET /v1/cluster/nodes: %v", err)
	}
	for _, nd := range list.Nodes {
		if nd.ID == node {
			return nd.Incarnation
		}
	}
	return ""
}
