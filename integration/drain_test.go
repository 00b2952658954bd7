package integration_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/openapi/client"
	"github.com/switchyard/switchyard/worker"
)

// Close (what SIGTERM does) drains: new jobs are refused with draining, a
// bound job that finishes within the drain timeout completes, and one that
// does not ends with node_shutdown — every requester sees a terminal event.
func TestDrainOnClose(t *testing.T) {
	n := MustStartNode(t, func(c *switchyard.Config) { c.DrainTimeout = 800 * time.Millisecond })
	MustStartWorker(t, n, worker.Config{Concurrency: 2}, func(ctx context.Context, job *worker.Job, out *worker.Output) (any, error) {
		if err := out.Send(ctx, "started"); err != nil {
			return nil, err
		}
		if string(job.Input) == `"quick"` {
			select {
			case <-time.After(300 * time.Millisecond):
				return "finished", nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		<-ctx.Done()
		return nil, ctx.Err()
	})
	quick := post(t.Context(), t, n, "demo", `{"input":"quick"}`, true)
	defer quick.Body.Close()
	stuck := post(t.Context(), t, n, "demo", `{"input":"stuck"}`, true)
	defer stuck.Body.Close()
	waitFor(t, 2*time.Second, "both jobs running", func() bool {
		return runningJobs(t, n, quick, stuck) == 2
	})

	if code, _ := readyz(t, n); code != http.StatusOK {
		t.Fatalf("/readyz before the drain: %d, want 200", code)
	}

	closed := make(chan error, 1)
	go func() { closed <- n.Close(context.Background()) }()
	waitFor(t, 2*time.Second, "node draining", func() bool { return n.Engine().Draining() })
	// Load balancers take a draining node out of rotation by /readyz.
	if code, p := readyz(t, n); code != http.StatusServiceUnavailable || p.Code != "draining" || p.Status != code {
		t.Errorf("/readyz while draining: %d %+v, want 503 with code draining", code, p)
	}
	refused := post(t.Context(), t, n, "demo", `{"input":"late"}`, false)
	refused.Body.Close()
	if refused.StatusCode != http.StatusServiceUnavailable || refused.Header.Get("Retry-After") == "" {
		t.Errorf("submit while draining: %d, want 503 with Retry-After", refused.StatusCode)
	}

	q := readAll(t, quick.Body)
	if last := q[len(q)-1]; last.Type != "done" {
		t.Errorf("the quick job did not complete during the drain: %s %s", last.Type, last.Data)
	}
	s := readAll(t, stuck.Body)
	if last := s[len(s)-1]; last.Type != "error" || field[string](t, last, "code") != "node_shutdown" {
		t.Errorf("the stuck job ended with %s %s, want error node_shutdown", last.Type, last.Data)
	}
	if err := recvWithin(t, closed, 10*time.Second, "close to return"); err != nil {
		t.Fatalf("close: %v", err)
	}
}

func runningJobs(t *testing.T, n *switchyard.Node, rs ...*http.Response) int {
	running := 0
	for _, r := range rs {
		var v struct{ State string }
		getJSON(t, baseURL(n)+"/v1/jobs/"+r.Header.Get("X-Job-Id"), &v)
		if v.State == "running" {
			running++
		}
	}
	return running
}

// readyz reads /readyz: its status and, when it is not ready, its problem.
func readyz(tb testing.TB, n *switchyard.Node) (int, problem) {
	tb.Helper()
	res, err := http.Get(baseURL(n) + "/readyz")
	if err != nil {
		tb.Fatal(err)
	}
	defer res.Body.Close()
	var p problem
	if res.StatusCode != http.StatusOK {
		if ct := res.Header.Get("Content-Type"); ct != "application/problem+json" {
			tb.Errorf("/readyz %d: content type %q, want application/problem+json", res.StatusCode, ct)
		}
		if err := json.NewDecoder(res.Body).Decode(&p); err != nil {
			tb.Fatalf("/readyz %d: %v", res.StatusCode, err)
		}
	}
	return res.StatusCode, p
}

// A node that drains keeps an HTTP worker's session until the job it runs
// for another node's requester has ended: the worker's posts are taken, the
// requester gets every output and done, and Close returns after. Meanwhile
// the node is draining in the others' views, and its queue has moved to the
// node hosting the other consumer, which runs the next job.
func TestDrainKeepsHTTPWorkerForOtherNodes(t *testing.T) {
	nodes := startCluster(t, 2, func(_ int, c *switchyard.Config) { c.DrainTimeout = 20 * time.Second })
	n1, n2 := nodes[0], nodes[1]
	hw := openHTTPWorker(t, n2, "demo", client.WorkerRequest{Capabilities: &[]string{"model=demo"}})
	waitFor(t, 5*time.Second, "n2 dispatches demo", func() bool {
		d, ok := n1.Catalog().Dispatch("demo")
		return ok && d.Dispatcher == "n2"
	})
	res := post(t.Context(), t, n1, "demo", `{"input":"long","ttl_ms":30000}`, true)
	defer res.Body.Close()
	o := hw.offer()
	hw.accept(o)
	hw.output(o, "a")

	closed := make(chan error, 1)
	go func() { closed <- n2.Close(context.Background()) }()
	waitFor(t, 5*time.Second, "n2 draining in n1's view", func() bool { return clusterNodes(t, n1)["n2"].State == "draining" })
	MustStartWorker(t, n1, worker.Config{Name: "w1"}, worker.Tokens(0))
	waitFor(t, 5*time.Second, "n1 dispatching demo", func() bool {
		d, ok := n1.Catalog().Dispatch("demo")
		return ok && d.Dispatcher == "n1"
	})
	next := post(t.Context(), t, n1, "demo", `{"input":"next","ttl_ms":30000}`, true)
	defer next.Body.Close()
	if evs := readAll(t, next.Body); evs[len(evs)-1].Type != "done" {
		t.Fatalf("a job posted while n2 drained: %v", types(evs))
	}
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while its worker still ran a job", err)
	default:
	}

	hw.output(o, "b")
	r, err := hw.c.CompleteJobWithResponse(t.Context(), hw.session, o.JobId, client.CompleteMessage{Generation: o.Generation})
	mustStatus(t, "complete", r.HTTPResponse, r.Body, err, 204)
	evs := readAll(t, res.Body)
	if got := strings.Join(types(evs), ","); got != "accepted,output,output,done" {
		t.Fatalf("the draining node's job: %s", got)
	}
	if err := recvWithin(t, closed, 10*time.Second, "Close to return once the job ended"); err != nil {
		t.Fatalf("close: %v", err)
	}
}
