//go:build faults

package integration_test

import (
	"fmt"
	"slices"
	"time"

	"github.com/switchyard/switchyard/integration/loadgen"
	"github.com/switchyard/switchyard/integration/stall"
)

// ledger is what one fault run did, computed from the requesters' record
// (loadJob) and the workers' own (jobRun): nothing here asks a node.
//
// Words, for a job in flight when the fault hit (posted before it, not yet
// ended):
//   - it depends on the fault when its ingress was a faulted node, or its
//     latest run started before the fault ran on a worker of a faulted node,
//     or it had no run yet and the queue's dispatcher was a faulted node;
//   - it had output when its requester had seen an output event before the
//     fault, or one from a run on a faulted node that started before the
//     recovery.
type ledger struct {
	fx      *faultRun
	jobs    []loadJob
	runs    []jobRun
	byJob   map[string][]jobRun
	jobByID map[string]*loadJob

	counts       loadgen.Counts
	broken, open int

	inflight, depOut, depNoOut, indep int
	inflightEnd                       measure

	// Examples (their count is the figure) of what must not happen.
	noTerminal, brokenLive, twice, disorder, refusedLive, failed, notRedone []string
	// rerunAfterOutput: runs that sent output on the worker and were run
	// again because no output reached the requester. Allowed (the ingress
	// decides), printed.
	rerunAfterOutput int
	// orphanRuns: runs going when the ingress was killed; orphansCompleted
	// of them ran to their end, their output going nowhere.
	orphanRuns, orphansCompleted int

	lostOut, orphans, redeliver, newDone measure
	// stall is issue 24's measure (faults_stall_test.go); stallLongest
	// its longest stall as a measure.
	stall                stall.Result
	stallLongest, passed measure
	// migrated is the migrate case's job that opted into restarts, judged
	// (faults_migrate_test.go).
	migrated migrationVerdict
	back     map[string]measure
	// backOnline and backWork are back's two parts, from the recovery.
	backOnline, backWork map[string]time.Duration
}

// measure is the largest of some durations, and how many never happened;
// with a limit (bound plus slack), examples of those over it or missing.
type measure struct {
	max      time.Duration
	n, never int
	limit    time.Duration
	late     []lateExample
}

// lateExample is one figure over its limit (d < 0: never), described.
type lateExample struct {
	d    time.Duration
	what string
}

// add records d; what describes it, should it be over the limit.
func (m *measure) add(d time.Duration, what func() string) {
	if m.n == 0 || d > m.max {
		m.max = d
	}
	m.n++
	if m.limit > 0 && d > m.limit && what != nil {
		m.late = append(m.late, lateExample{d, what()})
	}
}

// miss records one that never happened.
func (m *measure) miss(what func() string) {
	m.never++
	if what != nil {
		m.late = append(m.late, lateExample{-1, what()})
	}
}

// examples are the late ones, the missing first, then the latest first.
func (m *measure) examples() []string {
	late := slices.Clone(m.late)
	slices.SortStableFunc(late, func(a, b lateExample) int {
		switch {
		case a.d < 0 && b.d >= 0:
			return -1
		case b.d < 0 && a.d >= 0:
			return 1
		}
		return int((b.d - a.d) / time.Microsecond)
	})
	var out []string
	for _, e := range late {
		if e.d < 0 {
			out = append(out, "never: "+e.what)
		} else {
			out = append(out, fmt.Sprintf("%v: %s", e.d.Round(time.Millisecond), e.what))
		}
	}
	return out
}

func newLedger(fx *faultRun) *ledger {
	l := &ledger{fx: fx, jobs: fx.load.snapshot(), runs: fx.runs.all(), byJob: map[string][]jobRun{}, jobByID: map[string]*loadJob{},
		back:       map[string]measure{},
		backOnline: map[string]time.Duration{}, backWork: map[string]time.Duration{}}
	b := faultBounds(fx)
	l.lostOut.limit, l.orphans.limit = b.lostOut.d+faultSlack, b.lostOut.d+faultSlack
	l.redeliver.limit = b.redeliver.d + faultSlack
	for i := range l.jobs {
		if id := l.jobs[i].ID; id != "" {
			l.jobByID[id] = &l.jobs[i]
		}
	}
	for _, r := range l.runs {
		l.byJob[r.id] = append(l.byJob[r.id], r)
	}
	for i := range l.jobs {
		j := &l.jobs[i]
		l.count(j)
		l.judgeStream(j)
		if j.SubmitAt.Before(fx.faultAt) && !j.Ended(fx.faultAt) {
			l.judgeInflight(j)
		}
		l.judgeOutcome(j)
	}
	l.judgeRuns()
	l.measureNewDone()
	l.measureStall()
	l.measureBack()
	if fx.mig != nil {
		l.migrated = l.judgeMigration(fx.mig)
	}
	return l
}

