package integration_test

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/switchyard/switchyard"
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
