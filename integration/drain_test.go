package integration_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/switchyard/switchyard"
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
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("close did not return")
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
