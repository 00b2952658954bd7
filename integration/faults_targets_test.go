//go:build faults

package integration_test

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// faultBound is one timing target: a duration before slack, and where it
// comes from, as printed.
type faultBound struct {
	d   time.Duration
	why string
}

// faultBoundSet is issue 12's timing targets for one run.
type faultBoundSet struct {
	// lostOut: a job in flight that had output, on a node that fell silent,
	// ends within 4 heartbeat intervals of the fault (the heartbeat silence
	// bound is about 3). The same bound applies to the runs orphaned by a
	// killed ingress.
	lostOut faultBound
	// redeliver: a job without output there runs again once death is
	// proven: the lease TTL plus one heartbeat, or, when the node came back
	// as a new incarnation, one heartbeat after the new one serves.
	redeliver faultBound
	// newDone: new jobs complete again within the same bound as redelivery
	// (plus the time one job takes to run); when no node could work, from
	// the heal, within the nodes' own way back (back) plus a job's run.
	newDone faultBound
	// back: a paused (partitioned, restarted) node is online within 2 lease
	// TTLs of its SIGCONT (heal, restart), and takes work.
	back faultBound
	// stall: issue 24's target (stallBounds): no new job waits while a
	// live slot is free and nothing starts for longer than 2 heartbeats
	// after a worker host's fault, 4 after the dispatcher's node's.
	stall faultBound
}

func faultBounds(fx *faultRun) faultBoundSet {
	ttl, hb := fx.timing.leaseTTL, fx.timing.heartbeat
	b := faultBoundSet{
		lostOut:   faultBound{4 * hb, "4 heartbeats"},
		redeliver: faultBound{ttl + hb, "lease TTL + 1 heartbeat"},
		newDone:   faultBound{ttl + hb + jobRunTime, "lease TTL + 1 heartbeat + a job's run"},
		back:      faultBound{2 * ttl, "2 lease TTLs"},
	}
	_, b.stall = stallBounds(fx)
	if fx.c.leaderLost {
		// The survivors elect a leader at most two election timeouts and a
		// raft heartbeat after the cut (2.1s with etcd's timing, set in
		// catalog/embed.go), and the new leader then sets every lease to
		// expire one election timeout plus its TTL later: the faulted
		// node's record can outlive the cut by TTL + 3.1s, whatever its
		// last renewal (docs/cluster.md, "The catalog's own leader
		// election").
		const election, electionTimeout = 2100 * time.Millisecond, time.Second
		b.redeliver = faultBound{ttl + election + electionTimeout + hb, "lease TTL + etcd's election and lease promotion (3.1s) + 1 heartbeat"}
		b.newDone = faultBound{b.redeliver.d + jobRunTime, "the same + a job's run"}
	}
	if fx.c.incarnation && !fx.servingAt.IsZero() {
		b.redeliver = faultBound{fx.servingAt.Sub(fx.faultAt) + hb, fmt.Sprintf("new incarnation serving at %v + 1 heartbeat", fmtOffset(fx.servingAt.Sub(fx.faultAt)))}
	}
	if fx.c.noQuorum {
		b.newDone = faultBound{b.back.d + jobRunTime, "from the heal: 2 lease TTLs + a job's run"}
	}
	return b
}

// faultTarget is one row of the ledger: a target of issue 12, the cases it
// applies to, and how the ledger measures it.
type faultTarget struct {
	id, what string
	applies  func(c faultCase) bool
	// check returns the target as printed, the measured figure, whether it
	// is met, and examples when it is not.
	check func(l *ledger, b faultBoundSet) (target, measured string, ok bool, examples []string)
}

