package integration_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/httpapi"
	"github.com/switchyard/switchyard/worker"
)

// The cluster and queue views come from the catalog's watched registries:
// the node with its zone and state, the queue with its dispatcher and the
// consumer a worker registered, gone when the worker goes.
func TestClusterAndQueueViews(t *testing.T) {
	n := MustStartNode(t, func(c *switchyard.Config) { c.Zone = "eu-1" })
	stop := MustStartWorker(t, n, worker.Config{Name: "w1", Concurrency: 3, Capabilities: []string{"model=demo", "model=big"}}, worker.Tokens(0))

	var nodes struct {
		Nodes []struct {
			ID, State, Zone string
			HTTPAddr        string `json:"http_addr"`
			GRPCAddr        string `json:"grpc_addr"`
		}
	}
	if code := getJSON(t, baseURL(n)+"/v1/cluster/nodes", &nodes); code != 200 {
		t.Fatalf("nodes: %d", code)
	}
	if len(nodes.Nodes) != 1 {
		t.Fatalf("nodes %+v", nodes)
	}
	if got := nodes.Nodes[0]; got.ID != "it-node" || got.State != "online" || got.Zone != "eu-1" || got.HTTPAddr != n.HTTPAddr() || got.GRPCAddr != n.GRPCAddr() {
		t.Fatalf("node %+v", got)
	}

	type queue struct {
		Name, Dispatcher string
		Local            *struct{ Depth, Bound, Workers int }
		Consumers        []struct {
			ID, Node, Name, Zone string
			Capabilities         []string
			Concurrency          int
		}
	}
	var qs struct{ Queues []queue }
	waitFor(t, 2*time.Second, "the consumer in the catalog view", func() bool {
		getJSON(t, baseURL(n)+"/v1/queues", &qs)
		return len(qs.Queues) == 1 && len(qs.Queues[0].Consumers) == 1
	})
	q := qs.Queues[0]
	c := q.Consumers[0]
	if q.Name != "demo" || q.Dispatcher != "it-node" || q.Local == nil || q.Local.Workers != 1 {
		t.Fatalf("queue %+v", q)
	}
	if c.Node != "it-node" || c.Name != "w1" || c.Concurrency != 3 || c.Zone != "eu-1" || !slices.Equal(c.Capabilities, []string{"model=big", "model=demo"}) {
		t.Fatalf("consumer %+v", c)
	}
	var one queue
	if code := getJSON(t, baseURL(n)+"/v1/queues/demo", &one); code != 200 || one.Name != "demo" {
		t.Fatalf("GET /v1/queues/demo: %d %+v", code, one)
	}
	if code := getJSON(t, baseURL(n)+"/v1/queues/nope", nil); code != http.StatusNotFound {
		t.Fatalf("unknown queue: %d", code)
	}

	stop()
	waitFor(t, 2*time.Second, "the consumer withdrawn", func() bool {
		getJSON(t, baseURL(n)+"/v1/queues/demo", &one)
		return len(one.Consumers) == 0
	})
}

// The live view's load is the whole cluster's, read from one node: the
// streams open on another node, the jobs in flight on the queue's
// dispatcher (a third), the jobs ended per second and their time to first
// output as every ingress counts them; each peer asked with the Figures
// call while someone watches.
func TestClusterLoadAcrossNodes(t *testing.T) {
	nodes := startCluster(t, 3, nil)
	n1, n2, n3 := nodes[0], nodes[1], nodes[2]
	MustStartWorker(t, n3, worker.Config{Name: "w3", Concurrency: 8}, worker.Tokens(20*time.Millisecond))
	waitFor(t, 10*time.Second, "w3's consumer in n2's view", func() bool { return len(n2.Catalog().Consumers("demo")) == 1 })

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, baseURL(n1)+"/v1/cluster/events", nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	view := readStream(res.Body)
	// seen is the first snapshot so far for which ok holds: the rates are
	// over one interval, and the next snapshot may have moved on.
	seen := func(ok func(httpapi.ClusterSnapshot) bool) (httpapi.ClusterSnapshot, bool) {
		evs, _ := view.snapshot()
		for _, ev := range evs {
			var s httpapi.ClusterSnapshot
			if ev.Type != "snapshot" {
				continue
			}
			if err := json.Unmarshal([]byte(ev.Data), &s); err != nil {
				t.Fatalf("snapshot: %v", err)
			}
			if ok(s) {
				return s, true
			}
		}
		return httpapi.ClusterSnapshot{}, false
	}
	nodeLoad := func(s httpapi.ClusterSnapshot, id string) (httpapi.NodeLoad, bool) {
		if s.Load != nil {
			for _, nl := range s.Load.Nodes {
				if nl.Node == id {
					return nl, true
				}
			}
		}
		return httpapi.NodeLoad{}, false
	}

	// Four jobs of 50 words streamed to n2: about a second each.
	const jobs = 4
	var wg sync.WaitGroup
	for range jobs {
		wg.Go(func() {
			res := post(ctx, t, n2, "demo", `{"input":"`+words(50)+`"}`, true)
			defer res.Body.Close()
			_, _ = io.Copy(io.Discard, res.Body)
		})
	}
	running := func(s httpapi.ClusterSnapshot) bool {
		nl, ok := nodeLoad(s, "n2")
		if !ok || nl.StreamsOpen < jobs {
			return false
		}
		for _, q := range s.Load.Queues {
			if q.Name == "demo" && q.InFlight >= jobs {
				return true
			}
		}
		return false
	}
	waitFor(t, 10*time.Second, "n1's view to show n2's open streams and the jobs in flight on n3", func() bool {
		_, ok := seen(running)
		return ok
	})
	wg.Wait()
	ended := func(s httpapi.ClusterSnapshot) bool {
		nl, ok := nodeLoad(s, "n2")
		return ok && s.Load.JobsPerSecond["completed"] > 0 && nl.JobsPerSecond != nil && *nl.JobsPerSecond > 0
	}
	waitFor(t, 10*time.Second, "n1's view to show the jobs ended per second, and their time to first output", func() bool {
		_, a := seen(ended)
		_, b := seen(func(s httpapi.ClusterSnapshot) bool { return s.Load != nil && s.Load.FirstOutputMS != nil })
		return a && b
	})
	s, _ := seen(func(s httpapi.ClusterSnapshot) bool { return s.Load != nil && s.Load.FirstOutputMS != nil })
	for _, id := range []string{"n1", "n2", "n3"} {
		if nl, ok := nodeLoad(s, id); !ok || nl.Error != "" {
			t.Errorf("%s in n1's load: %+v (listed %v)", id, nl, ok)
		}
	}
	if q := s.Load.FirstOutputMS; q.P50 <= 0 || q.P99 < q.P50 || q.P99 > 5000 {
		t.Errorf("time to first output %+v ms: want 0 < p50 <= p99, tokens at 20ms apart", q)
	}
	for _, n := range []*switchyard.Node{n2, n3} {
		if got := metric(t, n, "switchyard_peer_messages_total", map[string]string{"kind": "figures"}); got == 0 {
			t.Errorf("%s answered no Figures call", n.Catalog().Name())
		}
	}
	n2load, _ := nodeLoad(s, "n2")
	t.Logf("n1's view while n2 streamed: n2 %d streams open; time to first output %+v ms", n2load.StreamsOpen, *s.Load.FirstOutputMS)
}
