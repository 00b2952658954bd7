// Package runs is the workers' own record of the handler runs a test
// caused, and the check every test of "a job runs at most once" makes on
// it. The record is the workers', not the nodes': a node that believes a
// job ended may be wrong, a handler that ran cannot. The in-process tests
// (integration) record runs from SDK handlers, the compose tests
// (integration/compose) parse them from the demo workers' --record-runs
// log; both judge them here.
package runs

import (
	"fmt"
	"time"
)

// Run is one handler run of a job.
type Run struct {
	Worker string
	// Gen is the binding generation the run was offered under.
	Gen        uint64
	Start, End time.Time // End zero: still running, or its process died
}

func (r Run) String() string {
	end := "no end"
	if !r.End.IsZero() {
		end = r.End.Format("15:04:05.000")
	}
	return fmt.Sprintf("%s@gen%d[%s-%s]", r.Worker, r.Gen, r.Start.Format("15:04:05.000"), end)
}

// Violations says how one job's runs (in start order) broke at-most-once,
// given the generations whose output its requester saw (attempts) and when
// a worker's process was killed (a run with no end on a killed worker ended
// at the kill; nil when no worker was killed):
//   - a generation started twice;
//   - a run started after the generation whose output reached the requester;
//   - a run started while an earlier one still ran, or had no end.
//
// None is the only correct answer. Output from more than one generation is
// the requester's side of the same promise, and the caller's to judge: a
// job that opted into restarts may show it.
func Violations(attempts []uint64, rs []Run, killed map[string]time.Time) []string {
	var out []string
	seen := map[uint64]bool{}
	for _, r := range rs {
		if seen[r.Gen] {
			out = append(out, fmt.Sprintf("generation %d started twice: %v", r.Gen, rs))
		}
		seen[r.Gen] = true
		if len(attempts) == 1 && r.Gen > attempts[0] {
			out = append(out, fmt.Sprintf("ran again (%v) after generation %d's output reached its requester", r, attempts[0]))
		}
	}
	for i := 1; i < len(rs); i++ {
		prev := rs[i-1]
		end := prev.End
		if k, ok := killed[prev.Worker]; end.IsZero() && ok && prev.Start.Before(k) {
			end = k
		}
		if end.IsZero() || rs[i].Start.Before(end) {
			out = append(out, fmt.Sprintf("run %v started while run %v was still running", rs[i], prev))
		}
	}
	return out
}
