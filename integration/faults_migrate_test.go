//go:build faults

package integration_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/switchyard/switchyard/integration/loadgen"
)

// The migrate case (issue 24): a job posted with "on_worker_lost":
// "restart" streams from the worker of the host the case kills. Its
// stream must show exactly one restart event (data: the new stream
// generation, the new attempt, a reason, and the last seq of the old
// generation), then the new generation's outputs, all of them and in
// order, then one done; and the workers' record must show it never ran on
// two workers at once.

// migration is the job that opted into restarts, and its client.
type migration struct {
	g   *loadGen
	job *loadJob
	// elsewhere counts the jobs that opted in, posted first, and ran on a
	// worker the fault did not touch (they just complete).
	elsewhere int
}

// ended: there is no such job, or its stream has ended.
func (m *migration) ended() bool {
	if m == nil {
		return true
	}
	j := m.g.view(m.job)
	return j.Ended(time.Time{})
}

// requireRestartField skips the case unless the nodes read the envelope's
// on_worker_lost: a value of the wrong type must be refused invalid_field
// naming it. A node that does not know the member ignores it, as it does
// any unknown member (core/strictjson.go), and would run the job under
// "fail": the case would measure nothing. The probe asks for a capability
// no worker has, so a node that ignores the member refuses it
// no_capable_worker and runs nothing.
func (fx *faultRun) requireRestartField() {
	body := `{"ttl_ms":1000,"input":"probe","on_worker_lost":1,"capabilities":{"model":"no-such-model"}}`
	req, _ := http.NewRequest(http.MethodPost, "http://"+fx.cl.nodes["a"].http+"/v1/queues/"+faultQueue+"/jobs", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	c := &http.Client{Timeout: 10 * time.Second}
	defer c.CloseIdleConnections()
	res, err := c.Do(req)
	if err != nil {
		fx.t.Fatalf("probe for on_worker_lost: %v", err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(res.Body, 64<<10))
	var p struct{ Code, Field string }
	_ = json.Unmarshal(b, &p)
	if res.StatusCode != http.StatusBadRequest || p.Field != "on_worker_lost" {
		fx.t.Skipf(`the nodes do not read the envelope's "on_worker_lost" (a wrong type for it was answered %d %s, field %q, not 400 invalid_field on_worker_lost): `+
			"issue 24's migration has not landed, and this case needs it", res.StatusCode, p.Code, p.Field)
	}
}

// killUnderMigratingJob posts jobs that opt into restarts to a, one after
// another, until one runs on the target's worker and its requester has
// seen 3 of its outputs; then kills the target.
func (fx *faultRun) killUnderMigratingJob() {
	g := startLoad(fx.t, []*procNode{fx.cl.nodes["a"]}, faultQueue, 0, 0, jobTTL)
	g.extra = `,"on_worker_lost":"restart"`
	m := &migration{g: g}
	var hosted []string
	for w, n := range fx.workerNode {
		if n == fx.target {
			hosted = append(hosted, w)
		}
	}
	deadline := time.Now().Add(90 * time.Second)
	for k := 0; time.Now().Before(deadline); k++ {
		j := g.post(fx.cl.nodes["a"], fmt.Sprintf("migrate-%d", k))
		var run jobRun
		poll(fx.t, jobTTL, "a run of the job that opted into restarts", func() bool {
			v := g.view(j)
			if !v.EndAt.IsZero() && v.ID == "" {
				fx.t.Fatalf("the job that opted into restarts was not accepted: %d %s %s", v.Status, v.Refusal, v.PostErr)
			}
			rs := fx.runs.byJob()[v.ID]
			if v.ID == "" || len(rs) == 0 {
				return false
			}
			run = rs[0]
			return true
		})
		if !slices.Contains(hosted, run.worker) {
			m.elsewhere++
			continue
		}
		poll(fx.t, jobRunTime, "3 outputs of the job that opted into restarts at its requester", func() bool {
			n := 0
			for _, e := range g.view(j).Events {
				if e.Kind == "output" {
					n++
				}
			}
			return n >= 3
		})
		m.job = j
		fx.mig = m
		fx.note(time.Now(), fmt.Sprintf("the job that opted into restarts streams from %s (after %d that ran elsewhere)", run.worker, m.elsewhere))
		fx.kill()
		return
	}
	fx.t.Fatalf("no job that opted into restarts ran on a worker of %s in 90s (%d ran elsewhere)", fx.target, m.elsewhere)
}

// migrationVerdict is the migrated job as judged.
type migrationVerdict struct {
	id        string
	sequence  string
	runs      string
	problems  []string
	restartAt measure
	elsewhere int
}

// judgeMigration checks the job that opted into restarts against issue
// 24's rules (see the top of this file).
func (l *ledger) judgeMigration(m *migration) migrationVerdict {
	fx := l.fx
	j := m.g.view(m.job)
	rs := l.byJob[j.ID]
	v := migrationVerdict{id: j.ID, sequence: l.eventSequence(j), runs: l.describeRuns(rs), elsewhere: m.elsewhere}
	bad := func(format string, args ...any) { v.problems = append(v.problems, fmt.Sprintf(format, args...)) }
	// A job is never restarted while its worker may still run it: not at
	// the host's silence, only once its death is proven, as a job without
	// output is redelivered (the same bound).
	v.restartAt.limit = faultBounds(fx).redeliver.d + faultSlack
	if j.Status != 200 {
		bad("refused: %d %s %s", j.Status, j.Refusal, j.PostErr)
		return v
	}
	var restarts []int
	for i, e := range j.Events {
		if e.Kind == "restart" {
			restarts = append(restarts, i)
		}
	}
	switch {
	case len(restarts) == 0:
		if j.Ended(time.Time{}) {
			bad("no restart event; the stream ended %s %s", j.Terminal, j.Code)
		} else {
			bad("no restart event, and the stream is still open")
		}
		v.restartAt.miss(nil)
		return v
	case len(restarts) > 1:
		bad("%d restart events", len(restarts))
	}
	r := restarts[0]
	rv := j.Events[r]
	if r == 0 {
		bad("the restart event came first")
		return v
	}
	v.restartAt.add(rv.At.Sub(fx.faultAt), nil)
	var last uint64
	for _, e := range j.Events {
		if e.Seq <= last {
			bad("seq %d after %d", e.Seq, last)
			break
		}
		last = e.Seq
	}
	// The old generation: outputs from 0, in order, of one generation.
	old := outputEvents(j.Events[:r])
	if len(old) == 0 {
		bad("no output before the restart event")
	}
	oldGen, oldAttempt := uint64(0), uint64(0)
	for k, e := range old {
		if k == 0 {
			oldGen, oldAttempt = e.Gen, e.Attempt
		}
		if e.I != k || e.Gen != oldGen || e.Attempt != oldAttempt {
			bad("before the restart: output %d (gen %d, attempt %d) where %d of gen %d, attempt %d was due", e.I, e.Gen, e.Attempt, k, oldGen, oldAttempt)
			break
		}
	}
	if rv.Gen != oldGen+1 || rv.Attempt <= oldAttempt || rv.Reason == "" || rv.LastSeq != j.Events[r-1].Seq {
		bad("restart event gen %d, attempt %d, reason %q, last_seq %d; want gen %d, an attempt above %d, a reason, last_seq %d",
			rv.Gen, rv.Attempt, rv.Reason, rv.LastSeq, oldGen+1, oldAttempt, j.Events[r-1].Seq)
	}
	// The new generation: every output, in order, then one done, last.
	rest := j.Events[r+1:]
	outs := outputEvents(rest)
	for k, e := range outs {
		if e.I != k || e.Gen != rv.Gen || e.Attempt != outs[0].Attempt {
			bad("after the restart: output %d (gen %d, attempt %d) where %d of gen %d was due", e.I, e.Gen, e.Attempt, k, rv.Gen)
			break
		}
	}
	if len(outs) != jobOutputs {
		bad("the new generation sent %d of %d outputs", len(outs), jobOutputs)
	}
	if j.Terminals != 1 || j.Terminal != "done" || len(rest) == 0 || rest[len(rest)-1].Kind != "done" {
		bad("ended %s %s with %d terminal events; want one done, last", j.Terminal, j.Code, j.Terminals)
	}
	// The workers' record: its first run on the killed host's worker, never
	// two runs at once, each binding generation once, the last completed on
	// a live worker.
	switch {
	case len(rs) < 2:
		bad("%d runs in the workers' record; want the killed host's and another", len(rs))
	default:
		if !slices.Contains(fx.faulted, fx.workerNode[rs[0].worker]) {
			bad("its first run was on %s, not on the killed host", rs[0].worker)
		}
		for _, v := range runViolations(nil, rs) {
			bad("%s", v)
		}
		for k := 1; k < len(rs); k++ {
			if rs[k].gen <= rs[k-1].gen {
				bad("run %v after run %v: binding generations not rising", rs[k], rs[k-1])
			}
		}
		lr := rs[len(rs)-1]
		if slices.Contains(fx.faulted, fx.workerNode[lr.worker]) || !lr.completed {
			bad("its last run %v: want completed on a worker the fault did not touch", lr)
		}
	}
	return v
}

func outputEvents(es []loadgen.Event) []loadgen.Event {
	var out []loadgen.Event
	for _, e := range es {
		if e.Kind == "output" {
			out = append(out, e)
		}
	}
	return out
}

// eventSequence is a job's events, runs of outputs of one generation and
// attempt folded into one entry, times from the fault.
func (l *ledger) eventSequence(j loadJob) string {
	var parts []string
	for k := 0; k < len(j.Events); {
		e := j.Events[k]
		at := fmtOffset(e.At.Sub(l.fx.faultAt))
		switch e.Kind {
		case "output":
			n := k
			for n+1 < len(j.Events) && j.Events[n+1].Kind == "output" && j.Events[n+1].Gen == e.Gen && j.Events[n+1].Attempt == e.Attempt {
				n++
			}
			f := j.Events[n]
			parts = append(parts, fmt.Sprintf("output seq %d..%d i %d..%d (gen %d, attempt %d, by %s) %s..%s",
				e.Seq, f.Seq, e.I, f.I, e.Gen, e.Attempt, e.By, at, fmtOffset(f.At.Sub(l.fx.faultAt))))
			k = n + 1
			continue
		case "restart":
			parts = append(parts, fmt.Sprintf("restart seq %d {gen %d, attempt %d, reason %s, last_seq %d} %s", e.Seq, e.Gen, e.Attempt, e.Reason, e.LastSeq, at))
		case "error":
			parts = append(parts, fmt.Sprintf("error %s seq %d %s", e.Code, e.Seq, at))
		default:
			parts = append(parts, fmt.Sprintf("%s seq %d %s", e.Kind, e.Seq, at))
		}
		k++
	}
	return strings.Join(parts, " | ")
}

func checkMigrated(l *ledger, _ faultBoundSet) (string, string, bool, []string) {
	p := l.migrated.problems
	if len(p) == 0 {
		return "0 problems", "0", true, nil
	}
	return "0 problems", fmt.Sprint(len(p)), false, p
}

// String is the migrated job's part of the ledger.
func (v migrationVerdict) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "  the job that opted into restarts: %s (jobs that opted in and ran elsewhere first: %d)\n", v.id, v.elsewhere)
	fmt.Fprintf(&b, "    events: %s\n", v.sequence)
	fmt.Fprintf(&b, "    runs (workers' record): %s\n", v.runs)
	for _, p := range v.problems {
		fmt.Fprintf(&b, "    problem: %s\n", p)
	}
	return b.String()
}
