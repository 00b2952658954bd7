// Package stall measures, from a load's own record of its jobs and the
// workers' own record of their runs, how long work that could have run did
// not: issue 24's "one silent node never stalls a queue". The fault suite
// (integration/faults_*_test.go) and the compose tests
// (integration/compose) both use it; docs/faults.md says what the figures
// mean and the targets they are held to.
package stall

import (
	"slices"
	"time"

	"github.com/switchyard/switchyard/integration/runs"
)

// Job is one requester's job as its client saw it, with its runs.
type Job struct {
	// ID names it in Result (the job id, or what the caller likes).
	ID string
	// Posted is when its POST was sent.
	Posted time.Time
	// Ended is when its stream ended (terminal event, refusal, transport
	// error); zero while it is open.
	Ended time.Time
	// Runs are its runs on any worker, by the workers' own record.
	Runs []Run
}

// Run is one handler run, from the workers' own record.
type Run = runs.Run

// Worker is a worker and when it could take work: always, except in
// [DownFrom, DownTo) (its host faulted; DownTo zero: not back in the
// window). DownFrom zero: never down.
type Worker struct {
	Name             string
	Slots            int
	DownFrom, DownTo time.Time
}

// liveAt reports whether w could take work at t.
func (w Worker) liveAt(t time.Time) bool {
	if w.DownFrom.IsZero() || t.Before(w.DownFrom) {
		return true
	}
	return !w.DownTo.IsZero() && !t.Before(w.DownTo)
}

// Result is what Measure found in a window.
type Result struct {
	// FirstStart is the time from the window's start to the first run,
	// on a worker live then, of a job posted in the window; -1 when none
	// started. FirstWorker is that worker.
	FirstStart  time.Duration
	FirstWorker string
	// Longest is the longest stall: an interval in which a job posted in
	// the window was waiting (posted, not started anywhere, its stream not
	// ended), a live worker had a free slot, and no run started on a live
	// worker. LongestFrom is when it began, LongestWaiting how many new
	// jobs waited as it began, LongestFree how many live slots were free.
	Longest                     time.Duration
	LongestFrom                 time.Time
	LongestWaiting, LongestFree int
	// LongestGap is the longest interval in which a job posted in the
	// window was waiting and no run started on a live worker, whether or
	// not a slot was free: under a load that fills every slot it includes
	// plain queueing, which Longest leaves out.
	LongestGap time.Duration
	// Waited: some job posted in the window waited at all.
	Waited bool
	// LongestWait is the longest time a job posted in the window waited
	// for its first run (on any worker), or for its stream to end without
	// one, or, open and never run, until the window's end; LongestWaitID
	// is that job. Other jobs may have started meanwhile: it shows a job
	// held where new work should not be, which a stall may not.
	LongestWait   time.Duration
	LongestWaitID string
	// Overtaken is the longest time a job posted in the window went on
	// waiting after a job posted later than it had started on a live
	// worker; OvertakenID is that job. A queue that serves in order
	// overtakes nobody (in one subject, at one priority): a job overtaken
	// for long was held outside the live queue — at a silent dispatcher,
	// or offered to a silent host.
	Overtaken   time.Duration
	OvertakenID string
}

