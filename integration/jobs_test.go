package integration_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/worker"
)

func TestStreamEndToEnd(t *testing.T) {
	n := MustStartNode(t, nil)
	MustStartWorker(t, n, worker.Config{Concurrency: 2}, worker.Tokens(time.Millisecond))
	completed := map[string]string{"outcome": "completed"}
	durations := metric(t, n, "switchyard_job_duration_seconds_count", completed)

	res := post(t.Context(), t, n, "demo", `{"input":"the quick brown fox","ttl_ms":5000}`, true)
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d, content type %q", res.StatusCode, res.Header.Get("Content-Type"))
	}
	evs := readAll(t, res.Body)
	want := []string{"accepted", "output", "output", "output", "output", "done"}
	if got := types(evs); !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	var words []string
	for i, ev := range evs {
		if seq := field[uint64](t, ev, "seq"); seq != uint64(i+1) {
			t.Errorf("event %d has seq %d", i, seq)
		}
		if ev.Type == "output" {
			words = append(words, field[string](t, ev, "data"))
		}
	}
	if got := fmt.Sprint(words); got != "[the  quick  brown  fox]" {
		t.Errorf("outputs %s", got)
	}
	if o := field[string](t, evs[5], "outcome"); o != "completed" {
		t.Errorf("outcome %q", o)
	}
	if got := metric(t, n, "switchyard_jobs_total", completed); got != 1 {
		t.Errorf("switchyard_jobs_total{completed} = %v, want 1", got)
	}
	// Observed as the done event is written, under the engine's lock: the
	// client may read that event a moment before the lock is released.
	waitFor(t, 5*time.Second, "the job's duration observed", func() bool {
		return metric(t, n, "switchyard_job_duration_seconds_count", completed) > durations
	})
	if got := metric(t, n, "switchyard_job_duration_seconds_count", completed) - durations; got != 1 {
		t.Errorf("switchyard_job_duration_seconds_count{completed} grew by %v, want 1", got)
	}
	if d := metric(t, n, "switchyard_job_duration_seconds", completed); d <= 0 {
		t.Errorf("switchyard_job_duration_seconds_sum{completed} = %v, want > 0", d)
	}
	// Co-located: ingress, dispatcher and consumer are this node, so the
	// delivery never left it.
	if got := metric(t, n, "switchyard_dispatch_colocated_deliveries_total", nil); got != 1 {
		t.Errorf("colocated deliveries = %v, want 1", got)
	}
}

func TestSubmitWithoutStreamThenGet(t *testing.T) {
	n := MustStartNode(t, nil)
	MustStartWorker(t, n, worker.Config{}, worker.Tokens(time.Millisecond))

	res := post(t.Context(), t, n, "demo", `{"input":"a b","extra_field_from_the_future":true}`, false)
	var job struct {
		JobID string `json:"job_id"`
		State string `json:"state"`
		Links struct{ Self, Events string }
	}
	if res.StatusCode != http.StatusAccepted {
		t.Fatalf("status %d, want 202", res.StatusCode)
	}
	decode(t, res, &job)
	if job.JobID == "" || res.Header.Get("Location") != "/v1/jobs/"+job.JobID || job.Links.Events != "/v1/jobs/"+job.JobID+"/events" {
		t.Fatalf("job %+v, location %q", job, res.Header.Get("Location"))
	}
	var view struct {
		State, Outcome string
		HandledBy      string `json:"handled_by"`
		Outputs        int
	}
	waitFor(t, 5*time.Second, "job completed", func() bool {
		getJSON(t, baseURL(n)+job.Links.Self, &view)
		return view.State == "completed"
	})
	if view.Outcome != "completed" || view.Outputs != 2 || view.HandledBy == "" {
		t.Errorf("view %+v", view)
	}
	// The full stream stays readable after the job ended.
	evRes, err := http.Get(baseURL(n) + job.Links.Events)
	if err != nil {
		t.Fatal(err)
	}
	defer evRes.Body.Close()
	if got := types(readAll(t, evRes.Body)); !slices.Equal(got, []string{"accepted", "output", "output", "done"}) {
		t.Errorf("replayed events %v", got)
	}
}

