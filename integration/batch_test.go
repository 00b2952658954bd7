package integration_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/switchyard/switchyard/worker"
)

// A Go worker's session batches what its jobs have ready together
// (Registered.accepts_batches; worker/send.go), and the node handles a
// batch's messages as if each came alone: jobs running at once on one
// worker, each streaming its outputs as fast as it can, reach their HTTP
// clients complete and in order, each with one terminal event, while the
// node counts the batches that carried them.
func TestBatchedOutputsReachClientsInOrder(t *testing.T) {
	const jobs, outputs = 16, 30
	n := MustStartNode(t, nil)
	MustStartWorker(t, n, worker.Config{Concurrency: jobs}, func(ctx context.Context, job *worker.Job, out *worker.Output) (any, error) {
		for i := range outputs {
			if err := out.Send(ctx, i); err != nil {
				return nil, err
			}
		}
		return "end", nil
	})
	url := baseURL(n) + "/v1/queues/demo/jobs"
	// Batches come of frames queued together while another is being sent:
	// rounds until the node counted one (nearly always the first).
	for round := 0; round < 10 && (round == 0 || metric(t, n, "switchyard_worker_batches_total", nil) == 0); round++ {
		bodies := make([][]byte, jobs)
		errs := make([]error, jobs)
		var wg sync.WaitGroup
		for j := range jobs {
			wg.Go(func() {
				req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url,
					strings.NewReader(`{"input":"x","ttl_ms":10000,"capabilities":{"model":"demo"}}`))
				if err != nil {
					errs[j] = err
					return
				}
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Accept", "text/event-stream")
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					errs[j] = err
					return
				}
				defer res.Body.Close()
				if res.StatusCode != http.StatusOK {
					errs[j] = fmt.Errorf("status %d", res.StatusCode)
				}
				bodies[j], errs[j] = io.ReadAll(res.Body)
			})
		}
		wg.Wait()
		for j := range jobs {
			if errs[j] != nil {
				t.Fatalf("round %d, job %d: %v", round, j, errs[j])
			}
			evs := readAll(t, bytes.NewReader(bodies[j])) // fails on a terminal event before the last
			if len(evs) != outputs+2 || evs[0].Type != "accepted" || evs[len(evs)-1].Type != "done" {
				t.Fatalf("round %d, job %d: events %v", round, j, types(evs))
			}
			for i, ev := range evs[1 : outputs+1] {
				if ev.Type != "output" || field[int](t, ev, "data") != i {
					t.Fatalf("round %d, job %d: event %d is %s %s, want output %d", round, j, i+1, ev.Type, ev.Data, i)
				}
			}
			if o := field[string](t, evs[len(evs)-1], "outcome"); o != "completed" {
				t.Fatalf("round %d, job %d: outcome %q", round, j, o)
			}
		}
	}
	batches := metric(t, n, "switchyard_worker_batches_total", nil)
	if batches == 0 {
		t.Fatal("the node counted no batch")
	}
	t.Logf("%v batches, %.1f messages each", batches, metric(t, n, "switchyard_worker_batched_messages_total", nil)/batches)
}
