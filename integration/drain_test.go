package integration_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/peer/worker"
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

	closed := make(chan error, 1)
	go func() { closed <- n.Close(context.Background()) }()
	waitFor(t, 2*time.Second, "node draining", func() bool { return n.Engine().Draining() })
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
