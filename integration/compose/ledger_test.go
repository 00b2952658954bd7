//go:build compose

package compose_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/switchyard/switchyard/integration/loadgen"
)

// ledger is what one case did, as its requesters and its workers saw it:
// jobs submitted, refused at submit by code, completed, failed by code,
// cancelled, expired, unknown (no terminal event), executed more than once,
// and the time from the fault to the last terminal event of the jobs in
// flight at it.
type ledger struct {
	name, fault string
	at          time.Time
	jobs        []loadJob
	runs        map[string][]jobRun // by job id, in start order
	killed      map[string]time.Time
	notes       []string
}

// newLedger collects the workers' run records (docker logs) for the jobs.
// killed names the worker containers the case killed, and when.
func newLedger(c *cluster, name, fault string, at time.Time, jobs []loadJob, killed map[string]time.Time) *ledger {
	l := &ledger{name: name, fault: fault, at: at, jobs: jobs, runs: map[string][]jobRun{}, killed: killed}
	for _, w := range workerServices {
		runs, err := parseRuns(c.logs(w))
		if err != nil {
			c.t.Errorf("%s: %v", w, err)
		}
		for _, r := range runs {
			l.runs[r.job] = append(l.runs[r.job], r)
		}
	}
	for _, rs := range l.runs {
		slices.SortStableFunc(rs, func(a, b jobRun) int { return a.start.Compare(b.start) })
	}
	return l
}

// note adds a line to the printed ledger.
func (l *ledger) note(format string, args ...any) {
	l.notes = append(l.notes, fmt.Sprintf(format, args...))
}

// inFlight are the jobs accepted before the fault whose streams had not
// ended at it.
func (l *ledger) inFlight() []loadJob {
	var out []loadJob
	for _, j := range l.jobs {
		if j.Status == 200 && j.SubmitAt.Before(l.at) && !j.Ended(l.at) {
			out = append(out, j)
		}
	}
	return out
}

// tally is one column of the ledger: the jobs of kind ("": every kind),
// less the POSTs the test's own end cut.
func (l *ledger) tally(kind string) loadgen.Counts {
	var c loadgen.Counts
	for _, j := range l.jobs {
		if kind != "" && j.kind != kind || j.Open && j.Status == 0 {
			continue // another kind, or a POST cut by the test's own end
		}
		c.Add(&j.Job)
	}
	return c
}

// failed are the ended counts of c's failures: neither completed, nor
// cancelled, nor expired.
func failed(c loadgen.Counts) map[string]int {
	out := maps.Clone(c.Ended)
	for _, k := range []string{"completed", "cancelled", "expired"} {
		delete(out, k)
	}
	return out
}

// violations returns, per job, how it broke at-most-once (runViolations).
func (l *ledger) violations() map[string][]string {
	out := map[string][]string{}
	for _, j := range l.jobs {
		if j.ID == "" {
			continue
		}
		if v := runViolations(j.Attempts(), l.runs[j.ID], l.killed); len(v) > 0 {
			out[j.ID] = v
		}
	}
	return out
}

// disordered returns the jobs whose events repeat or go back in sequence
// (a resumed stream included), and those with more than one terminal.
func (l *ledger) disordered() []string {
	var out []string
	for _, j := range l.jobs {
		for i := 1; i < len(j.Events); i++ {
			if j.Events[i].Seq <= j.Events[i-1].Seq {
				out = append(out, fmt.Sprintf("%s: seq %d after %d", j.ID, j.Events[i].Seq, j.Events[i-1].Seq))
				break
			}
		}
		if j.Terminals > 1 {
			out = append(out, fmt.Sprintf("%s: %d terminal events", j.ID, j.Terminals))
		}
	}
	return out
}

