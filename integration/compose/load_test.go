//go:build compose

package compose_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	sse "github.com/tmaxmax/go-sse"

	"github.com/switchyard/switchyard/integration/loadgen"
)

// The requesters: clients in a closed loop, each posting one streamed job
// (Accept: text/event-stream) to a node's published port, reading its SSE
// stream to the end, then posting the next. Every job is recorded as its
// client saw it, with arrival times. A stream that ends without a terminal
// event is resumed from its last event id (as an EventSource would), at
// most three times; a client whose POST fails in transport moves to its
// next ingress, as behind a load balancer.

// The demo job: the tokens worker sends its input's words back, one every
// delay_ms, so a job is jobWords × jobDelay long (3s) and has output from
// its first 100ms on.
const (
	jobWords = 30
	jobDelay = 100 * time.Millisecond
	jobTTL   = 20 * time.Second
)

// clientSpec is a group of clients: what their jobs require, and the
// ingresses they use (client k starts at ingresses[k % len]).
type clientSpec struct {
	kind      string // a label for the ledger: "large", "small"
	model     string // the capability model=<model> the jobs require
	zone      string // the zone the jobs are kept in ("": any)
	clients   int
	ingresses []string
}

// loadJob is one POST and its stream: its clients' kind, what it
// requires, and how many times its stream was resumed.
type loadJob struct {
	loadgen.Job
	kind        string
	model, zone string // what the job requires
	resumes     int
}

type load struct {
	c *cluster
	*loadgen.Loop[loadJob]
}

// startLoad starts the clients, 250ms apart so the jobs in flight at any
// moment are at every stage of their run.
func startLoad(c *cluster, specs ...clientSpec) *load {
	total := 0
	for _, s := range specs {
		total += s.clients
	}
	l := &load{c: c, Loop: loadgen.NewLoop[loadJob](total)}
	var clients []func()
	for _, s := range specs {
		for i := range s.clients {
			clients = append(clients, func() { l.runClient(s, i) })
		}
	}
	l.Start(len(clients), 250*time.Millisecond, func(k int) { clients[k]() })
	c.t.Cleanup(l.Halt)
	return l
}

// startMixedLoad starts 6 clients of large jobs and 8 of small ones on
// ingresses, and waits until 4 large and 6 small jobs stream.
func startMixedLoad(t *testing.T, c *cluster, ingresses ...string) *load {
	t.Helper()
	l := startLoad(c,
		clientSpec{kind: "large", model: "large", clients: 6, ingresses: ingresses},
		clientSpec{kind: "small", model: "small", clients: 8, ingresses: ingresses})
	waitBusy(t, l, "large", 4, 0)
	waitBusy(t, l, "small", 6, 0)
	return l
}

func (l *load) runClient(s clientSpec, i int) {
	ing := i % len(s.ingresses)
	for !l.Stopping.Load() {
		j := &loadJob{Job: loadgen.Job{Ingress: s.ingresses[ing]}, kind: s.kind, model: s.model, zone: s.zone}
		l.Add(j)
		pause := l.do(j)
		l.Mu.Lock()
		failover := j.PostErr != ""
		l.Mu.Unlock()
		if failover {
			ing = (ing + 1) % len(s.ingresses)
		}
		if !l.Pause(pause) {
			return
		}
	}
}

// do posts one job and reads its stream to the end; it returns how long
// the client waits before its next job (after a refusal, Retry-After,
// between 200ms and 1s).
func (l *load) do(j *loadJob) time.Duration {
	words := make([]string, jobWords)
	for i := range words {
		words[i] = "w" + strconv.Itoa(i)
	}
	env := map[string]any{
		"ttl_ms": jobTTL.Milliseconds(), "input": strings.Join(words, " "),
		"capabilities": map[string]string{"model": j.model}, "options": map[string]any{"delay_ms": jobDelay.Milliseconds()},
	}
	if j.zone != "" {
		env["zone"] = j.zone
	}
	body, _ := json.Marshal(env)
	base, err := l.c.url(j.Ingress)
	l.Mu.Lock()
	j.SubmitAt = time.Now()
	l.Mu.Unlock()
	var res *http.Response
	if err == nil {
		req, _ := http.NewRequestWithContext(l.Ctx, http.MethodPost, base+"/v1/queues/demo/jobs", strings.NewReader(string(body)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "text/event-stream")
		res, err = l.HTTP.Do(req)
	}
	if err != nil {
		l.Mu.Lock()
		j.PostFailed(err, l.Halted.Load())
		l.Mu.Unlock()
		return 200 * time.Millisecond
	}
	if ok, wait := l.Answer(&j.Job, res); !ok {
		res.Body.Close()
		return wait
	}
	last, err := l.read(j, res)
	for err == nil && j.Terminals == 0 && j.resumes < 3 && j.ID != "" {
		// Ended without its terminal event: resume after the last event
		// seen, as an EventSource would.
		l.Mu.Lock()
		j.resumes++
		l.Mu.Unlock()
		req, _ := http.NewRequestWithContext(l.Ctx, http.MethodGet, base+"/v1/jobs/"+j.ID+"/events", nil)
		req.Header.Set("Last-Event-ID", last)
		if res, err = l.HTTP.Do(req); err == nil {
			if res.StatusCode != http.StatusOK {
				res.Body.Close()
				err = fmt.Errorf("resume: %s", res.Status)
			} else {
				last, err = l.read(j, res)
			}
		}
	}
	l.Mu.Lock()
	defer l.Mu.Unlock()
	switch {
	case j.Terminals > 0:
	case l.Halted.Load():
		j.Open = true
	case err != nil:
		j.Broken = err.Error()
	default:
		j.Broken = "stream ended without a terminal event"
	}
	if j.EndAt.IsZero() {
		j.EndAt = time.Now()
	}
	return 0
}

// read records a stream's events until it ends; it returns the last event
// id, and the transport error that ended it, if any.
func (l *load) read(j *loadJob, res *http.Response) (string, error) {
	defer res.Body.Close()
	last := ""
	for ev, err := range sse.Read(res.Body, nil) {
		now := time.Now()
		if err != nil {
			return last, err
		}
		if ev.LastEventID != "" {
			last = ev.LastEventID
		}
		l.Mu.Lock()
		j.Record(ev.Type, ev.Data, now)
		l.Mu.Unlock()
	}
	return last, nil
}

// drain stops the clients and waits up to timeout for their last streams
// to end, then cuts those still open (recorded as open: no terminal event).
func (l *load) drain(timeout time.Duration) {
	l.Stop()
	l.Drain(timeout)
}

// snapshot copies every job recorded so far.
func (l *load) snapshot() []loadJob {
	return l.Snapshot(func(j *loadJob) loadJob {
		c := *j
		c.Job = j.Job.Clone()
		return c
	})
}

// count returns how many jobs satisfy f, under the lock.
func (l *load) count(f func(*loadJob) bool) int { return l.Count(f) }
