package core

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// This file is the ingress's side of a binding: what the dispatcher and the
// consumer host tell the job's ingress (offered, accepted, an output, the
// end, a release), in process or as a reply from another node (receive.go),
// and finishLocked, the one place a job gets its terminal outcome.

// ingressDeadline is the backstop: a job whose TTL ran out without anyone
// downstream failing it is expired here, and its worker told to stop.
func (e *Engine) ingressDeadline(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if j := e.jobs[id]; j != nil && !e.closed {
		e.finishLocked(j, CodeExpired, "the job's TTL ran out", nil)
	}
}

// onAcceptedLocked: the consumer host says a worker took the job. It
// reports whether the job moved to running (false for a stale binding).
func (e *Engine) onAcceptedLocked(id string, gen uint64, consumer, name string) bool {
	j := e.jobs[id]
	if j == nil || gen != j.gen || !j.state.CanMove(StateRunning) && j.state != StateQueued {
		return false
	}
	j.consumer, j.worker, j.state = consumer, name, StateRunning
	e.startAttemptLocked(j, time.Now())
	if recording(j.span) {
		j.span.AddEvent("accepted", trace.WithAttributes(AttrConsumer.String(consumer), AttrWorker.String(name), AttrGeneration.Int64(int64(gen))))
	}
	return true
}

// onOfferedLocked: the dispatcher bound the job to a consumer.
func (e *Engine) onOfferedLocked(id string, gen uint64, consumer, name string) {
	if j := e.jobs[id]; j != nil && j.gen == gen && j.state.CanMove(StateOffered) {
		j.consumer, j.worker, j.state = consumer, name, StateOffered
	}
}

// onOutputLocked appends one output, or fails the job when the output
// breaks a limit (not strict JSON, past max_output_bytes). It reports stale
// when (job, gen) is not the current binding, and the output was dropped.
// It keeps nothing of data, which may be the transport's buffer
// (Receiver.HandleMessage): the event is a copy.
func (e *Engine) onOutputLocked(id string, gen uint64, data []byte) (stale bool) {
	j := e.jobs[id]
	if j == nil || j.gen != gen || j.state != StateRunning {
		return true
	}
	// Credit counts the output as the worker sent it.
	size := int64(len(data))
	ev, n, ok := appendOutputEvent(j.slab.take(outputEventMax(data)), data)
	if !ok {
		e.finishLocked(j, CodeBadOutput, "the worker sent output that is not one strict JSON value: "+jsonFault(data), nil)
		return false
	}
	j.outBytes += int64(n)
	if j.outBytes > j.Limits.MaxOutputBytes {
		e.finishLocked(j, CodeOutputTooLarge, "the job's output passed its max_output_bytes", nil)
		return false
	}
	if !j.produced {
		j.produced = true
		j.firstOutputAt = time.Now()
		observe(e.m.TimeToFirst, j.firstOutputAt.Sub(j.Created).Seconds(), j.trace)
		if recording(j.span) {
			j.span.AddEvent("first_output")
		}
	}
	j.outputs++
	appended, _ := j.History.Append(EventOutput, gen, j.slab.keep(ev))
	e.outputTakenLocked(j, appended.Seq, size)
	return false
}

// onEndLocked: the worker completed (code "") or failed the job. It
// reports whether this ended the job (finishLocked).
func (e *Engine) onEndLocked(id string, gen uint64, code Code, detail string, result json.RawMessage) bool {
	j := e.jobs[id]
	if j == nil || j.gen != gen || j.state.Terminal() {
		return false
	}
	if code == "" && result != nil && CheckJSON(result) != nil {
		code, detail, result = CodeBadOutput, "the worker's result is not one strict JSON value: "+jsonFault(result), nil
	}
	return e.finishLocked(j, code, detail, result)
}

// releaseAtIngressLocked decides what happens to a job whose binding (job,
// gen) ended without an outcome: a worker refused it (rejected), or the
// worker or its node was lost (how says what is known of the worker). The
// ingress decides because it is the node that saw the output: a job that
// produced some fails worker_lost, unless it opted into restarts and may
// restart (restart.go); otherwise it goes back to its queue under a new
// generation, never again to a consumer that refused it, and fails
// rejected when no other capable consumer is left.
func (e *Engine) releaseAtIngressLocked(id string, gen uint64, consumer string, rejected bool, how lost, reason string) {
	j := e.jobs[id]
	if j == nil || j.state.Terminal() || gen != j.gen {
		e.m.StaleMessages.WithLabelValues("release").Inc()
		return
	}
	if recording(j.span) {
		j.span.AddEvent("released", trace.WithAttributes(AttrConsumer.String(consumer), AttrGeneration.Int64(int64(gen)),
			AttrRejected.Bool(rejected), AttrReason.String(reason)))
	}
	if rejected {
		if consumer != "" {
			if j.exclude == nil {
				j.exclude = map[string]bool{}
			}
			j.exclude[consumer] = true
		}
		if !e.capableLocked(j.Queue, j.Env.Capabilities, j.Env.Zone, j.exclude) {
			e.finishLocked(j, CodeRejected, "every capable worker refused the job; last reason: "+reason, nil)
			return
		}
	} else {
		e.endAttemptLocked(j, string(CodeWorkerLost)+": "+reason, time.Now())
		if j.produced {
			e.lostWithOutputLocked(j, consumer, how, reason)
			return
		}
		e.m.Reclaims.Inc()
	}
	e.reforwardLocked(j)
}

// finishLocked gives a job its one terminal outcome. Everything that ends a
// job goes through here; it returns false if the job had already ended.
func (e *Engine) finishLocked(j *Job, code Code, detail string, result json.RawMessage) bool {
	if j.state.Terminal() {
		return false
	}
	outcome, state := outcomeFor(code)
	if !j.state.CanMove(state) {
		return false
	}
	now := time.Now()
	j.state, j.code, j.detail, j.ended = state, code, detail, now
	if code == "" {
		e.endAttemptLocked(j, string(OutcomeCompleted), now)
	} else {
		e.endAttemptLocked(j, string(code), now)
	}
	switch {
	case code != "":
		j.History.Append(EventError, j.gen, errorData{Code: code, Detail: detail, Outcome: outcome}.encode())
	case result != nil:
		j.History.Append(EventDone, j.gen, doneData{Outcome: outcome, Result: result}.encode())
	default:
		j.History.Append(EventDone, j.gen, doneData{Outcome: outcome}.encode())
	}
	if j.onEnd != nil {
		j.onEnd()
		j.onEnd = nil
	}
	e.m.Jobs.WithLabelValues(string(outcome)).Inc()
	observe(e.m.Duration.WithLabelValues(string(outcome)), now.Sub(j.Created).Seconds(), j.trace)
	endSpan(j.await, "job ended", "")
	j.await = nil
	endJobSpanLocked(j, outcome)
	e.activeDoneLocked()
	stopTimer(j.timer)
	stopTimer(j.graceTimer)
	stopTimer(j.rerouteTimer)
	if j.stopForward != nil {
		j.stopForward()
		j.stopForward = nil
	}
	e.withdrawLocked(j, code)
	e.paceEndedLocked(j)
	j.slab = eventSlab{} // its history was compacted: no event's data is in it
	e.retainLocked(j)
	if e.log.Enabled(context.Background(), slog.LevelDebug) { // else its arguments are built for nothing, once per job
		e.logJob(j.trace, slog.LevelDebug, "job ended", "job", j.ID, "queue", j.Queue, "outcome", outcome, "code", code)
	}
	return true
}
