//go:build faults

package integration_test

import (
	"encoding/json"
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

// loadJob is one POST and its stream.
type loadJob struct {
	client  int
	ingress string
	// input is the job's input as posted (JSON), unique per job.
	input    string
	submitAt time.Time
	// status is the HTTP answer (0: none); refusal the problem code of a
	// non-200 one.
	status  int
	refusal string
	// postErr is a transport error before any answer.
	postErr string
	id      string
	events  []loadEvent
	// terminal (done or error), its code, and how many terminal events came.
	terminal, code string
	terminals      int
	// endAt is when the stream ended: its terminal event, a transport error,
	// or the end of the body.
	endAt time.Time
	// broken is a transport error after the answer (the stream broke).
	broken string
	// open: the stream was still open when the suite stopped waiting.
	open bool
}

// loadEvent is one SSE event of a job.
type loadEvent struct {
	kind          string
	at            time.Time
	seq, attempt  uint64
	i             int // output index, -1 when not an output
	by, code      string
	afterTerminal bool
	// gen is the stream generation the event belongs to; reason and
	// lastSeq are a restart event's (the previous generation's last seq).
	gen     uint64
	reason  string
	lastSeq uint64
}

// ended reports whether the stream ended by t (zero t: at all).
func (j *loadJob) ended(t time.Time) bool {
	return !j.endAt.IsZero() && (t.IsZero() || !j.endAt.After(t))
}

// outputBefore reports whether the requester saw output before t.
func (j *loadJob) outputBefore(t time.Time) bool {
	return slices.ContainsFunc(j.events, func(e loadEvent) bool { return e.kind == "output" && e.at.Before(t) })
}

// attempts are the distinct generations of the job's outputs.
func (j *loadJob) attempts() []uint64 {
	var out []uint64
	for _, e := range j.events {
		if e.kind == "output" && !slices.Contains(out, e.attempt) {
			out = append(out, e.attempt)
		}
	}
	return out
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
		j := &loadJob{client: c, ingress: n.name}
		g.Add(j)
		pause := g.do(j, n, fmt.Sprintf("c%d-%d", c, k))
		g.Mu.Lock()
		failover := j.postErr != "" || slices.Contains(g.failoverOn, j.refusal)
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
	j.submitAt, j.input = time.Now(), fmt.Sprintf("%q", input)
	g.Mu.Unlock()
	res, err := g.HTTP.Do(req)
	if err != nil {
		g.Mu.Lock()
		j.endAt = time.Now()
		if g.Halted.Load() {
			j.open = true
		} else {
			j.postErr = err.Error()
		}
		g.Mu.Unlock()
		return 100 * time.Millisecond
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		code, wait := loadgen.Refusal(res)
		g.Mu.Lock()
		j.status, j.refusal, j.endAt = res.StatusCode, code, time.Now()
		g.Mu.Unlock()
		return wait
	}
	g.Mu.Lock()
	j.status, j.id = res.StatusCode, res.Header.Get("X-Job-Id")
	g.Mu.Unlock()
	for ev, err := range sse.Read(res.Body, nil) {
		now := time.Now()
		if err != nil {
			g.Mu.Lock()
			if g.Halted.Load() {
				j.open = true
			} else {
				j.broken = err.Error()
			}
			j.endAt = now
			g.Mu.Unlock()
			return 100 * time.Millisecond
		}
		e := parseLoadEvent(ev, now)
		g.Mu.Lock()
		e.afterTerminal = j.terminals > 0
		j.events = append(j.events, e)
		if j.id == "" {
			j.id = eventJobID(ev)
		}
		if e.kind == "done" || e.kind == "error" {
			j.terminals++
			if j.terminals == 1 {
				j.terminal, j.code, j.endAt = e.kind, e.code, now
			}
		}
		g.Mu.Unlock()
	}
	g.Mu.Lock()
	if j.endAt.IsZero() {
		j.endAt = time.Now() // ended with no terminal event
	}
	g.Mu.Unlock()
	return 0
}

func parseLoadEvent(ev sse.Event, at time.Time) loadEvent {
	var d struct {
		Gen, Seq, Attempt uint64
		Code, Reason      string
		LastSeq           uint64 `json:"last_seq"`
		Data              struct {
			By string
			I  *int
		}
	}
	_ = json.Unmarshal([]byte(ev.Data), &d)
	e := loadEvent{kind: ev.Type, at: at, seq: d.Seq, attempt: d.Attempt, code: d.Code, by: d.Data.By, i: -1,
		gen: d.Gen, reason: d.Reason, lastSeq: d.LastSeq}
	if ev.Type == "output" && d.Data.I != nil {
		e.i = *d.Data.I
	}
	return e
}

func eventJobID(ev sse.Event) string {
	var d struct {
		JobID string `json:"job_id"`
	}
	_ = json.Unmarshal([]byte(ev.Data), &d)
	return d.JobID
}

// post posts one job to n outside the closed loop, as input, and reads
// its stream to the end in a goroutine of g's; view reads it.
func (g *loadGen) post(n *procNode, input string) *loadJob {
	j := &loadJob{client: -1, ingress: n.name}
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
	c.events = slices.Clone(j.events)
	return c
}
