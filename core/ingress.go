package core

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"time"
)

// This file is the ingress role: the job record, its history and its one
// terminal outcome. Nothing here talks to a worker directly.

// SubmitOptions are the transport-level facts about a submission.
type SubmitOptions struct {
	// IdempotencyKey makes a retried submission return the same job.
	IdempotencyKey string
}

// Submit validates an envelope against the node's limits and the consumer
// registry and, if it passes, creates the job and hands it to the queue's
// dispatcher. A refusal changes nothing. existing is true when an
// idempotency key matched a job created earlier.
func (e *Engine) Submit(ctx context.Context, queue string, env *Envelope, opts SubmitOptions) (*Job, bool, error) {
	if err := CheckQueueName(queue); err != nil {
		return nil, false, err
	}
	eff, err := e.cfg.Limits.Apply(env)
	if err != nil {
		return nil, false, err
	}
	// Where the queue's pending jobs live. Electing may write to the
	// catalog, so it happens before the lock; the view answers without
	// waiting when the queue already has a live dispatcher.
	dispatcher := e.cfg.Node
	if e.cluster != nil {
		// Refuse what no consumer can run before touching the catalog: a
		// refusal changes nothing, not even the queue's dispatch record.
		e.mu.Lock()
		capable := e.capableLocked(queue, env.Capabilities, env.Zone, nil)
		e.mu.Unlock()
		if !capable {
			return nil, false, &Error{Code: CodeNoCapableWorker, Detail: "no registered worker on this queue has the required capabilities", RetryAfter: time.Second}
		}
		if dispatcher, err = e.cluster.Dispatcher(ctx, queue); err != nil {
			e.log.Warn("no dispatcher for queue", "queue", queue, "err", err)
			return nil, false, &Error{Code: CodeDispatcherUnavailable, Detail: "the queue's dispatcher could not be found or elected", RetryAfter: time.Second}
		}
	}
	now := time.Now()

	e.mu.Lock()
	if e.draining || e.closed {
		e.mu.Unlock()
		return nil, false, &Error{Code: CodeDraining, Detail: "the node is shutting down; submit to another node", RetryAfter: time.Second}
	}
	if opts.IdempotencyKey != "" {
		if id, ok := e.idem[opts.IdempotencyKey]; ok {
			if old := e.jobs[id]; old != nil {
				e.mu.Unlock()
				if old.Queue != queue {
					return nil, false, errorf(CodeIdempotencyReuse, "Idempotency-Key", "the key was used for a job on queue %q", old.Queue)
				}
				return old, true, nil
			}
		}
	}
	if !e.capableLocked(queue, env.Capabilities, env.Zone, nil) {
		e.mu.Unlock()
		return nil, false, &Error{Code: CodeNoCapableWorker, Detail: "no registered worker on this queue has the required capabilities", RetryAfter: time.Second}
	}

	j := &Job{
		ID: newID("j_"), Queue: queue, Created: now, Env: env, Limits: eff,
		History:  NewHistory(e.cfg.HistoryEvents, e.cfg.HistoryBytes),
		deadline: now.Add(eff.TTL),
		state:    StateQueued,
		idemKey:  opts.IdempotencyKey,
		gen:      1,
		// The generation is the ingress's to allocate: every forward
		// carries a fresh one (see reforwardLocked).
		dispatcher: dispatcher,
	}
	d := e.deliveryLocked(j, now)
	if dispatcher == e.cfg.Node {
		// The dispatcher checks depth and bytes; refusing there, before the
		// job record exists, is what makes "over a cap changes nothing" true.
		if err := e.enqueueLocked(d, now); err != nil {
			e.mu.Unlock()
			return nil, false, err
		}
		e.startLocked(j)
		e.dispatchLocked(e.queues[queue])
		e.mu.Unlock()
		return j, false, nil
	}

	// A remote dispatcher: the record exists before the forward, so an
	// answer that races the forward's own response finds its job.
	e.startLocked(j)
	e.mu.Unlock()
	// What is left now, the ingress's own time included, is what travels.
	d.TTL = time.Until(j.deadline)
	ferr := e.cluster.Forward(ctx, dispatcher, d)
	if ferr == nil {
		return j, false, nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if j.state.Terminal() {
		// Something answered for the job after all: its outcome stands.
		return j, false, nil
	}
	e.unstartLocked(j)
	var ce *Error
	if errors.As(ferr, &ce) {
		return nil, false, ce
	}
	e.log.Warn("forward to dispatcher failed", "queue", queue, "dispatcher", dispatcher, "err", ferr)
	return nil, false, &Error{Code: CodeDispatcherUnavailable, Detail: "the queue's dispatcher on another node could not be reached", RetryAfter: time.Second}
}

// startLocked makes a new job live: indexed, counted, its first event
// written and its ingress deadline armed.
func (e *Engine) startLocked(j *Job) {
	e.jobs[j.ID] = j
	if j.idemKey != "" {
		e.idem[j.idemKey] = j.ID
	}
	e.active++
	j.History.Append(EventAccepted, 0, mustJSON(map[string]any{
		"queue": j.Queue, "ttl_ms": j.Limits.TTL.Milliseconds(),
	}))
	j.timer = time.AfterFunc(j.Limits.TTL+e.cfg.ExpirySlack, func() { e.ingressDeadline(j.ID) })
}

// unstartLocked undoes startLocked for a job its dispatcher refused: the
// caller gets the refusal and the job never existed.
func (e *Engine) unstartLocked(j *Job) {
	stopTimer(j.timer)
	delete(e.jobs, j.ID)
	if j.idemKey != "" && e.idem[j.idemKey] == j.ID {
		delete(e.idem, j.idemKey)
	}
	e.activeDoneLocked()
}

// deliveryLocked is the job as the ingress hands it to a dispatcher, with
// what is left of its TTL now.
func (e *Engine) deliveryLocked(j *Job, now time.Time) Delivery {
	d := Delivery{
		JobID: j.ID, Gen: j.gen, Queue: j.Queue, Ingress: e.cfg.Node,
		Input: j.Env.Input, Options: j.Env.Options, Capabilities: j.Env.Capabilities, Zone: j.Env.Zone,
		TTL: j.deadline.Sub(now), MaxOutputBytes: j.Limits.MaxOutputBytes,
		MaxQueueDepth: j.Limits.MaxQueueDepth, MaxQueueBytes: j.Limits.MaxQueueBytes,
	}
	for c := range j.exclude {
		d.Exclude = append(d.Exclude, c)
	}
	slices.Sort(d.Exclude)
	return d
}

// Job returns the job record for streaming.
func (e *Engine) Job(id string) (*Job, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	j := e.jobs[id]
	if j == nil {
		return nil, &Error{Code: CodeJobNotFound, Detail: "no job with this id on this node (it may have ended more than the retention ago)"}
	}
	return j, nil
}

// View returns a snapshot of a job.
func (e *Engine) View(id string) (JobView, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	j := e.jobs[id]
	if j == nil {
		return JobView{}, &Error{Code: CodeJobNotFound, Detail: "no job with this id on this node"}
	}
	return j.view(time.Now()), nil
}

// Cancel ends a job as cancelled; a worker running it is told at once. It
// returns the job's view afterwards. Cancelling an ended job changes nothing.
func (e *Engine) Cancel(id, detail string) (JobView, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	j := e.jobs[id]
	if j == nil {
		return JobView{}, &Error{Code: CodeJobNotFound, Detail: "no job with this id on this node"}
	}
	e.finishLocked(j, CodeCancelled, detail, nil)
	return j.view(time.Now()), nil
}

// StreamOpened records that a client is reading the job's stream. It
// reports whether this stream saved the job from its disconnect grace
// window: such a stream takes over from the POST's stream, so its own
// client leaving starts the window again.
func (e *Engine) StreamOpened(id string) (adopted bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if j := e.jobs[id]; j != nil {
		j.streams++
		if j.graceTimer != nil && j.graceTimer.Stop() {
			j.graceTimer = nil
			e.m.GraceSaves.Inc()
			return true
		}
	}
	return false
}

// StreamClosed records that a client stopped reading. When owner is true the
// stream was the one opened by the job's own POST: its client leaving
// cancels the job, after the envelope's grace window if it asked for one
// and no other stream is reading.
func (e *Engine) StreamClosed(id string, owner bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	j := e.jobs[id]
	if j == nil {
		return
	}
	j.streams--
	if !owner || j.state.Terminal() {
		return
	}
	if j.Limits.Grace <= 0 {
		e.finishLocked(j, CodeCancelled, "the client disconnected", nil)
		return
	}
	j.graceTimer = time.AfterFunc(j.Limits.Grace, func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		if j.streams <= 0 && !e.closed {
			e.finishLocked(j, CodeCancelled, "the client disconnected and did not resume within the grace window", nil)
		}
	})
}