// count adds j to the ledger's counts, and to its broken and open
// streams.
func (l *ledger) count(j *loadJob) {
	l.counts.Add(&j.Job)
	if j.Broken != "" {
		l.broken++
	}
	if j.Open {
		l.open++
	}
}

// judgeStream checks one stream: exactly one terminal event, last (or a
// transport error the client saw, which only a killed ingress excuses);
// events in sequence; outputs from one generation, each once, in order, all
// of them when it completed.
func (l *ledger) judgeStream(j *loadJob) {
	if (j.PostErr != "" || j.Broken != "") && !slices.Contains(l.fx.killed, j.Ingress) {
		l.brokenLive = append(l.brokenLive, l.describe(j))
	}
	if j.Status != 200 {
		return
	}
	switch {
	case j.Open, j.Terminals == 0 && j.Broken == "":
		l.noTerminal = append(l.noTerminal, l.describe(j))
	case j.Terminals > 1 || slices.ContainsFunc(j.Events, func(e loadgen.Event) bool { return e.AfterTerminal }):
		l.noTerminal = append(l.noTerminal, "more than one terminal event, or events after it: "+l.describe(j))
	}
	var last uint64
	next := 0
	for _, e := range j.Events {
		if e.Seq != 0 && e.Seq <= last {
			l.disorder = append(l.disorder, fmt.Sprintf("seq %d after %d: %s", e.Seq, last, l.describe(j)))
			return
		}
		last = max(last, e.Seq)
		if e.Kind != "output" {
			continue
		}
		if e.I != next {
			l.disorder = append(l.disorder, fmt.Sprintf("output %d where %d was due: %s", e.I, next, l.describe(j)))
			return
		}
		next++
	}
	if as := j.Attempts(); len(as) > 1 {
		l.disorder = append(l.disorder, fmt.Sprintf("output from generations %v: %s", as, l.describe(j)))
	} else if j.Terminal == "done" && next != jobOutputs {
		l.disorder = append(l.disorder, fmt.Sprintf("completed with %d of %d outputs: %s", next, jobOutputs, l.describe(j)))
	}
}

// judgeInflight sorts a job in flight at the fault and measures how it
// ended against the bounds for its kind.
func (l *ledger) judgeInflight(j *loadJob) {
	fx := l.fx
	l.inflight++
	if j.Ended(time.Time{}) {
		l.inflightEnd.add(j.EndAt.Sub(fx.faultAt), nil)
	} else {
		l.inflightEnd.miss(nil)
	}
	// Output after the fault counts when it came from the faulted node's
	// run: a node that lost only its etcd member streams on until it fences.
	dep, withOut := l.depends(j), j.OutputBefore(fx.faultAt) || l.outputFromFaulted(j)
	switch {
	case !dep:
		l.indep++
	case withOut:
		l.depOut++
		what := func() string { return l.describe(j) }
		if j.Ended(time.Time{}) {
			l.lostOut.add(j.EndAt.Sub(fx.faultAt), what)
		} else {
			l.lostOut.miss(what)
		}
	default:
		l.depNoOut++
		if fx.c.ingress {
			return // its requester is gone with the ingress
		}
		what := func() string { return l.describe(j) }
		if r, ok := l.firstRunAfter(j.ID, fx.faultAt); ok {
			l.redeliver.add(r.start.Sub(fx.faultAt), what)
		} else if j.Terminal != "done" {
			l.redeliver.miss(what)
		}
		if j.Terminal != "done" {
			l.notRedone = append(l.notRedone, l.describe(j))
		}
	}
}

func (l *ledger) depends(j *loadJob) bool {
	fx := l.fx
	if slices.Contains(fx.faulted, j.Ingress) {
		return true
	}
	var last *jobRun
	for _, r := range l.byJob[j.ID] {
		if r.start.Before(fx.faultAt) {
			last = &r
		}
	}
	if last != nil {
		return slices.Contains(fx.faulted, fx.workerNode[last.worker])
	}
	return slices.Contains(fx.faulted, fx.dispatcher)
}

func (l *ledger) firstRunAfter(id string, t time.Time) (jobRun, bool) {
	for _, r := range l.byJob[id] {
		if !r.start.Before(t) {
			return r, true
		}
	}
	return jobRun{}, false
}

// judgeOutcome: a refusal, or a job that ended in error, must be excused by
// the fault: no quorum anywhere (for jobs posted before the nodes' bound to
// come back has passed), or output seen from a run on a faulted node
// (worker_lost is then the right end).
func (l *ledger) judgeOutcome(j *loadJob) {
	fx := l.fx
	outage := fx.c.noQuorum && j.SubmitAt.Before(fx.recoverAt.Add(faultBounds(fx).back.d+faultSlack))
	switch {
	case outage:
	case j.Status != 0 && j.Status != 200:
		l.refusedLive = append(l.refusedLive, l.describe(j))
	case j.Terminal == "error" && !l.outputFromFaulted(j):
		l.failed = append(l.failed, l.describe(j))
	}
}