// Measure sweeps [from, to): jobs are the requesters' jobs (those posted
// before from are left out: such a job may be held by the faulted node,
// offered and not yet run, which the rules let wait for proof of its
// death); runs are every run of every worker (they fill slots and break
// stalls); workers are the workers that can run the jobs, with the slots
// each has. The figures ask whether new work found a live worker; a job
// the faulted node may hold is another target's (redelivery).
func Measure(from, to time.Time, jobs []Job, runs []Run, workers []Worker) Result {
	r := Result{FirstStart: -1}
	if !to.After(from) {
		return r
	}
	byName := map[string]Worker{}
	for _, w := range workers {
		byName[w.Name] = w
	}
	liveStart := func(run Run) bool {
		w, ok := byName[run.Worker]
		return ok && w.liveAt(run.Start)
	}
	var fresh []Job
	for _, j := range jobs {
		if !j.Posted.Before(from) && j.Posted.Before(to) {
			fresh = append(fresh, j)
		}
	}
	for _, j := range fresh {
		end := firstStart(j)
		switch {
		case !end.IsZero():
		case !j.Ended.IsZero():
			end = j.Ended
		default:
			end = to
		}
		if d := end.Sub(j.Posted); d > r.LongestWait {
			r.LongestWait, r.LongestWaitID = d, j.ID
		}
		var passed time.Time
		for _, k := range fresh {
			if !k.Posted.After(j.Posted) {
				continue
			}
			for _, run := range k.Runs {
				if liveStart(run) && run.Start.Before(end) && (passed.IsZero() || run.Start.Before(passed)) {
					passed = run.Start
				}
			}
		}
		if !passed.IsZero() && end.Sub(passed) > r.Overtaken {
			r.Overtaken, r.OvertakenID = end.Sub(passed), j.ID
		}
		for _, run := range j.Runs {
			if liveStart(run) && (r.FirstStart < 0 || run.Start.Sub(from) < r.FirstStart) {
				r.FirstStart, r.FirstWorker = run.Start.Sub(from), run.Worker
			}
		}
	}

	// Every moment the state can change, in the window.
	times := []time.Time{from, to}
	in := func(t time.Time) {
		if !t.IsZero() && t.After(from) && t.Before(to) {
			times = append(times, t)
		}
	}
	for _, j := range fresh {
		in(j.Posted)
		in(j.Ended)
		in(firstStart(j))
	}
	for _, run := range runs {
		in(run.Start)
		in(run.End)
	}
	for _, w := range workers {
		in(w.DownFrom)
		in(w.DownTo)
	}
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	times = slices.CompactFunc(times, func(a, b time.Time) bool { return a.Equal(b) })
	starts := map[int64]bool{}
	for _, run := range runs {
		if liveStart(run) {
			starts[run.Start.UnixNano()] = true
		}
	}

	waiting := func(t time.Time) int {
		n := 0
		for _, j := range fresh {
			s := firstStart(j)
			if !j.Posted.After(t) && (j.Ended.IsZero() || t.Before(j.Ended)) && (s.IsZero() || t.Before(s)) {
				n++
			}
		}
		return n
	}
	free := func(t time.Time) int {
		n := 0
		for _, w := range workers {
			if !w.liveAt(t) {
				continue
			}
			busy := 0
			for _, run := range runs {
				if run.Worker == w.Name && !run.Start.After(t) && (run.End.IsZero() || t.Before(run.End)) {
					busy++
				}
			}
			n += max(w.Slots-busy, 0)
		}
		return n
	}

	var stallFrom, gapFrom time.Time
	var stallWaiting, stallFree int
	closeStall := func(t time.Time) {
		if !stallFrom.IsZero() {
			if d := t.Sub(stallFrom); d > r.Longest {
				r.Longest, r.LongestFrom, r.LongestWaiting, r.LongestFree = d, stallFrom, stallWaiting, stallFree
			}
			stallFrom = time.Time{}
		}
	}
	closeGap := func(t time.Time) {
		if !gapFrom.IsZero() {
			r.LongestGap = max(r.LongestGap, t.Sub(gapFrom))
			gapFrom = time.Time{}
		}
	}
	for i, t := range times {
		if i == len(times)-1 {
			closeStall(t)
			closeGap(t)
			break
		}
		if starts[t.UnixNano()] {
			closeStall(t)
			closeGap(t)
		}
		w, f := waiting(t), free(t)
		if w > 0 {
			r.Waited = true
		}
		switch {
		case w > 0 && f > 0 && stallFrom.IsZero():
			stallFrom, stallWaiting, stallFree = t, w, f
		case (w == 0 || f == 0) && !stallFrom.IsZero():
			closeStall(t)
		}
		switch {
		case w > 0 && gapFrom.IsZero():
			gapFrom = t
		case w == 0:
			closeGap(t)
		}
	}
	return r
}

// firstStart is when a job's first run started (zero: never).
func firstStart(j Job) time.Time {
	var s time.Time
	for _, run := range j.Runs {
		if s.IsZero() || run.Start.Before(s) {
			s = run.Start
		}
	}
	return s
}