var faultTargets = []faultTarget{
	{"no-terminal", "streams with no terminal event (or not exactly one, last)", always, zero(func(l *ledger) []string { return l.noTerminal })},
	{"broken", "streams broken in transport while their ingress lived", always, zero(func(l *ledger) []string { return l.brokenLive })},
	{"twice", "jobs executed more than once (the workers' record)", always, zero(func(l *ledger) []string { return l.twice })},
	{"order", "jobs whose output was duplicated, out of order, missing, or from two generations", always, zero(func(l *ledger) []string { return l.disorder })},
	{"fenced", "healthy nodes (not faulted, quorum reachable) that fenced", func(c faultCase) bool { return !c.noQuorum }, checkHealthyFenced},
	{"lost-output", "in flight with output on the silent node: fault → last terminal event", func(c faultCase) bool { return c.silent && !c.ingress },
		within(func(l *ledger) measure { return l.lostOut }, func(b faultBoundSet) faultBound { return b.lostOut })},
	{"orphans", "runs of the killed ingress's jobs: fault → last one stopped", func(c faultCase) bool { return c.ingress },
		within(func(l *ledger) measure { return l.orphans }, func(b faultBoundSet) faultBound { return b.lostOut })},
	{"redelivery", "in flight without output on the faulted node: fault → its new run", func(c faultCase) bool { return !c.ingress && !c.noQuorum },
		within(func(l *ledger) measure { return l.redeliver }, func(b faultBoundSet) faultBound { return b.redeliver })},
	{"not-redone", "in flight without output on the faulted node, not completed", func(c faultCase) bool { return !c.ingress && !c.noQuorum },
		zero(func(l *ledger) []string { return l.notRedone })},
	{"refused", "refused while a capable worker lives", always, zero(func(l *ledger) []string { return l.refusedLive })},
	{"failed", "ended in error without output from the faulted node", always, zero(func(l *ledger) []string { return l.failed })},
	{"stall", "longest stall: new jobs waiting, a live slot free, no start (fault → end of hold)", stallApplies,
		within(func(l *ledger) measure { return l.stallLongest }, func(b faultBoundSet) faultBound { return b.stall })},
	// The stall targets hold every case with a quorum to a first start of
	// new work within 2-4 heartbeats, which bounds its first completion
	// too (plus a job's run); without a quorum there is no stall to
	// measure, and the first completion after the heal is the target.
	{"held", "new job held: waiting on after a later one started on a live worker (dispatcher faults)", heldApplies,
		within(func(l *ledger) measure { return l.passed }, func(b faultBoundSet) faultBound { return b.stall })},
	{"new-done", "heal → first completion of a job posted after it (no quorum)", func(c faultCase) bool { return c.noQuorum },
		within(func(l *ledger) measure { return l.newDone }, func(b faultBoundSet) faultBound { return b.newDone })},
	{"migrated", "the job that opted into restarts: one restart event, the new generation whole and in order, done, never run twice at once", func(c faultCase) bool { return c.migrate }, checkMigrated},
	{"restart-at", "fault → the restart event of the job that opted into restarts", func(c faultCase) bool { return c.migrate },
		within(func(l *ledger) measure { return l.migrated.restartAt }, func(b faultBoundSet) faultBound { return b.redeliver })},
	{"back", "SIGCONT/heal/restart → faulted node online in another's view, ready, taking work", func(c faultCase) bool { return c.returns }, checkBack},
}

func always(faultCase) bool { return true }

func zero(examples func(*ledger) []string) func(*ledger, faultBoundSet) (string, string, bool, []string) {
	return func(l *ledger, _ faultBoundSet) (string, string, bool, []string) {
		ex := examples(l)
		return "0", fmt.Sprint(len(ex)), len(ex) == 0, ex
	}
}

func within(get func(*ledger) measure, bound func(faultBoundSet) faultBound) func(*ledger, faultBoundSet) (string, string, bool, []string) {
	return func(l *ledger, bs faultBoundSet) (string, string, bool, []string) {
		m, b := get(l), bound(bs)
		target := fmt.Sprintf("≤ %v (%s) + %v", b.d.Round(time.Millisecond), b.why, faultSlack)
		switch {
		case m.never > 0:
			return target, fmt.Sprintf("never, for %d of %d", m.never, m.n+m.never), false, m.examples()
		case m.n == 0:
			return target, "no such job", true, nil
		}
		return target, fmt.Sprintf("%v (latest of %d)", m.max.Round(time.Millisecond), m.n), m.max <= b.d+faultSlack, m.examples()
	}
}

