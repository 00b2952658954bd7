//go:build faults

package integration_test

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	sse "github.com/tmaxmax/go-sse"

	"github.com/switchyard/switchyard/integration/loadgen"
)

// The requesters: a closed loop of clients, each posting one streamed job,
// reading its SSE stream to the end, and posting the next. A client whose
// POST fails in transport (its ingress is gone) moves to the next ingress
// in the list, as a client behind a load balancer would. Every job is
// recorded as its client saw it, with arrival times.

// loadJob is one POST and its stream: its client (-1: posted outside the
// loop) and its input as posted (JSON), unique per job.
type loadJob struct {
	loadgen.Job
	client int
	input  string
}

type loadGen struct {
	queue     string
	ttl       time.Duration
	ingresses []*procNode
	// failoverOn are the refusal codes after which a client moves to the
	// next ingress, as a load balancer that reads /readyz would (a
	// transport error always moves it).
	failoverOn []string
	// extra are envelope members added to every job's, as JSON text
	// starting with a comma (set before the first job).
	extra string

	*loadgen.Loop[loadJob]
}

// startLoad runs clients closed-loop clients against ingresses (in failover
// order) until stop. Client k starts k×stagger after the first, so that the
// jobs in flight at any moment are at every stage of their run (all
// starting together, they would stay in step: a fault would catch all of
// them thinking, or all streaming). A client moves to the next ingress
// after a transport error, or a refusal with one of the codes failoverOn.
func startLoad(t *testing.T, ingresses []*procNode, queue string, clients int, stagger, ttl time.Duration, failoverOn ...string) *loadGen {
	g := &loadGen{queue: queue, ttl: ttl, ingresses: ingresses, failoverOn: failoverOn, Loop: loadgen.NewLoop[loadJob](clients)}
	g.Start(clients, stagger, g.runClient)
	t.Cleanup(func() {
		g.Stop()
		g.Halt()
	})
	return g
}

func (g *loadGen) runClient(c int) {
	ing := 0
	for k := 0; !g.Stopping.Load(); k++ {
		n := g.ingresses[ing]
		j := &loadJob{client: c, Job: loadgen.Job{Ingress: n.name}}
		g.Add(j)
		pause := g.do(j, n, fmt.Sprintf("c%d-%d", c, k))
		g.Mu.Lock()
		failover := j.PostErr != "" || slices.Contains(g.failoverOn, j.Refusal)
		g.Mu.Unlock()
		if failover {
			ing = (ing + 1) % len(g.ingresses)
		}
		if !g.Pause(pause) {
			return
		}
	}
}

// do posts one job and reads its stream to the end. It returns how long the
// client waits before its next job: after a refusal, what Retry-After says
// (between 200ms and 1s); a moment after a transport error; none after a
// stream.
func (g *loadGen) do(j *loadJob, n *procNode, input string) time.Duration {
	body := fmt.Sprintf(`{"ttl_ms":%d,"input":%q%s}`, g.ttl.Milliseconds(), input, g.extra)
	req, _ := http.NewRequestWithContext(g.Ctx, http.MethodPost, "http://"+n.http+"/v1/queues/"+g.queue+"/jobs", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	g.Mu.Lock()
	j.SubmitAt, j.input = time.Now(), fmt.Sprintf("%q", input)
	g.Mu.Unlock()
	res, err := g.HTTP.Do(req)
	if err != nil {
		g.Mu.Lock()
		j.PostFailed(err, g.Halted.Load())
		g.Mu.Unlock()
		return 100 * time.Millisecond
	}
	defer res.Body.Close()
	if ok, wait := g.Answer(&j.Job, res); !ok {
		return wait
	}
	for ev, err := range sse.Read(res.Body, nil) {
		now := time.Now()
		if err != nil {
			g.Mu.Lock()
			if g.Halted.Load() {
				j.Open = true
			} else {
				j.Broken = err.Error()
			}
			j.EndAt = now
			g.Mu.Unlock()
			return 100 * time.Millisecond
		}
		g.Mu.Lock()
		j.Record(ev.Type, ev.Data, now)
		g.Mu.Unlock()
	}
	g.Mu.Lock()
	if j.EndAt.IsZero() {
		j.EndAt = time.Now() // ended with no terminal event
	}
	g.Mu.Unlock()
	return 0
}

// post posts one job to n outside the closed loop, as input, and reads
// its stream to the end in a goroutine of g's; view reads it.
func (g *loadGen) post(n *procNode, input string) *loadJob {
	j := &loadJob{client: -1, Job: loadgen.Job{Ingress: n.name}}
	g.Add(j)
	g.WG.Go(func() { g.do(j, n, input) })
	return j
}

// view copies one job of g's.
func (g *loadGen) view(j *loadJob) loadJob {
	g.Mu.Lock()
	defer g.Mu.Unlock()
	return cloneJob(j)
}

// snapshot copies every job recorded so far.
func (g *loadGen) snapshot() []loadJob { return g.Snapshot(cloneJob) }

func cloneJob(j *loadJob) loadJob {
	c := *j
	c.Job = j.Job.Clone()
	return c
}
