package stream

import (
	"context"

	"github.com/switchyard/switchyard/core"
)

// Door is what a front door (httpapi's SSE, grpcapi's JobService) serves a
// job's stream with: the engine, the door's resume tokens, metrics and log
// (Resumes), and the node's stream policy. Only the sink, and where the
// caller and the position come from, are the door's own.
type Door struct {
	Engine  *core.Engine
	Resumes Resumes
	Policy  Policy
}

// JobStream is one stream of a job a door serves.
type JobStream struct {
	Job *core.Job
	// After is the position to start after; Filter the event kinds to
	// send (nil: all); Slow the slow-consumer policy the request asked for.
	After  uint64
	Filter map[core.EventKind]bool
	Slow   SlowPolicy
	// Claim marks a stream that is the submitter's (the job's own submit,
	// or a resume with a valid token), so that it owns a streamed job:
	// when the last owner stream ends before the terminal event, the job
	// gets a grace window to be resumed in (core.Engine.StreamClosed).
	Claim bool
	// Caller is who the stream's resume tokens are bound to.
	Caller [16]byte
}

// Serve writes js to sink (Run) between the engine's StreamOpened and
// StreamClosed, with a resume token on every event, the job's worker
// paced by an owner stream, the door's metrics, and a log line for a
// stream terminated as a slow consumer.
func (d Door) Serve(ctx context.Context, js JobStream, sink Sink) Result {
	j := js.Job
	owner := d.Engine.StreamOpened(j.ID, js.Claim)
	d.Resumes.Metrics.Opened()
	pol := d.Policy
	pol.Slow = js.Slow
	filter := FilterFingerprint(js.Filter)
	res := Run(ctx, Request{
		Job: j, After: js.After, Filter: js.Filter, Policy: pol,
		Token:   d.Resumes.Signer(j, js.Caller, filter),
		Writers: d.Resumes.Metrics.Writers(),
		Sent:    d.Engine.Pacer(j.ID, owner),
	}, sink)
	// The engine first: once the metrics show a stream closed, its job's
	// grace window (if any) has started.
	d.Engine.StreamClosed(j.ID, owner, res.End.ClientLeft())
	d.Resumes.Metrics.Closed(res)
	if res.End == EndSlow {
		d.Resumes.Log.InfoContext(j.WithTrace(ctx), "stream terminated as a slow consumer", "job", j.ID, "lag_events", res.LagEvents, "lag_bytes", res.LagBytes, "last_seq", res.LastSeq)
	}
	return res
}

// Complete reports whether a reader resuming after position after already
// has every event of j, its terminal one included: the door answers with
// no stream at all (HTTP's 204, gRPC's OK with no events), which a
// resuming client takes as the end.
func Complete(e *core.Engine, j *core.Job, after uint64) bool {
	if after == 0 || after < j.History.Head() {
		return false
	}
	v, _ := e.View(j.ID)
	return v.State.Terminal()
}