// check prints the ledger and fails the test on every broken invariant:
// a job with no terminal event, a job executed more than once, events out
// of order, and a job in flight at the fault whose terminal event came
// later than bound(job) after the fault. It returns the time from the
// fault to the last terminal event of the jobs in flight that had output
// before it, and of those that had none.
func (l *ledger) check(t *testing.T, bound func(j loadJob) time.Duration) (withOutput, without time.Duration) {
	t.Helper()
	kinds := []string{}
	for _, j := range l.jobs {
		if !slices.Contains(kinds, j.kind) {
			kinds = append(kinds, j.kind)
		}
	}
	slices.Sort(kinds)
	cols := append([]string{""}, kinds...)
	tallies := make([]loadgen.Counts, len(cols))
	for i, k := range cols {
		tallies[i] = l.tally(k)
	}
	viol := l.violations()
	disorder := l.disordered()

	var b strings.Builder
	fmt.Fprintf(&b, "ledger %s: %s at %s\n", l.name, l.fault, l.at.Format("15:04:05.000"))
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "  \tall")
	for _, k := range kinds {
		fmt.Fprintf(tw, "\t%s (model=%s)", k, k)
	}
	fmt.Fprintln(tw)
	row := func(name string, f func(loadgen.Counts) string) {
		fmt.Fprintf(tw, "  %s", name)
		for _, ta := range tallies {
			fmt.Fprintf(tw, "\t%s", f(ta))
		}
		fmt.Fprintln(tw)
	}
	num := func(f func(loadgen.Counts) int) func(loadgen.Counts) string {
		return func(c loadgen.Counts) string { return fmt.Sprint(f(c)) }
	}
	ended := func(how string) func(loadgen.Counts) string {
		return num(func(c loadgen.Counts) int { return c.Ended[how] })
	}
	row("jobs submitted", num(func(c loadgen.Counts) int { return c.Submitted }))
	row("refused at submit", func(c loadgen.Counts) string { return loadgen.ByCode(c.Refused) })
	row("POST failed in transport", num(func(c loadgen.Counts) int { return c.PostErrors }))
	row("completed", ended("completed"))
	row("failed, by code", func(c loadgen.Counts) string { return loadgen.ByCode(failed(c)) })
	row("cancelled", ended("cancelled"))
	row("expired", ended("expired"))
	row("unknown (must be 0)", num(func(c loadgen.Counts) int { return c.Unknown }))
	tw.Flush()
	fmt.Fprintf(&b, "  executed more than once (must be 0): %d\n", len(viol))
	fmt.Fprintf(&b, "  events repeated or out of order (must be 0): %d\n", len(disorder))
	lostQuiet := l.lostWithoutOutput()
	fmt.Fprintf(&b, "  worker_lost without any output (must be 0: such a job goes back to its queue): %d\n", len(lostQuiet))

	flight := l.inFlight()
	var last [2]time.Duration // without, with output before the fault
	var worst [2]string
	n := [2]int{}
	var over []string
	for _, j := range flight {
		k := 0
		if j.OutputBy(l.at) {
			k = 1
		}
		n[k]++
		d := j.EndAt.Sub(l.at)
		if j.Terminals == 0 {
			continue // counted as unknown
		}
		if d > last[k] {
			last[k], worst[k] = d, fmt.Sprintf("%s %s", j.Terminal, j.Code)
		}
		if bd := bound(j); d > bd {
			over = append(over, fmt.Sprintf("%s (%s, output before the fault: %v): terminal %s %s after %v, bound %v",
				j.ID, j.kind, k == 1, j.Terminal, j.Code, d.Round(time.Millisecond), bd))
		}
	}
	fmt.Fprintf(&b, "  in flight at the fault: %d; fault -> last terminal event: %v\n", len(flight), max(last[0], last[1]).Round(time.Millisecond))
	fmt.Fprintf(&b, "    %d with output before the fault: last terminal +%v (%s)\n", n[1], last[1].Round(time.Millisecond), worst[1])
	fmt.Fprintf(&b, "    %d without: last terminal +%v (%s)\n", n[0], last[0].Round(time.Millisecond), worst[0])
	for _, d := range l.failures() {
		fmt.Fprintf(&b, "  failed: %s\n", d)
	}
	for _, n := range l.notes {
		fmt.Fprintf(&b, "  %s\n", n)
	}
	t.Log(b.String())

	if u := tallies[0].Unknown; u > 0 {
		var ids []string
		for _, j := range l.jobs {
			if j.Status == 200 && j.Terminals == 0 {
				ids = append(ids, fmt.Sprintf("%s (broken: %q, open: %v)", j.ID, j.Broken, j.Open))
			}
		}
		t.Errorf("%d streams without a terminal event: %v", u, ids)
	}
	for _, id := range slices.Sorted(maps.Keys(viol)) {
		t.Errorf("job %s executed more than once: %v", id, viol[id])
	}
	for _, d := range disorder {
		t.Errorf("events out of order: %s", d)
	}
	for _, q := range lostQuiet {
		t.Errorf("a job that had no output ended worker_lost instead of going back to its queue: %s", q)
	}
	for _, o := range over {
		t.Errorf("terminal event later than the bound: %s", o)
	}
	return last[1], last[0]
}