// ingressDeadline is the backstop: a job whose TTL ran out without anyone
// downstream failing it is expired here, and its worker told to stop.
func (e *Engine) ingressDeadline(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if j := e.jobs[id]; j != nil && !e.closed {
		e.finishLocked(j, CodeExpired, "the job's TTL ran out", nil)
	}
}

// onAccepted: the consumer host says a worker took the job.
func (e *Engine) onAcceptedLocked(id string, gen uint64, consumer, name string) bool {
	j := e.jobs[id]
	if j == nil || gen != j.gen || !j.state.CanMove(StateRunning) && j.state != StateQueued {
		return false
	}
	j.consumer, j.worker, j.state = consumer, name, StateRunning
	return true
}

// onOffered: the dispatcher bound the job to a consumer.
func (e *Engine) onOfferedLocked(id string, gen uint64, consumer, name string) {
	if j := e.jobs[id]; j != nil && j.gen == gen && j.state.CanMove(StateOffered) {
		j.consumer, j.worker, j.state = consumer, name, StateOffered
	}
}

// onOutputLocked appends one output. It returns the code to fail the job
// with when the output breaks a limit, or a stale flag when (job, gen) is
// not the current binding.
func (e *Engine) onOutputLocked(id string, gen uint64, data []byte) (stale bool) {
	j := e.jobs[id]
	if j == nil || j.gen != gen || j.state != StateRunning {
		return true
	}
	// Compacting validates, and keeps a worker's newlines out of SSE data.
	var buf bytes.Buffer
	if err := json.Compact(&buf, data); err != nil || !json.Valid(data) {
		e.finishLocked(j, CodeBadOutput, "the worker sent output that is not one JSON value", nil)
		return false
	}
	data = buf.Bytes()
	j.outBytes += int64(len(data))
	if j.outBytes > j.Limits.MaxOutputBytes {
		e.finishLocked(j, CodeOutputTooLarge, "the job's output passed its max_output_bytes", nil)
		return false
	}
	if !j.produced {
		j.produced = true
		j.firstOutputAt = time.Now()
		e.m.TimeToFirst.Observe(j.firstOutputAt.Sub(j.Created).Seconds())
	}
	j.outputs++
	j.History.Append(EventOutput, gen, mustJSON(map[string]any{"data": json.RawMessage(data)}))
	return false
}

