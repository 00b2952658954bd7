//go:build compose

package compose_test

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/switchyard/switchyard/integration/runs"
)

// What the workers ran, from their own record: the demo workers of
// docker-compose.yml run with --record-runs, which logs a "run started"
// line when the handler takes a job and a "run ended" line when it returns
// (cmd/switchyard/runrecord.go). That record, not the nodes', is the
// source of truth for "a job ran more than once".

// jobRun is one handler run.
type jobRun struct {
	worker string
	job    string
	gen    uint64
	// end is zero when the log has no "run ended" line for the run: the
	// worker's process died during it, or it still runs.
	start, end time.Time
}

func (r jobRun) String() string { return r.record().String() }

// logfmtPair matches key=value in a slog text line; a value with spaces or
// quotes is a Go-quoted string.
var logfmtPair = regexp.MustCompile(`(\w+)=("(?:[^"\\]|\\.)*"|\S*)`)

// parseRuns reads the run records from a worker's log, in log order.
func parseRuns(log string) ([]jobRun, error) {
	var runs []jobRun
	open := map[string]int{} // job@gen -> index in runs
	for line := range strings.Lines(log) {
		if !strings.Contains(line, `msg="run started"`) && !strings.Contains(line, `msg="run ended"`) {
			continue
		}
		kv := map[string]string{}
		for _, m := range logfmtPair.FindAllStringSubmatch(line, -1) {
			v := m[2]
			if strings.HasPrefix(v, `"`) {
				if u, err := strconv.Unquote(v); err == nil {
					v = u
				}
			}
			kv[m[1]] = v
		}
		at, err := time.Parse(time.RFC3339Nano, kv["time"])
		if err != nil {
			return nil, fmt.Errorf("run record %q: time: %w", strings.TrimSpace(line), err)
		}
		gen, err := strconv.ParseUint(kv["generation"], 10, 64)
		if err != nil || kv["job"] == "" || kv["worker"] == "" {
			return nil, fmt.Errorf("run record %q: want worker, job and generation", strings.TrimSpace(line))
		}
		key := kv["job"] + "@" + kv["generation"]
		switch kv["msg"] {
		case "run started":
			open[key] = len(runs)
			runs = append(runs, jobRun{worker: kv["worker"], job: kv["job"], gen: gen, start: at})
		case "run ended":
			i, ok := open[key]
			if !ok {
				return nil, fmt.Errorf("run record %q: ended, never started", strings.TrimSpace(line))
			}
			runs[i].end = at
			delete(open, key)
		}
	}
	return runs, nil
}

// record is r as the workers' record the at-most-once check reads.
func (r jobRun) record() runs.Run {
	return runs.Run{Worker: r.worker, Gen: r.gen, Start: r.start, End: r.end}
}

// runViolations says how a job's runs (in start order) broke at-most-once
// (runs.Violations), given the generations whose output its requester saw
// and when each worker's container was killed; and whether its requester
// saw output from more than one generation, which no job here opts into.
func runViolations(attempts []uint64, rs []jobRun, killed map[string]time.Time) []string {
	var out []string
	if len(attempts) > 1 {
		out = append(out, fmt.Sprintf("its requester saw output from generations %v", attempts))
	}
	recs := make([]runs.Run, len(rs))
	for i, r := range rs {
		recs[i] = r.record()
	}
	return append(out, runs.Violations(attempts, recs, killed)...)
}
