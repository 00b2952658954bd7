// Package benchkit holds what Switchyard's benchmarks share: the HTTP load
// generator behind `switchyard bench` and the cluster benchmark
// (integration/bench_test.go), so every figure they print is measured by
// the same client code, and the bare relay floors Switchyard is compared
// with: opaque frames in the reference kit's shape (FrameNode) and the
// worker protocol (Relay).
//
// It is benchmark tooling, not part of a node. Nothing here fails on a
// time: it measures and reports.
package benchkit

import (
	"bytes"
	"context"
	"io"
	"iter"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	sse "github.com/tmaxmax/go-sse"
)

// NewClient returns the HTTP client the load generator uses: keep-alive
// connections, enough idle ones per host for any concurrency level.
func NewClient() *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}}
}

// Result is one load level: per successful job, the time from sending the
// POST to its first "output" event and to its "done" event; the jobs that
// did not end in "done"; the wall time of the whole level.
type Result struct {
	First, Last []time.Duration
	Failed      int
	Wall        time.Duration
	// CPU is the process's CPU time (user and system) while the level
	// ran, set by a caller whose process holds every part of the system
	// (BenchmarkCluster: client, nodes, workers, relay); zero otherwise.
	CPU time.Duration
}

// CPUPerJob is CPU over the jobs run (completed or failed); 0 if unknown.
func (r Result) CPUPerJob() time.Duration {
	if n := len(r.Last) + r.Failed; n > 0 {
		return r.CPU / time.Duration(n)
	}
	return 0
}

// JobsPerSec is the completed jobs per second of wall time.
func (r Result) JobsPerSec() float64 {
	if r.Wall <= 0 {
		return 0
	}
	return float64(len(r.Last)) / r.Wall.Seconds()
}

// Run posts n jobs to target (a .../v1/queues/{queue}/jobs URL) from conc
// goroutines, each starting its next job as soon as its previous one ended,
// and reads each job's event stream to its end.
func Run(ctx context.Context, client *http.Client, target string, body []byte, n, conc int) Result {
	return RunJobs(ctx, HTTPJob(client, target, body), n, conc)
}

// JobFunc runs one job and reports as Job does.
type JobFunc func(ctx context.Context) (first, last time.Duration, ok bool)

// HTTPJob is Job as a JobFunc.
func HTTPJob(client *http.Client, target string, body []byte) JobFunc {
	return func(ctx context.Context) (time.Duration, time.Duration, bool) { return Job(ctx, client, target, body) }
}

// RunJobs is Run for any kind of job: n of them from conc goroutines.
func RunJobs(ctx context.Context, job JobFunc, n, conc int) Result {
	var left atomic.Int64
	left.Store(int64(n))
	return run(ctx, job, conc, func() bool { return left.Add(-1) >= 0 })
}

// RunJobsFor is RunFor for any kind of job.
func RunJobsFor(ctx context.Context, job JobFunc, d time.Duration, conc int) Result {
	end := time.Now().Add(d)
	return run(ctx, job, conc, func() bool { return ctx.Err() == nil && time.Now().Before(end) })
}

// RunFor is Run for a duration instead of a number of jobs: the goroutines
// start jobs until d has passed (or ctx is done), and the jobs running then
// finish.
func RunFor(ctx context.Context, client *http.Client, target string, body []byte, d time.Duration, conc int) Result {
	return RunJobsFor(ctx, HTTPJob(client, target, body), d, conc)
}