// outputThenAwaitCancel is a worker that sends one output ("first"), then
// reports the job's id on started and waits for the job's context to end,
// reporting when on cancelled.
func outputThenAwaitCancel(started chan<- string, cancelled chan<- time.Time) worker.Handler {
	return func(ctx context.Context, job *worker.Job, out *worker.Output) (any, error) {
		if err := out.Send(ctx, "first"); err != nil {
			return nil, err
		}
		started <- job.ID
		<-ctx.Done()
		cancelled <- time.Now()
		return nil, ctx.Err()
	}
}

// A client that opened the stream with its POST and leaves cancels the job;
// the worker's context is cancelled within milliseconds.
func TestCancelOnClientDisconnect(t *testing.T) {
	n := MustStartNode(t, nil)
	started := make(chan string, 1)
	cancelled := make(chan time.Time, 1)
	untilCancelled := outputThenAwaitCancel(started, cancelled)
	MustStartWorker(t, n, worker.Config{}, func(ctx context.Context, job *worker.Job, out *worker.Output) (any, error) {
		if string(job.Input) == `"warm-up"` {
			return "ok", nil
		}
		return untilCancelled(ctx, job, out)
	})

	// Whatever the job starts, here and in the worker, must end with it.
	// Both ends of the worker's session start goroutines just after the
	// node counts the worker registered (what MustStartWorker waits for):
	// a first job, run to its end, proves those are up before the snapshot.
	warm := post(t.Context(), t, n, "demo", `{"input":"warm-up"}`, true)
	if evs := readAll(t, warm.Body); len(evs) == 0 || evs[len(evs)-1].Type != "done" {
		t.Fatalf("warm-up job: %v", types(evs))
	}
	warm.Body.Close()
	idle := goleak.IgnoreCurrent()
	ctx, disconnect := context.WithCancel(t.Context())
	res := post(ctx, t, n, "demo", `{"input":"x","ttl_ms":30000}`, true)
	id := res.Header.Get("X-Job-Id")
	jobID := <-started
	if jobID != id {
		t.Fatalf("worker ran %s, stream is %s", jobID, id)
	}
	left := time.Now()
	disconnect()
	res.Body.Close()
	// A sanity bound, not a performance figure: the latency is logged.
	select {
	case at := <-cancelled:
		t.Logf("cancel latency: worker context cancelled %s after the client left", at.Sub(left))
	case <-time.After(5 * time.Second):
		t.Fatal("worker context was not cancelled after the client disconnected")
	}
	var view struct{ State, Code string }
	waitFor(t, 5*time.Second, "job cancelled", func() bool {
		getJSON(t, baseURL(n)+"/v1/jobs/"+id, &view)
		return view.State == "cancelled"
	})
	if got := metric(t, n, "switchyard_jobs_total", map[string]string{"outcome": "cancelled"}); got != 1 {
		t.Errorf("jobs_total{cancelled} = %v", got)
	}
	// The polls above left keep-alive connections: not the job's.
	http.DefaultClient.CloseIdleConnections()
	waitGoroutinesGone(t, idle)
}

func TestDeleteCancelsRunningJob(t *testing.T) {
	n := MustStartNode(t, nil)
	running := make(chan struct{}, 1)
	MustStartWorker(t, n, worker.Config{}, func(ctx context.Context, job *worker.Job, out *worker.Output) (any, error) {
		running <- struct{}{}
		<-ctx.Done()
		return nil, ctx.Err()
	})
	res := post(t.Context(), t, n, "demo", `{"input":"x"}`, false)
	var job struct {
		JobID string `json:"job_id"`
	}
	decode(t, res, &job)
	<-running
	req, _ := http.NewRequest(http.MethodDelete, baseURL(n)+"/v1/jobs/"+job.JobID, nil)
	dres, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var view struct{ State, Outcome string }
	decode(t, dres, &view)
	if view.State != "cancelled" || view.Outcome != "cancelled" {
		t.Fatalf("after DELETE: %+v", view)
	}
	evRes, err := http.Get(baseURL(n) + "/v1/jobs/" + job.JobID + "/events")
	if err != nil {
		t.Fatal(err)
	}
	defer evRes.Body.Close()
	evs := readAll(t, evRes.Body)
	last := evs[len(evs)-1]
	if last.Type != "error" || field[string](t, last, "code") != "cancelled" {
		t.Fatalf("last event %s %s", last.Type, last.Data)
	}
}