func checkBack(l *ledger, b faultBoundSet) (string, string, bool, []string) {
	target := fmt.Sprintf("≤ %v (%s) + %v", b.back.d, b.back.why, faultSlack)
	var parts []string
	ok := true
	for _, node := range l.fx.returning() {
		m := l.back[node]
		switch {
		case m.n == 0:
			ok = false
			parts = append(parts, node+": never")
		default:
			ok = ok && m.max <= b.back.d+faultSlack
			parts = append(parts, fmt.Sprintf("%s: %v", node, m.max.Round(time.Millisecond)))
		}
	}
	var ex []string
	if !ok {
		for _, node := range l.fx.returning() {
			ex = append(ex, fmt.Sprintf("%s in the view of a (else b, c), from the recovery: %s", node, l.fx.obs.history(node, l.fx.recoverAt)))
		}
	}
	return target, strings.Join(parts, ", "), ok, ex
}

func checkHealthyFenced(l *ledger, _ faultBoundSet) (string, string, bool, []string) {
	var ex []string
	for _, e := range l.fx.logEntries() {
		if isFence(e) && !slices.Contains(l.fx.faulted, e.node) {
			ex = append(ex, fmt.Sprintf("%s %s: %s %s", e.node, fmtOffset(e.at.Sub(l.fx.faultAt)), e.msg, e.rest))
		}
	}
	nodes := map[string]bool{}
	for _, e := range ex {
		nodes[strings.Fields(e)[0]] = true
	}
	return "0", fmt.Sprint(len(nodes)), len(nodes) == 0, ex
}

// String is the ledger as printed after each run.
func (l *ledger) String() string {
	fx := l.fx
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	p("ledger of %s: %s", fx.c.name, fx.c.what)
	p("  network: %s", fx.net.mode())
	p("  roles at the fault: ingress a (clients fail over to b), dispatcher %s, etcd leader %s, worker hosts b (wb) and c (wc), target %s", fx.dispatcher, fx.leader, fx.target)
	p("  timeline: %s", strings.Join(fx.timeline, "; "))
	p("  jobs: submitted %d, accepted %d, completed %d; refused by code: %s; ended by code: %s; POST transport errors %d, streams broken %d, still open at the end %d",
		l.counts.Submitted, l.counts.Accepted, l.counts.Ended["completed"], fmtCounts(l.counts.Refused), fmtCounts(l.counts.Ended), l.counts.PostErrors, l.broken, l.open)
	p("  in flight at the fault: %d (depending on it: %d with output, %d without; not: %d); fault → last terminal event of them: %s",
		l.inflight, l.depOut, l.depNoOut, l.indep, fmtMeasure(l.inflightEnd))
	p("  runs: %d; run again after their worker had sent output that never reached the requester (allowed): %d", len(l.runs), l.rerunAfterOutput)
	p("  %s", l.firstAnswers())
	p("  %s", l.stallLine())
	p("  new jobs: fault (heal, without quorum) → first completion of a job posted after it: %s", fmtMeasure(l.newDone))
	if fx.mig != nil {
		b.WriteString(l.migrated.String())
	}
	if fx.c.ingress {
		p("  runs going when the ingress died: %d, of which %d ran to their end", l.orphanRuns, l.orphansCompleted)
	}
	for _, node := range fx.returning() {
		work := "(it hosts no worker)"
		if slices.Contains(fx.workerNodes(), node) {
			work = fmtSince(l.backWork, node)
		}
		p("  %s: online in another node's view and ready %s after the recovery; first job posted after it started on its worker %s; its state from the fault: %s",
			node, fmtSince(l.backOnline, node), work, fx.obs.history(node, fx.faultAt))
	}
	bounds := faultBounds(fx)
	p("  %-86s %-44s %-26s %s", "target", "bound", "measured", "")
	var examples []string
	for _, tg := range faultTargets {
		if !tg.applies(fx.c) {
			p("  %-86s %-44s %-26s %s", tg.what, "-", "-", "n/a")
			continue
		}
		target, measured, ok, ex := tg.check(l, bounds)
		status := "ok"
		if !ok {
			status = "FAIL"
			for i, e := range ex {
				if i == 4 {
					examples = append(examples, fmt.Sprintf("    %s: … and %d more", tg.id, len(ex)-i))
					break
				}
				examples = append(examples, fmt.Sprintf("    %s: %s", tg.id, e))
			}
		}
		p("  %-86s %-44s %-26s %s", tg.what, target, measured, status)
	}
	if len(examples) > 0 {
		p("  examples (times from the fault):")
		b.WriteString(strings.Join(examples, "\n") + "\n")
	}
	p("  node logs from 1s before the fault, WARN and ERROR lines by message (count, first..last):")
	b.WriteString(fx.logSummary())
	return b.String()
}

