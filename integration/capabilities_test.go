package integration_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/worker"
)

// startWorkerHandle is MustStartWorker for a worker made with worker.New,
// so the test can change its capabilities while it runs.
func startWorkerHandle(tb testing.TB, n *switchyard.Node, cfg worker.Config, h worker.Handler) *worker.Worker {
	tb.Helper()
	cfg.Server = n.GRPCAddr()
	w, err := worker.New(cfg, h)
	if err != nil {
		tb.Fatal(err)
	}
	before := metric(tb, n, "switchyard_workers_connected", nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	tb.Cleanup(func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				tb.Errorf("worker Run: %v", err)
			}
		})
	})
	waitFor(tb, 5*time.Second, "worker registered", func() bool {
		return metric(tb, n, "switchyard_workers_connected", nil) > before
	})
	return w
}

// consumerCaps is the capabilities of queue's consumers in n's catalog view.
func consumerCaps(n *switchyard.Node, queue string) []string {
	var out []string
	for _, c := range n.Catalog().Consumers(queue) {
		out = append(out, strings.Join(c.Capabilities.Strings(), ","))
	}
	return out
}

// A worker on n2 switches from model=a to model=b without reconnecting: n1's
// catalog view follows, n1's ingress then takes model=b jobs and refuses
// model=a ones, and the model=a job that was running when it switched
// finishes normally.
func TestCapabilitiesUpdateAcrossNodes(t *testing.T) {
	const queue = "caps"
	nodes := startCluster(t, 2, nil)
	n1, n2 := nodes[0], nodes[1]

	started, release := make(chan struct{}, 1), make(chan struct{})
	w := startWorkerHandle(t, n2, worker.Config{
		Name: "w2", Queue: queue, Capabilities: []string{"model=a"}, Concurrency: 2,
	}, func(ctx context.Context, job *worker.Job, _ *worker.Output) (any, error) {
		if string(job.Input) == `"hold"` {
			started <- struct{}{}
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return "w2", nil
	})
	waitFor(t, 5*time.Second, "n1 sees w2 with model=a", func() bool {
		return slices.Equal(consumerCaps(n1, queue), []string{"model=a"})
	})

	jobA := `{"ttl_ms":5000,"capabilities":{"model":"a"},"input":"x"}`
	jobB := `{"ttl_ms":5000,"capabilities":{"model":"b"},"input":"x"}`
	if code, body := resultOf(t, n1, queue, jobB); code != 503 || !strings.Contains(body, "no_capable_worker") {
		t.Fatalf("model=b job before the switch: %d %s, want 503 no_capable_worker", code, body)
	}
	if code, who := resultOf(t, n1, queue, jobA); code != 200 || who != "w2" {
		t.Fatalf("model=a job before the switch: %d %q, want it run by w2", code, who)
	}

	// A model=a job is running on w2 when it switches.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	held := post(ctx, t, n1, queue, `{"ttl_ms":15000,"capabilities":{"model":"a"},"input":"hold"}`, true)
	defer held.Body.Close()
	if held.StatusCode != 200 {
		t.Fatalf("held job: POST %d", held.StatusCode)
	}
	select {
	case <-started:
	case <-time.After(5 * time.Second):
		t.Fatal("held job did not start")
	}

	if err := w.SetCapabilities(ctx, []string{"model=b"}); err != nil {
		t.Fatalf("SetCapabilities: %v", err)
	}
	if got := w.Capabilities(); !slices.Equal(got, []string{"model=b"}) {
		t.Fatalf("Capabilities() = %v", got)
	}
	waitFor(t, 5*time.Second, "n1 sees w2 with model=b", func() bool {
		return slices.Equal(consumerCaps(n1, queue), []string{"model=b"})
	})
	if code, who := resultOf(t, n1, queue, jobB); code != 200 || who != "w2" {
		t.Fatalf("model=b job after the switch: %d %q, want it run by w2", code, who)
	}
	if code, body := resultOf(t, n1, queue, jobA); code != 503 || !strings.Contains(body, "no_capable_worker") {
		t.Fatalf("model=a job after the switch: %d %s, want 503 no_capable_worker", code, body)
	}

	// The job bound under model=a was not touched by the switch.
	close(release)
	evs := readAll(t, held.Body)
	if got := strings.Join(types(evs), ","); got != "accepted,done" {
		t.Fatalf("held job events %s, want accepted,done", got)
	}
	if who := field[string](t, evs[len(evs)-1], "result"); who != "w2" {
		t.Fatalf("held job result %q", who)
	}

	// An invalid set is refused and leaves model=b in effect everywhere.
	var ce *worker.CapabilitiesError
	if err := w.SetCapabilities(ctx, []string{"model b"}); !errors.As(err, &ce) || ce.Code != "invalid_worker" {
		t.Fatalf("SetCapabilities(invalid) = %v, want a CapabilitiesError invalid_worker", err)
	}
	if code, who := resultOf(t, n1, queue, jobB); code != 200 || who != "w2" {
		t.Fatalf("model=b job after a refused update: %d %q", code, who)
	}
}

// A queue's consumers are one snapshot every reader of the catalog view
// shares (catalog.Catalog.Consumers): the dispatcher's pool, the ingress's
// capability checks, the queue views, the election. None of them may
// modify it. Jobs with and without capabilities, refused ones, and the
// queue views at both nodes leave the snapshot each node handed out as it
// was, and the same one still handed out.
func TestConsumersSnapshotUnmodified(t *testing.T) {
	const queue = "snap"
	nodes := startCluster(t, 2, nil)
	n1, n2 := nodes[0], nodes[1]
	MustStartWorker(t, n2, worker.Config{
		Name: "w2", Queue: queue, Capabilities: []string{"model=a", "model=b", "gpu=x"}, Concurrency: 4,
	}, func(context.Context, *worker.Job, *worker.Output) (any, error) { return "w2", nil })
	waitFor(t, 5*time.Second, "n1 sees w2", func() bool { return len(n1.Catalog().Consumers(queue)) == 1 })
	waitFor(t, 5*time.Second, "n2 sees w2", func() bool { return len(n2.Catalog().Consumers(queue)) == 1 })

	type held struct {
		n    *switchyard.Node
		snap []core.ConsumerInfo
		was  []string
	}
	var hs []held
	for _, n := range nodes {
		s := n.Catalog().Consumers(queue)
		var was []string
		for _, c := range s {
			was = append(was, c.ID+"@"+c.Node+":"+strings.Join(c.Capabilities.Strings(), ","))
		}
		hs = append(hs, held{n, s, was})
	}

	for _, n := range nodes {
		for _, env := range []string{
			`{"ttl_ms":5000,"input":"x"}`,
			`{"ttl_ms":5000,"capabilities":{"model":"a"},"input":"x"}`,
			`{"ttl_ms":5000,"capabilities":{"model":"b","gpu":"x"},"input":"x"}`,
		} {
			if code, who := resultOf(t, n, queue, env); code != 200 || who != "w2" {
				t.Fatalf("%s at %s: %d %q, want it run by w2", env, n.Catalog().Name(), code, who)
			}
		}
		if code, body := resultOf(t, n, queue, `{"ttl_ms":5000,"capabilities":{"model":"c"},"input":"x"}`); code != 503 || !strings.Contains(body, "no_capable_worker") {
			t.Fatalf("model=c job: %d %s, want 503 no_capable_worker", code, body)
		}
		if code := getJSON(t, baseURL(n)+"/v1/queues", nil); code != 200 {
			t.Fatalf("GET /v1/queues: %d", code)
		}
		if code := getJSON(t, baseURL(n)+"/v1/queues/"+queue, nil); code != 200 {
			t.Fatalf("GET /v1/queues/%s: %d", queue, code)
		}
	}

	for _, h := range hs {
		var now []string
		for _, c := range h.snap {
			now = append(now, c.ID+"@"+c.Node+":"+strings.Join(c.Capabilities.Strings(), ","))
		}
		if !slices.Equal(now, h.was) {
			t.Errorf("%s: the snapshot handed out changed: %v, was %v", h.n.Catalog().Name(), now, h.was)
		}
		if again := h.n.Catalog().Consumers(queue); len(again) != 1 || &again[0] != &h.snap[0] {
			t.Errorf("%s: a new snapshot (%v) with no change to the queue's consumers", h.n.Catalog().Name(), again)
		}
	}
}
