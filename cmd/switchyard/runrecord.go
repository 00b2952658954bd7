package main

import (
	"context"
	"log/slog"

	"github.com/switchyard/switchyard/worker"
)

// Run records: with `switchyard worker --record-runs`, the worker logs one
// line when its handler starts a job and one when the handler returns:
//
//	level=INFO msg="run started" worker=worker-3 job=j_… generation=1
//	level=INFO msg="run ended" worker=worker-3 job=j_… generation=1 err="…"
//
// (or the same keys as JSON with --log-format json). They are the worker's
// own account of what it executed, which is what "no job ran twice" is
// checked against: the compose fault tests (integration/compose) read them
// with `docker logs`. A "run started" without its "run ended" is a run cut
// short by the process dying. The messages and keys are a contract with
// those tests: change them together.
const (
	runStartedMsg = "run started"
	runEndedMsg   = "run ended"
)

// recordRuns wraps h so that every run is logged as above.
func recordRuns(h worker.Handler, name string, log *slog.Logger) worker.Handler {
	return func(ctx context.Context, job *worker.Job, out *worker.Output) (any, error) {
		l := log.With("worker", name, "job", job.ID, "generation", job.Generation, "trace_id", job.TraceID)
		l.Info(runStartedMsg)
		res, err := h(ctx, job, out)
		if err != nil {
			l.Info(runEndedMsg, "err", err)
		} else {
			l.Info(runEndedMsg)
		}
		return res, err
	}
}