func fmtSince(m map[string]time.Duration, node string) string {
	if d, ok := m[node]; ok {
		return d.Round(time.Millisecond).String()
	}
	return "never"
}

func fmtCounts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s %d", k, v))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

func fmtMeasure(m measure) string {
	if m.never > 0 {
		return fmt.Sprintf("never, for %d of %d", m.never, m.n+m.never)
	}
	if m.n == 0 {
		return "none"
	}
	return m.max.Round(time.Millisecond).String()
}

// timingTargets are the rows that measure how soon, not whether.
var timingTargets = []string{"lost-output", "orphans", "redelivery", "new-done", "back", "stall", "held", "restart-at"}

// timingReported: with FAULTS_TIMING=report (what .ci/run sets), a missed
// timing target is printed in the ledger but does not fail the run. CI's
// machine is shared and noisy, and the project shows timing by figures,
// not by tests that fail on a timing; every other target (nothing lost,
// nothing run twice, no refusal, no job failed, a node back at all) still
// fails it, as does "never" where a time was due. `make faults` without it
// asserts every target.
func timingReported(id, measured string) bool {
	return os.Getenv("FAULTS_TIMING") == "report" && slices.Contains(timingTargets, id) &&
		!strings.Contains(measured, "never")
}

// assert fails the test for every target missed, and returns their ids
// (a timing target only reported is among them, marked so).
func (l *ledger) assert(t *testing.T) []string {
	t.Helper()
	var failed []string
	bounds := faultBounds(l.fx)
	for _, tg := range faultTargets {
		if !tg.applies(l.fx.c) {
			continue
		}
		if target, measured, ok, _ := tg.check(l, bounds); !ok {
			if timingReported(tg.id, measured) {
				t.Logf("%s: %s: target %s, measured %s: a timing target, reported and not failed (FAULTS_TIMING=report)", l.fx.c.name, tg.what, target, measured)
				failed = append(failed, tg.id+" (timing, reported)")
				continue
			}
			failed = append(failed, tg.id)
			t.Errorf("%s: %s: target %s, measured %s", l.fx.c.name, tg.what, target, measured)
		}
	}
	return failed
}

// --- node logs ---

// logEntry is one line of a node's log (slog's text format).
type logEntry struct {
	node             string
	at               time.Time
	level, msg, rest string
}

var logLineRE = regexp.MustCompile(`^time=(\S+) level=(\S+) msg=("(?:[^"\\]|\\.)*"|\S+) ?(.*)$`)

func (fx *faultRun) logEntries() []logEntry {
	var out []logEntry
	for _, name := range fx.cl.names {
		b, _ := os.ReadFile(fx.cl.nodes[name].log)
		for _, line := range strings.Split(string(b), "\n") {
			m := logLineRE.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			at, err := time.Parse(time.RFC3339Nano, m[1])
			if err != nil {
				continue
			}
			out = append(out, logEntry{node: name, at: at, level: m[2], msg: strings.Trim(m[3], `"`), rest: m[4]})
		}
	}
	return out
}

func isFence(e logEntry) bool {
	return strings.Contains(e.msg, "lease lost") && strings.Contains(e.msg, "fencing")
}