// run is Run's closed loop: conc goroutines start jobs while next says so.
func run(ctx context.Context, job JobFunc, conc int, next func() bool) Result {
	var (
		mu  sync.Mutex
		res Result
		wg  sync.WaitGroup
	)
	start := time.Now()
	for range conc {
		wg.Go(func() {
			for next() {
				first, last, ok := job(ctx)
				mu.Lock()
				if ok {
					res.First = append(res.First, first)
					res.Last = append(res.Last, last)
				} else {
					res.Failed++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	res.Wall = time.Since(start)
	return res
}

// Job posts one job asking for text/event-stream and reads the stream with
// a spec-compliant SSE parser. first is the time to the first "output"
// event (0 when the job had none), last the time to "done"; ok is false
// when the job failed, ended otherwise, or the request did.
func Job(ctx context.Context, client *http.Client, target string, body []byte) (first, last time.Duration, ok bool) {
	res, t0, ok := postStream(ctx, client, target, body)
	if !ok {
		return 0, 0, false
	}
	defer closeDrained(res)
	kinds := func(yield func(string, error) bool) {
		for ev, err := range sse.Read(res.Body, nil) {
			if !yield(ev.Type, err) {
				return
			}
		}
	}
	return timeStream(t0, kinds, "error")
}

// postStream posts body as JSON asking for text/event-stream; t0 is when
// the request went out. ok is false when it failed or was answered other
// than 200 (then res is closed).
func postStream(ctx context.Context, client *http.Client, url string, body []byte) (res *http.Response, t0 time.Time, ok bool) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, t0, false
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	t0 = time.Now()
	if res, err = client.Do(req); err != nil {
		return nil, t0, false
	}
	if res.StatusCode != http.StatusOK {
		closeDrained(res)
		return nil, t0, false
	}
	return res, t0, true
}

// closeDrained reads the rest of res's body and closes it, so that its
// connection is reused.
func closeDrained(res *http.Response) {
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
}

// timeStream times a job's stream, read as its events' kinds, from t0:
// first is the time to the first "output" (0 when the job had none), last
// the time to "done"; ok is false when the stream broke, ended without
// "done", or carried one of the kinds fails.
func timeStream(t0 time.Time, kinds iter.Seq2[string, error], fails ...string) (first, last time.Duration, ok bool) {
	for kind, err := range kinds {
		if err != nil {
			return 0, 0, false
		}
		switch {
		case kind == "output":
			if first == 0 {
				first = time.Since(t0)
			}
		case kind == "done":
			return first, time.Since(t0), true
		case slices.Contains(fails, kind):
			return 0, 0, false
		}
	}
	return 0, 0, false
}

// Input is the demo tokens worker's input for a job of outputs outputs of
// size bytes each: that many words, each followed by the space the worker
// sends after every word but the last (the last word is one byte longer
// instead, so every output is size bytes). size must be at least 2.
func Input(outputs, size int) string {
	word := strings.Repeat("x", size-1)
	return strings.Repeat(word+" ", outputs-1) + word + "x"
}

// Percentile is the p-th percentile (nearest rank) of d; 0 for none.
func Percentile(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := min(len(s)-1, (len(s)*p+99)/100-1)
	return s[max(i, 0)]
}

// Add merges o into r: samples and failures pooled, wall times summed, so
// JobsPerSec stays completed jobs over the time spent running them.
func (r *Result) Add(o Result) {
	r.First = append(r.First, o.First...)
	r.Last = append(r.Last, o.Last...)
	r.Failed += o.Failed
	r.Wall += o.Wall
	r.CPU += o.CPU
}

// FrameJob is Job for the opaque relay floor (FrameIngress): it posts body
// and reads the stream with the same SSE parser, expecting frames events
// and then the stream's end. first is the time to the first event, last to
// the frames-th; ok is false when the stream carried an "error" event,
// broke, or ended with another count.
func FrameJob(client *http.Client, url string, body []byte, frames int) JobFunc {
	return func(ctx context.Context) (first, last time.Duration, ok bool) {
		res, t0, ok := postStream(ctx, client, url, body)
		if !ok {
			return 0, 0, false
		}
		defer closeDrained(res)
		n := 0
		for ev, err := range sse.Read(res.Body, nil) {
			if err != nil || ev.Type == "error" {
				return 0, 0, false
			}
			n++
			if n == 1 {
				first = time.Since(t0)
			}
			if n == frames {
				last = time.Since(t0)
			}
		}
		return first, last, n == frames
	}
}
