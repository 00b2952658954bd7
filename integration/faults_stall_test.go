//go:build faults

package integration_test

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/switchyard/switchyard/integration/stall"
)

// Issue 24's measure: does new work find a live worker while a node is
// silent? From the requesters' record and the workers' (package stall):
//
//   - first start: the fault → the first run, on a worker whose node the
//     fault did not hit, of a job posted after the fault;
//   - longest stall: the longest interval, from the fault to the end of
//     its hold, in which a job posted after the fault waited (not started
//     anywhere, its stream open), a live worker had a free slot, and no
//     run started on any live worker.
//
// A worker is live when its node is not faulted, or once a returning node
// serves again (a restarted host's worker reconnects at once).

// stallEnd is the end of the window the stall is measured in: the end of
// the fault's hold (for a kill or a restart, as long as a pause would
// have lasted).
func (fx *faultRun) stallEnd() time.Time {
	return maxTime(fx.recoverAt, fx.faultAt.Add(faultHold))
}

// stallApplies: no quorum anywhere means no node may work; there is no
// stall to measure.
func stallApplies(c faultCase) bool { return !c.noQuorum }

// stallWorkers are the suite's workers with when each was down.
func (fx *faultRun) stallWorkers() []stall.Worker {
	var out []stall.Worker
	for name, node := range fx.workerNode {
		w := stall.Worker{Name: name, Slots: workerSlots}
		if slices.Contains(fx.faulted, node) {
			w.DownFrom = fx.faultAt
			switch {
			case fx.c.incarnation:
				w.DownTo = fx.servingAt
			case fx.c.returns && len(fx.killed) == 0:
				w.DownTo = fx.recoverAt
			}
		}
		out = append(out, w)
	}
	slices.SortFunc(out, func(a, b stall.Worker) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// measureStall fills l.stall and l.stallLongest.
func (l *ledger) measureStall() {
	fx := l.fx
	if !stallApplies(fx.c) {
		return
	}
	var jobs []stall.Job
	for _, j := range l.jobs {
		sj := stall.Job{ID: j.ID, Posted: j.SubmitAt, Ended: j.EndAt}
		for _, r := range l.byJob[j.ID] {
			if j.ID != "" {
				sj.Runs = append(sj.Runs, r.record())
			}
		}
		jobs = append(jobs, sj)
	}
	var runs []stall.Run
	for _, r := range l.runs {
		runs = append(runs, r.record())
	}
	end := fx.stallEnd()
	if now := time.Now(); now.Before(end) {
		end = now // observe's early ledgers: the window so far
	}
	l.stall = stall.Measure(fx.faultAt, end, jobs, runs, fx.stallWorkers())
	l.stallLongest.add(l.stall.Longest, nil)
	l.passed.add(l.stall.Overtaken, nil)
}

// heldApplies: the cases whose fault hits the queue's dispatcher. A job
// forwarded to it and not yet offered to any worker is the queue's, not a
// host's: once another node has taken the queue over it must move, so no
// new job may wait on there while later ones run. (After a worker host's
// fault a job offered to that host before it was suspected may wait for
// proof of its death, by the rules: there the figure is printed only.)
func heldApplies(c faultCase) bool { return stallApplies(c) && c.dispatcher }

// stallLine is the ledger's line of stall figures.
func (l *ledger) stallLine() string {
	fx := l.fx
	if !stallApplies(fx.c) {
		return "stall: n/a (no quorum anywhere: no node may work)"
	}
	s := l.stall
	// The first start is printed against the stall's bound, not held to
	// it: once a host is gone its 8 slots are left for 16 clients or more,
	// so a new job also waits for one of the live worker's runs to end,
	// however well the cluster does; the longest stall leaves that out.
	fb, _ := stallBounds(fx)
	first := "no job posted after the fault started on a live worker"
	if s.FirstStart >= 0 {
		first = fmt.Sprintf("%v (on %s; %s: ≤ %v + %v, not held)", s.FirstStart.Round(time.Millisecond), s.FirstWorker, fb.why, fb.d, faultSlack)
	}
	longest := "none"
	if s.Longest > 0 {
		longest = fmt.Sprintf("%v (from %s: %d new jobs waiting, %d live slots free)", s.Longest.Round(time.Millisecond),
			fmtOffset(s.LongestFrom.Sub(fx.faultAt)), s.LongestWaiting, s.LongestFree)
	}
	return fmt.Sprintf("stall, fault → %s (live workers: %s): first start of a new job on a live worker %s; longest stall %s; longest wait of new jobs with no start on a live worker, slots busy or not, %v; the new job that waited longest for its first run %v (%s); the longest a new job waited after a later one had started on a live worker %v (%s)",
		fmtOffset(fx.stallEnd().Sub(fx.faultAt)), l.liveWorkers(), first, longest, s.LongestGap.Round(time.Millisecond), s.LongestWait.Round(time.Millisecond), s.LongestWaitID,
		s.Overtaken.Round(time.Millisecond), s.OvertakenID)
}

// liveWorkers names the workers the stall counts as live, and when.
func (l *ledger) liveWorkers() string {
	var parts []string
	for _, w := range l.fx.stallWorkers() {
		switch {
		case w.DownFrom.IsZero():
			parts = append(parts, w.Name)
		case w.DownTo.IsZero():
			parts = append(parts, w.Name+" down")
		default:
			parts = append(parts, fmt.Sprintf("%s from %s", w.Name, fmtOffset(w.DownTo.Sub(l.fx.faultAt))))
		}
	}
	return fmt.Sprint(parts)
}

// stallBounds are issue 24's targets: after a worker host falls silent,
// new jobs run on another capable worker within 2 peer heartbeats; after
// the dispatcher's node does, within 4 (docs/faults.md says why).
func stallBounds(fx *faultRun) (first, longest faultBound) {
	hb := fx.timing.heartbeat
	longest = faultBound{2 * hb, "2 heartbeats: a worker host"}
	if slices.Contains(fx.faulted, fx.dispatcher) {
		longest = faultBound{4 * hb, "4 heartbeats: the dispatcher's node"}
	}
	first = longest
	if fx.c.ingress {
		// Every slot runs a job of the dead ingress until those runs are
		// stopped (the orphans' bound): new jobs start once a slot frees.
		first = faultBound{4 * hb, "4 heartbeats: slots held by the orphans"}
	}
	return first, longest
}