// A job whose TTL runs out while it waits is failed in the queue and never
// delivered, even once a worker frees up.
func TestTTLExpiresInQueue(t *testing.T) {
	n := MustStartNode(t, nil)
	release := make(chan struct{})
	var ran sync.Map
	MustStartWorker(t, n, worker.Config{Concurrency: 1}, func(ctx context.Context, job *worker.Job, out *worker.Output) (any, error) {
		ran.Store(job.ID, true)
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil, nil
	})
	busy := post(t.Context(), t, n, "demo", `{"input":"busy","ttl_ms":10000}`, false)
	busy.Body.Close()
	res := post(t.Context(), t, n, "demo", `{"input":"late","ttl_ms":300}`, true)
	defer res.Body.Close()
	evs := readAll(t, res.Body)
	close(release)
	last := evs[len(evs)-1]
	if last.Type != "error" || field[string](t, last, "code") != "expired" {
		t.Fatalf("events %v, last %s", types(evs), last.Data)
	}
	id := res.Header.Get("X-Job-Id")
	time.Sleep(100 * time.Millisecond) // give a wrong redelivery the chance to happen
	if _, ok := ran.Load(id); ok {
		t.Fatal("an expired job was delivered to a worker")
	}
}

// Reject is not stall: the job goes to a different worker, and the one that
// refused keeps its registration.
func TestRejectGoesToAnotherWorker(t *testing.T) {
	n := MustStartNode(t, nil)
	var refused atomic.Int32
	MustStartWorker(t, n, worker.Config{Name: "picky", Decide: func(*worker.Job) error {
		refused.Add(1)
		return fmt.Errorf("unsupported model")
	}}, worker.Tokens(0))
	MustStartWorker(t, n, worker.Config{Name: "willing"}, worker.Tokens(0))

	for i := range 4 {
		res := post(t.Context(), t, n, "demo", `{"input":"hi"}`, true)
		evs := readAll(t, res.Body)
		res.Body.Close()
		if evs[len(evs)-1].Type != "done" {
			t.Fatalf("job %d: %v %s", i, types(evs), evs[len(evs)-1].Data)
		}
		var view struct{ Worker string }
		getJSON(t, baseURL(n)+"/v1/jobs/"+res.Header.Get("X-Job-Id"), &view)
		if view.Worker != "willing" {
			t.Fatalf("job %d ran on %q", i, view.Worker)
		}
	}
	if refused.Load() == 0 {
		t.Fatal("the picky worker was never offered a job; the test proves nothing")
	}
	if got := metric(t, n, "switchyard_workers_connected", nil); got != 2 {
		t.Errorf("workers connected = %v, want 2 (a reject must not drop the worker)", got)
	}
}

func TestRejectedByEveryWorkerFails(t *testing.T) {
	n := MustStartNode(t, nil)
	MustStartWorker(t, n, worker.Config{Decide: func(*worker.Job) error { return fmt.Errorf("no") }}, worker.Tokens(0))
	res := post(t.Context(), t, n, "demo", `{"input":"hi"}`, true)
	defer res.Body.Close()
	evs := readAll(t, res.Body)
	if last := evs[len(evs)-1]; last.Type != "error" || field[string](t, last, "code") != "rejected" {
		t.Fatalf("events %v last %s", types(evs), last.Data)
	}
}

// A worker never holds more jobs than it declared.
func TestConcurrencyCredits(t *testing.T) {
	n := MustStartNode(t, nil)
	var cur, peak atomic.Int32
	MustStartWorker(t, n, worker.Config{Concurrency: 2}, func(ctx context.Context, job *worker.Job, out *worker.Output) (any, error) {
		c := cur.Add(1)
		for {
			p := peak.Load()
			if c <= p || peak.CompareAndSwap(p, c) {
				break
			}
		}
		time.Sleep(20 * time.Millisecond)
		cur.Add(-1)
		return nil, nil
	})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			res := post(t.Context(), t, n, "demo", `{"input":"x"}`, true)
			readAll(t, res.Body)
			res.Body.Close()
		})
	}
	wg.Wait()
	if p := peak.Load(); p != 2 {
		t.Fatalf("peak concurrent jobs on the worker = %d, want exactly 2", p)
	}
	if got := metric(t, n, "switchyard_jobs_total", map[string]string{"outcome": "completed"}); got != 8 {
		t.Fatalf("completed = %v", got)
	}
}

func decode(tb testing.TB, res *http.Response, into any) {
	tb.Helper()
	defer res.Body.Close()
	if err := jsonDecoder(res).Decode(into); err != nil {
		tb.Fatalf("decode %s: %v", res.Request.URL, err)
	}
}

var _ = switchyard.Open
