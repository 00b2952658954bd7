package integration_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/switchyard/switchyard/integration/runs"
	"github.com/switchyard/switchyard/worker"
)

// SDK workers in the test process, against process nodes, and their own
// record of every handler they ran: the source of truth for "a job ran
// twice" in the kill tests and the fault suite.

// startProcWorker runs an SDK worker against a process node's gRPC address
// until the test ends. The caller waits for its registration in a view.
func startProcWorker(t *testing.T, n *procNode, cfg worker.Config, h worker.Handler) {
	t.Helper()
	cfg.Server = n.grpc
	cfg.Capabilities = []string{"model=demo"}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = worker.Run(ctx, cfg, h)
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// jobRun is one handler invocation.
type jobRun struct {
	id     string
	gen    uint64
	worker string
	// input is the job's input as the worker got it (JSON): how a run is
	// matched to a submission that was refused, which has no job id.
	input      string
	start, end time.Time
	outputs    int
	// completed: the handler returned a result (not cancelled, no error).
	completed bool
}

func (r jobRun) String() string {
	return fmt.Sprintf("%s@gen%d(%d outputs)", r.worker, r.gen, r.outputs)
}

// runLog records every handler start, in order.
type runLog struct {
	mu   sync.Mutex
	runs []*jobRun
}

// runPlan is what a recorded handler does: wait for gate (if any), then
// think (no output), then send outputs every apart and complete. With
// outputs = 0 it runs silently until cancelled; with every over a minute it
// runs until cancelled after its outputs.
type runPlan struct {
	gate    <-chan struct{}
	think   time.Duration
	outputs int
	every   time.Duration
}

// streaming returns a handler that records its run, waits for gate (if any),
// then sends n outputs every interval apart and completes (see runPlan).
func (l *runLog) streaming(name string, n int, every time.Duration, gate <-chan struct{}) worker.Handler {
	return l.handler(name, runPlan{gate: gate, outputs: n, every: every})
}

// handler returns a handler that records its run and follows p. Each output
// is {"by": name, "i": index}.
func (l *runLog) handler(name string, p runPlan) worker.Handler {
	return func(ctx context.Context, job *worker.Job, out *worker.Output) (any, error) {
		l.mu.Lock()
		r := &jobRun{id: job.ID, gen: job.Generation, worker: name, input: string(job.Input), start: time.Now()}
		l.runs = append(l.runs, r)
		l.mu.Unlock()
		completed := false
		defer func() {
			l.mu.Lock()
			r.end, r.completed = time.Now(), completed
			l.mu.Unlock()
		}()
		wait := func(d time.Duration, gate <-chan struct{}) error {
			var tc <-chan time.Time
			if gate == nil {
				t := time.NewTimer(d)
				defer t.Stop()
				tc = t.C
			}
			select {
			case <-gate:
			case <-tc:
			case <-ctx.Done():
				return ctx.Err()
			}
			return nil
		}
		if p.gate != nil {
			if err := wait(0, p.gate); err != nil {
				return nil, err
			}
		}
		if p.think > 0 {
			if err := wait(p.think, nil); err != nil {
				return nil, err
			}
		}
		for i := range p.outputs {
			if err := out.Send(ctx, map[string]any{"by": name, "i": i}); err != nil {
				return nil, err
			}
			l.mu.Lock()
			r.outputs++
			l.mu.Unlock()
			if i < p.outputs-1 || p.every > time.Minute {
				if err := wait(p.every, nil); err != nil {
					return nil, err
				}
			}
		}
		if p.outputs == 0 {
			<-ctx.Done()
			return nil, ctx.Err()
		}
		completed = true
		return map[string]any{"by": name}, nil
	}
}

func (l *runLog) all() []jobRun {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]jobRun, len(l.runs))
	for i, r := range l.runs {
		out[i] = *r
	}
	return out
}

func (l *runLog) startedOn(name string) []jobRun {
	var out []jobRun
	for _, r := range l.all() {
		if r.worker == name {
			out = append(out, r)
		}
	}
	return out
}

// byJob groups the runs by job id, in start order.
func (l *runLog) byJob() map[string][]jobRun {
	out := map[string][]jobRun{}
	for _, r := range l.all() {
		out[r.id] = append(out[r.id], r)
	}
	return out
}

// record is r as the workers' record the at-most-once check reads.
func (r jobRun) record() runs.Run {
	return runs.Run{Worker: r.worker, Gen: r.gen, Start: r.start, End: r.end}
}

// runViolations says how a job's runs (in start order) broke at-most-once
// (runs.Violations), given the generations whose output its requester saw.
func runViolations(attempts []uint64, rs []jobRun) []string {
	recs := make([]runs.Run, len(rs))
	for i, r := range rs {
		recs[i] = r.record()
	}
	return runs.Violations(attempts, recs, nil)
}