// onEndLocked: the worker completed (code "") or failed the job.
func (e *Engine) onEndLocked(id string, gen uint64, code Code, detail string, result json.RawMessage) bool {
	j := e.jobs[id]
	if j == nil || j.gen != gen || j.state.Terminal() {
		return false
	}
	if code == "" && result != nil && !json.Valid(result) {
		code, detail, result = CodeBadOutput, "the worker's result is not one JSON value", nil
	}
	return e.finishLocked(j, code, detail, result)
}

// releaseAtIngressLocked decides what happens to a job whose binding (job,
// gen) ended without an outcome: a worker refused it (rejected), or the
// worker or its node was lost. The ingress decides because it is the node
// that saw the output: a job that produced some fails worker_lost (no
// silent restart); otherwise it goes back to its queue under a new
// generation, never again to a consumer that refused it, and fails
// rejected when no other capable consumer is left.
func (e *Engine) releaseAtIngressLocked(id string, gen uint64, consumer string, rejected bool, reason string) {
	j := e.jobs[id]
	if j == nil || j.state.Terminal() || gen != j.gen {
		e.m.StaleMessages.WithLabelValues("release").Inc()
		return
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
		if j.produced {
			e.finishLocked(j, CodeWorkerLost, "the worker was lost after it had produced output: "+reason, nil)
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
		payload := map[string]any{"outcome": outcome}
		if result != nil {
			payload["result"] = result
		}
		j.History.Append(EventDone, j.gen, mustJSON(payload))
	} else {
		j.History.Append(EventError, j.gen, mustJSON(map[string]any{"outcome": outcome, "code": code, "detail": detail}))
	}
	e.m.Jobs.WithLabelValues(string(outcome)).Inc()
	e.m.Duration.WithLabelValues(string(outcome)).Observe(now.Sub(j.Created).Seconds())
	e.activeDoneLocked()
	stopTimer(j.timer)
	stopTimer(j.graceTimer)
	e.withdrawLocked(j, code)
	if !e.closed {
		j.timer = time.AfterFunc(e.cfg.Retention, func() { e.forget(j.ID) })
	}
	e.log.Debug("job ended", "job", j.ID, "queue", j.Queue, "outcome", outcome, "code", code)
	return true
}

func (e *Engine) forget(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if j := e.jobs[id]; j != nil && j.state.Terminal() {
		delete(e.jobs, id)
		if j.idemKey != "" && e.idem[j.idemKey] == id {
			delete(e.idem, j.idemKey)
		}
	}
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic("core: marshal event: " + err.Error())
	}
	return b
}