// outputFromFaulted: the requester saw output from a run on a faulted node
// that started before the recovery (not from the node once it is back).
func (l *ledger) outputFromFaulted(j *loadJob) bool {
	for _, a := range j.Attempts() {
		for _, r := range l.byJob[j.ID] {
			if r.gen == a && r.start.Before(l.fx.recoverAt) && slices.Contains(l.fx.faulted, l.fx.workerNode[r.worker]) {
				return true
			}
		}
	}
	return false
}

// judgeRuns checks every job the workers ran (known to a requester or not)
// for at-most-once, and measures how long runs orphaned by a killed ingress
// went on.
func (l *ledger) judgeRuns() {
	fx := l.fx
	for id, rs := range l.byJob {
		j := l.jobByID[id]
		var attempts []uint64
		if j != nil {
			attempts = j.Attempts()
		}
		vs := runViolations(attempts, rs)
		for _, r := range rs {
			if j != nil && j.Terminals > 0 && r.start.After(j.EndAt) {
				vs = append(vs, fmt.Sprintf("run %v started %v after its requester's terminal event", r, r.start.Sub(j.EndAt).Round(time.Millisecond)))
			}
		}
		if len(vs) > 0 {
			l.twice = append(l.twice, fmt.Sprintf("job %s: %s; runs %s", id, vs[0], l.describeRuns(rs)))
		}
		for i := 0; i+1 < len(rs); i++ {
			if rs[i].outputs > 0 {
				l.rerunAfterOutput++
			}
		}
		if !fx.c.ingress {
			continue
		}
		for _, r := range rs {
			if r.start.Before(fx.faultAt) && (r.end.IsZero() || r.end.After(fx.faultAt)) {
				l.orphanRuns++
				if r.completed {
					l.orphansCompleted++
				}
				what := func() string { return "job " + id + ": run " + l.describeRuns([]jobRun{r}) }
				if r.end.IsZero() {
					l.orphans.miss(what)
				} else {
					l.orphans.add(r.end.Sub(fx.faultAt), what)
				}
			}
		}
	}
}

// measureNewDone: the first completion of a job posted at or after the
// origin (the fault, or its heal when no node could work).
func (l *ledger) measureNewDone() {
	o := l.fx.origin()
	first := time.Duration(-1)
	for _, j := range l.jobs {
		if j.Terminal == "done" && !j.SubmitAt.Before(o) {
			if d := j.EndAt.Sub(o); first < 0 || d < first {
				first = d
			}
		}
	}
	if first >= 0 {
		l.newDone.add(first, nil)
	} else {
		l.newDone.miss(nil)
	}
}

// measureBack: for each returning node, the later of (a) another node
// listing it online while its own /readyz answers 200, and (b) one of its
// workers starting a job posted after the recovery, counted from the
// recovery (SIGCONT, heal, restart).
// For a restart, (a) only counts from when the new process serves: until the
// old lease expires the view lists the old process online.
func (l *ledger) measureBack() {
	fx := l.fx
	for _, node := range fx.returning() {
		var m measure
		since := fx.recoverAt
		if fx.c.name == "restart-worker-host" {
			since = fx.servingAt
		}
		at := fx.obs.onlineAt(node, since)
		if !since.IsZero() && !at.IsZero() {
			l.backOnline[node] = at.Sub(fx.recoverAt)
		}
		work, hosts := l.tookWork(node)
		if !work.IsZero() {
			l.backWork[node] = work.Sub(fx.recoverAt)
		}
		if since.IsZero() || at.IsZero() || (hosts && work.IsZero()) {
			m.miss(nil)
		} else {
			m.add(maxTime(at, work).Sub(fx.recoverAt), nil)
		}
		l.back[node] = m
	}
}

// tookWork is when one of node's workers first started a job posted after
// the recovery; hosts says whether node has a worker at all.
func (l *ledger) tookWork(node string) (at time.Time, hosts bool) {
	fx := l.fx
	hosts = slices.Contains(fx.workerNodes(), node)
	for _, r := range l.runs {
		if fx.workerNode[r.worker] != node {
			continue
		}
		if j := l.jobByID[r.id]; j != nil && !j.SubmitAt.Before(fx.recoverAt) && (at.IsZero() || r.start.Before(at)) {
			at = r.start
		}
	}
	return at, hosts
}

// inflightEnded: every job in flight at the fault has ended.
func (l *ledger) inflightEnded() bool { return l.inflightEnd.never == 0 }

// allBack: every returning node is back and working.
func (l *ledger) allBack() bool {
	for _, node := range l.fx.returning() {
		if m := l.back[node]; m.n == 0 {
			return false
		}
	}
	return true
}

func (fx *faultRun) workerNodes() []string {
	var out []string
	for _, n := range fx.workerNode {
		out = append(out, n)
	}
	return out
}