// logSummary groups each node's WARN and ERROR lines from a second before
// the fault by message.
func (fx *faultRun) logSummary() string {
	type group struct {
		node, level, msg, example string
		n                         int
		first, last               time.Time
	}
	groups := map[string]*group{}
	for _, e := range fx.logEntries() {
		if (e.level != "WARN" && e.level != "ERROR") || e.at.Before(fx.faultAt.Add(-time.Second)) {
			continue
		}
		k := e.node + "\x00" + e.msg
		g := groups[k]
		if g == nil {
			g = &group{node: e.node, level: e.level, msg: e.msg, example: e.rest, first: e.at}
			groups[k] = g
		}
		g.n++
		g.last = e.at
	}
	var gs []*group
	for _, g := range groups {
		gs = append(gs, g)
	}
	sort.Slice(gs, func(i, j int) bool { return gs[i].first.Before(gs[j].first) })
	var b strings.Builder
	for _, g := range gs {
		ex := g.example
		if len(ex) > 240 {
			ex = ex[:240] + "…"
		}
		fmt.Fprintf(&b, "    %s %s..%s ×%d %s %q: %s\n", g.node, fmtOffset(g.first.Sub(fx.faultAt)), fmtOffset(g.last.Sub(fx.faultAt)), g.n, g.level, g.msg, ex)
	}
	if len(gs) == 0 {
		b.WriteString("    none\n")
	}
	return b.String()
}

// describe is one job as the ledger's examples show it, times from the
// fault.
func (l *ledger) describe(j *loadJob) string {
	at := func(t time.Time) string {
		if t.IsZero() {
			return "never"
		}
		return fmtOffset(t.Sub(l.fx.faultAt))
	}
	out := 0
	for _, e := range j.Events {
		if e.Kind == "output" {
			out++
		}
	}
	s := fmt.Sprintf("job %q via %s posted %s", j.ID, j.Ingress, at(j.SubmitAt))
	switch {
	case j.PostErr != "":
		s += fmt.Sprintf(", POST failed %s: %s", at(j.EndAt), j.PostErr)
	case j.Status != 200:
		s += fmt.Sprintf(", refused %s: %d %s", at(j.EndAt), j.Status, j.Refusal)
	default:
		s += fmt.Sprintf(", %d outputs (generations %v)", out, j.Attempts())
		switch {
		case j.Terminal != "":
			s += fmt.Sprintf(", %s %s %s", j.Terminal, j.Code, at(j.EndAt))
		case j.Broken != "":
			s += fmt.Sprintf(", broke %s: %s", at(j.EndAt), j.Broken)
		case j.Open:
			s += ", still open at the end"
		default:
			s += fmt.Sprintf(", body ended %s with no terminal event", at(j.EndAt))
		}
	}
	return s + "; runs " + l.describeRuns(l.byJob[j.ID])
}

func (l *ledger) describeRuns(rs []jobRun) string {
	if len(rs) == 0 {
		return "none"
	}
	s := ""
	for i, r := range rs {
		if i > 0 {
			s += ", "
		}
		end := "still running"
		switch {
		case r.completed:
			end = "completed " + fmtOffset(r.end.Sub(l.fx.faultAt))
		case !r.end.IsZero():
			end = "stopped " + fmtOffset(r.end.Sub(l.fx.faultAt))
		}
		s += fmt.Sprintf("%s@gen%d %s..%s %d outputs", r.worker, r.gen, fmtOffset(r.start.Sub(l.fx.faultAt)), end, r.outputs)
	}
	return s
}

// fmtOffset is a time relative to the fault: +1.234s or -0.5s.
func fmtOffset(d time.Duration) string {
	s := d.Round(time.Millisecond).String()
	if d >= 0 {
		s = "+" + s
	}
	return s
}

// firstAnswers is how long the POSTs made after the fault waited for
// their first event (accepted): a job whose dispatcher is silent must be
// accepted promptly and wait, never keep its requester waiting for the
// first byte (issue 12).
func (l *ledger) firstAnswers() string {
	var n int
	var slowest time.Duration
	var which string
	for i := range l.jobs {
		j := &l.jobs[i]
		if j.SubmitAt.Before(l.fx.faultAt) || j.Status != 200 || len(j.Events) == 0 {
			continue
		}
		n++
		if d := j.Events[0].At.Sub(j.SubmitAt); d > slowest {
			slowest, which = d, fmt.Sprintf(" (%s, posted at %s)", j.ID, fmtOffset(j.SubmitAt.Sub(l.fx.faultAt)))
		}
	}
	if n == 0 {
		return "accepted POSTs made after the fault: none"
	}
	return fmt.Sprintf("accepted POSTs made after the fault: %d; POST → first event (accepted), slowest: %s%s", n, slowest.Round(time.Millisecond), which)
}
