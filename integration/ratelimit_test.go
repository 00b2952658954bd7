package integration_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/switchyard/switchyard"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
	"github.com/switchyard/switchyard/worker"
)

// holdWorker holds every job it takes until the job is cancelled.
func holdWorker(ctx context.Context, _ *worker.Job, _ *worker.Output) (any, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// A burst above a key's rate: the burst's jobs are taken, the rest get 429
// rate_limited with Retry-After (ResourceExhausted on gRPC) and enqueue
// nothing; a key's ceiling on jobs in flight frees a slot when a job ends.
func TestRateLimits(t *testing.T) {
	const fast, few = "fast-key-0000000000000001", "few-key-00000000000000002"
	n := MustStartNode(t, func(c *switchyard.Config) {
		c.Auth.Inline = accessKeys() +
			"  - {subject: fast, key: " + fast + ", roles: [submit], queues: [demo], rate: 0.2, burst: 3}\n" +
			"  - {subject: few, key: " + few + ", roles: [submit], queues: [demo], max_in_flight: 2}\n"
	})
	// One worker holding one job: every job after the first waits in the
	// queue, so the queue's depth counts what was enqueued.
	MustStartWorker(t, n, worker.Config{Queue: "demo", DialOptions: []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()), worker.APIKey(keyAliceWork)}}, holdWorker)
	jobs := baseURL(n) + "/v1/queues/demo/jobs"
	depth := func() float64 { return metric(t, n, "switchyard_queue_depth", map[string]string{"queue": "demo"}) }

	t.Run("rate", func(t *testing.T) {
		const burst = 8
		statuses := make([]int, burst)
		retry := make([]string, burst)
		var wg sync.WaitGroup
		for i := range burst {
			wg.Go(func() {
				res := keyed(t, t.Context(), "POST", jobs, fast, "application/json", `{"input":"x","ttl_ms":60000}`)
				body := readBody(t, res)
				statuses[i], retry[i] = res.StatusCode, res.Header.Get("Retry-After")
				if res.StatusCode == 429 && problemCode(body) != "rate_limited" {
					t.Errorf("429 with %s", body)
				}
			})
		}
		wg.Wait()
		taken, limited := 0, 0
		for i, st := range statuses {
			switch st {
			case 202:
				taken++
			case 429:
				limited++
				if s, err := strconv.Atoi(retry[i]); err != nil || s < 1 || s > 5 {
					t.Errorf("Retry-After %q, want 1-5 seconds (a job every 5s)", retry[i])
				}
			default:
				t.Errorf("status %d", st)
			}
		}
		if taken != 3 || limited != burst-3 {
			t.Fatalf("a burst of %d on a key with burst 3: %d taken, %d limited (%v)", burst, taken, limited, statuses)
		}
		// Three taken: one held by the worker (once it took it), two
		// waiting; a refusal is answered after it was decided, so nothing
		// of the others can arrive later.
		waitFor(t, 5*time.Second, "two jobs waiting, no more", func() bool { return depth() == 2 })
		// gRPC: the same key, the same bucket.
		err := streamErr(pb.NewJobServiceClient(grpcConn(t, n)).Submit(withKey(t.Context(), fast), &pb.SubmitRequest{Queue: "demo", EnvelopeJson: []byte(`{"input":"x"}`)}))
		if got := grpcAnswer(err); got.grpc != codes.ResourceExhausted || got.code != "rate_limited" {
			t.Errorf("gRPC over the rate: %v", got)
		}
		if got := depth(); got != 2 {
			t.Errorf("queue depth %v after the gRPC refusal", got)
		}
	})

	t.Run("in flight", func(t *testing.T) {
		a := submitAs(t, n, few, "demo", `{"input":"a","ttl_ms":60000}`)
		submitAs(t, n, few, "demo", `{"input":"b","ttl_ms":60000}`)
		res := keyed(t, t.Context(), "POST", jobs, few, "application/json", `{"input":"c","ttl_ms":60000}`)
		if body := readBody(t, res); res.StatusCode != 429 || problemCode(body) != "rate_limited" || res.Header.Get("Retry-After") == "" {
			t.Fatalf("a third job in flight: %d %s", res.StatusCode, body)
		}
		cancel := keyed(t, t.Context(), "DELETE", baseURL(n)+"/v1/jobs/"+a, few, "", "")
		mustStatus(t, "cancel", cancel, readBody(t, cancel), nil, 200)
		submitAs(t, n, few, "demo", `{"input":"d","ttl_ms":60000}`)
	})
}