// failures groups the failed jobs by code and detail, with how many had
// output before the fault and how many were submitted after it.
func (l *ledger) failures() []string {
	type key struct{ code, detail string }
	type count struct{ n, output, after int }
	m := map[key]*count{}
	for _, j := range l.jobs {
		if j.Terminal != "error" || j.Code == "cancelled" || j.Code == "expired" {
			continue
		}
		k := key{j.Code, j.Detail}
		if m[k] == nil {
			m[k] = &count{}
		}
		m[k].n++
		if j.OutputBy(l.at) {
			m[k].output++
		}
		if !j.SubmitAt.Before(l.at) {
			m[k].after++
		}
	}
	var out []string
	for k, c := range m {
		out = append(out, fmt.Sprintf("%s x%d (%d with output before the fault, %d submitted after it): %s", k.code, c.n, c.output, c.after, k.detail))
	}
	slices.Sort(out)
	return out
}

// lostWithoutOutput returns the jobs that ended worker_lost although their
// requester saw no output: docs/cluster.md (and the seed) send such a job
// back to its queue once its worker's death is proven, and fail it only
// when no capable consumer is left (as rejected).
func (l *ledger) lostWithoutOutput() []string {
	var out []string
	for _, j := range l.jobs {
		if j.Code == "worker_lost" && !j.OutputBy(j.EndAt) {
			out = append(out, fmt.Sprintf("%s (%s, ingress %s, ran on %s, ended +%v after the fault): %s",
				j.ID, j.kind, j.Ingress, lastWorker(l.runs[j.ID]), j.EndAt.Sub(l.at).Round(time.Millisecond), j.Detail))
		}
	}
	return out
}

// mustComplete fails the test for every job in flight at the fault that
// pick selects and that did not complete, and notes how many there were.
// what says which jobs they are and why they must complete.
func (l *ledger) mustComplete(t *testing.T, what string, pick func(j loadJob, runs []jobRun) bool) {
	t.Helper()
	n, done := 0, 0
	for _, j := range l.inFlight() {
		if !pick(j, l.runs[j.ID]) {
			continue
		}
		n++
		if j.Terminal == "done" {
			done++
			continue
		}
		t.Errorf("%s: job %s (%s, ingress %s, ran on %s) ended %s %s after %v: %s", what, j.ID, j.kind, j.Ingress, lastWorker(l.runs[j.ID]), j.Terminal, j.Code,
			j.EndAt.Sub(l.at).Round(time.Millisecond), j.Detail)
	}
	l.note("%s: %d, completed %d", what, n, done)
}

// lastWorker is the worker of a job's latest run ("" if none).
func lastWorker(rs []jobRun) string {
	if len(rs) == 0 {
		return ""
	}
	return rs[len(rs)-1].worker
}
