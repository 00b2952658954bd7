package core

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// This file is the ingress role: the job record, its history and its one
// terminal outcome. Nothing here talks to a worker directly.

// SubmitOptions are the transport-level facts about a submission.
type SubmitOptions struct {
	// IdempotencyKey makes a retried submission return the same job.
	IdempotencyKey string
	// Streamed says the submitting request streams the job's events (an
	// SSE POST, a gRPC Submit). Such a job lives while its submitter reads
	// it — through the submission's own stream or one resumed with a valid
	// token — plus a grace window (see StreamClosed); any other job lives
	// until its TTL or a cancel. It has no effect on a job an idempotency
	// key matched.
	Streamed bool
	// Owner is the subject the job belongs to (the key's; "" on a node
	// without keys): transports show the job to its owner alone, and to
	// admins. An idempotency key is its owner's: the same key from another
	// subject is another key.
	Owner string
	// Share is the owner's fair-share weight and priority cap, from its
	// key: the envelope's priority above the cap is refused
	// (priority_not_allowed), and the weight travels with the job to its
	// dispatcher (scheduling.go).
	Share Share
	// OnEnd, if set, is called once when a job this call created ends,
	// with the engine's lock held: it must be quick and must not call the
	// engine. It is not called when Submit returns an error or an existing
	// job (the caller knows then that no job of its own was made).
	OnEnd func()
}

// Submit validates an envelope against the node's limits and the consumer
// registry and, if it passes, creates the job and hands it to the queue's
// dispatcher. A refusal changes nothing. existing is true when an
// idempotency key matched a job created earlier.
func (e *Engine) Submit(ctx context.Context, queue string, env *Envelope, opts SubmitOptions) (*Job, bool, error) {
	if err := checkIdempotencyKey(opts.IdempotencyKey); err != nil {
		return nil, false, err
	}
	if opts.IdempotencyKey != "" && e.cfg.Idempotency != nil {
		return e.submitKeyed(ctx, queue, env, opts)
	}
	return e.submit(ctx, queue, env, opts, "")
}

// submit is Submit's work, making the job under id (a new one for "").
func (e *Engine) submit(ctx context.Context, queue string, env *Envelope, opts SubmitOptions, id string) (*Job, bool, error) {
	if err := CheckQueueName(queue); err != nil {
		return nil, false, err
	}
	eff, err := e.cfg.Limits.Apply(env)
	if err != nil {
		return nil, false, err
	}
	if err := opts.Share.allow(env.Priority); err != nil {
		return nil, false, err
	}
	dispatcher, err := e.dispatcherFor(ctx, queue, env)
	if err != nil {
		return nil, false, err
	}
	now := time.Now()

	hash := ""
	if opts.IdempotencyKey != "" {
		hash = submissionHash(queue, env)
	}
	// The job's span starts before the lock (an SDK's Start is not the
	// engine's to hold it for); a refusal below ends it with its code.
	span, sc := e.startJobSpan(ctx, queue)
	e.mu.Lock()
	if old, err := e.admitLocked(queue, env, opts, hash); old != nil || err != nil {
		e.mu.Unlock()
		if old != nil {
			// A retry: the job is the one its first submission made.
			endSpan(span, "existing", "", AttrJob.String(old.ID))
		} else {
			endSpan(span, "refused", codeOr(err, ""))
		}
		return old, old != nil, err
	}
	j := e.newJob(queue, env, eff, opts, dispatcher, now)
	if id != "" {
		j.ID = id
	}
	j.span, j.trace = span, sc
	if recording(span) {
		span.SetAttributes(AttrJob.String(j.ID))
	}
	j.idemHash = hash
	d := e.deliveryLocked(j, now)
	if dispatcher == "" {
		// No dispatcher could be found or elected now: the job is accepted
		// and waits for one (reroute.go), never refused while a capable
		// consumer lives.
		e.startLocked(j)
		e.awaitDispatcherLocked(j)
		e.mu.Unlock()
		return j, false, nil
	}
	if dispatcher != e.cfg.Node {
		// A remote dispatcher: the record exists before the forward, so an
		// answer that races the forward's own response finds its job.
		e.startLocked(j)
		e.mu.Unlock()
		return e.forwardNew(ctx, j, dispatcher, d)
	}
	defer e.mu.Unlock()
	// The dispatcher checks depth and bytes; refusing there, before the
	// job record exists, is what makes "over a cap changes nothing" true.
	if err := e.enqueueLocked(d, now); err != nil {
		endSpan(span, "refused", codeOr(err, ""))
		return nil, false, err
	}
	e.startLocked(j)
	e.dispatchLocked(e.queues[queue])
	return j, false, nil
}

// dispatcherFor is the node whose dispatcher holds queue's pending jobs:
// this node when it is alone, else the one the catalog names, elected now
// if need be. Electing may write to the catalog, so it happens before
// Submit takes the lock; the view answers without waiting when the queue
// already has a live dispatcher. "" when none could be found or elected:
// the record names a node that is not routable (silent, or gone and not
// yet replaced), or the catalog did not answer; the job then waits for one.
func (e *Engine) dispatcherFor(ctx context.Context, queue string, env *Envelope) (string, error) {
	if e.cluster == nil {
		return e.cfg.Node, nil
	}
	// Refuse what no consumer can run before touching the catalog: a
	// refusal changes nothing, not even the queue's dispatch record. A
	// draining node is refused here for the same reason: an election now
	// could name it dispatcher of a queue it is leaving.
	e.mu.Lock()
	draining := e.draining || e.closed
	capable := e.capableLocked(queue, env.Capabilities, env.Zone, nil)
	e.mu.Unlock()
	if draining {
		return "", errDraining()
	}
	if !capable {
		return "", &Error{Code: CodeNoCapableWorker, Detail: "no registered worker on this queue has the required capabilities", RetryAfter: time.Second}
	}
	if dispatcher, ok := e.cluster.CachedDispatcher(queue); ok {
		// What Dispatcher answers first, without the election's deadline
		// (a context and a timer per job).
		return dispatcher, nil
	}
	dctx, cancel := context.WithTimeout(ctx, electAttempt)
	defer cancel()
	dispatcher, err := e.cluster.Dispatcher(dctx, queue)
	if err != nil {
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		e.log.Debug("no dispatcher for queue now; the job waits for one", "queue", queue, "err", err)
		return "", nil
	}
	return dispatcher, nil
}

// admitLocked is Submit's checks under the lock: the refusal of a node
// that is going away, or of a job no consumer can run (any more), or the
// job an idempotency key matched (hash: the submission's, which a retry
// must match). Neither: the job may be created.
func (e *Engine) admitLocked(queue string, env *Envelope, opts SubmitOptions, hash string) (*Job, error) {
	if e.draining || e.closed {
		return nil, errDraining()
	}
	if opts.IdempotencyKey != "" {
		if id, ok := e.idem[idemScope(opts.Owner, opts.IdempotencyKey)]; ok {
			if old := e.jobs[id]; old != nil {
				old, _, err := matchKeyed(old, hash)
				return old, err
			}
		}
	}
	if !e.capableLocked(queue, env.Capabilities, env.Zone, nil) {
		return nil, &Error{Code: CodeNoCapableWorker, Detail: "no registered worker on this queue has the required capabilities", RetryAfter: time.Second}
	}
	return nil, nil
}

// errDraining is Submit's refusal on a node that is going away.
func errDraining() *Error {
	return &Error{Code: CodeDraining, Detail: "the node is shutting down; submit to another node", RetryAfter: time.Second}
}

// newJob is the record of a job Submit admitted, not yet live (see
// startLocked).
func (e *Engine) newJob(queue string, env *Envelope, eff Effective, opts SubmitOptions, dispatcher string, now time.Time) *Job {
	return &Job{
		ID: newID("j_"), Queue: queue, Created: now, Env: env, Limits: eff,
		History:  NewHistory(e.cfg.HistoryEvents, e.cfg.HistoryBytes),
		deadline: now.Add(eff.TTL),
		state:    StateQueued,
		idemKey:  idemScope(opts.Owner, opts.IdempotencyKey),
		Owner:    opts.Owner,
		weight:   opts.Share.weight(),
		onEnd:    opts.OnEnd,
		streamed: opts.Streamed,
		pace:     newPace(e.outputWindow(), 0),
		gen:      1,
		// The generation is the ingress's to allocate: every forward
		// carries a fresh one (see reforwardLocked).
		dispatcher: dispatcher,
	}
}

// forwardNew hands a new job, live since startLocked, to its dispatcher on
// another node and waits for the verdict, at most ForwardWait: a live
// dispatcher answers within milliseconds, so a refusal (queue_full, …) is
// still the caller's answer and undoes the job (unstartLocked), unless
// something answered for the job meanwhile. Past ForwardWait the job is
// accepted as it stands (its stream shows it queued) and the forward goes
// on in the background (forwardOnLocked), bounded by the job's TTL and
// DispatcherWait; its verdict is applied then (forwardVerdictLocked). A
// forward that fails without a verdict never refuses: the job goes back to
// its queue once the dispatcher's death is proven.
//
// The first attempt runs on the caller's goroutine, under a context that
// ends at ForwardWait, when the caller leaves, or when the job ends
// (stopForward): the usual forward, answered in time, costs no goroutine
// and no hand-off to one and back. One that is not answered in time is
// made again from the background: the dispatcher takes a (job,
// generation) once, so an answer to the first that comes late changes
// nothing.
func (e *Engine) forwardNew(ctx context.Context, j *Job, dispatcher string, d Delivery) (*Job, bool, error) {
	// What is left now, the ingress's own time included, is what travels.
	d.TTL = time.Until(j.deadline)
	e.mu.Lock()
	if j.state.Terminal() {
		e.mu.Unlock()
		return j, false, nil
	}
	start := time.Now()
	wait := min(e.cfg.ForwardWait, e.forwardUntil(j, start).Sub(start))
	wctx, stop := context.WithTimeout(ctx, wait)
	j.stopForward = stop
	fspan := e.startSpan(j.trace, SpanForward, trace.SpanKindProducer, AttrJob.String(j.ID), AttrQueue.String(j.Queue),
		AttrNode.String(e.cfg.Node), AttrPeer.String(dispatcher), AttrGeneration.Int64(int64(d.Gen)))
	d.Trace = spanContext(fspan, j.trace)
	if fspan != nil {
		wctx = trace.ContextWithSpan(wctx, fspan)
	}
	e.mu.Unlock()

	ferr := e.transport.Forward(wctx, dispatcher, d)
	// No verdict: the wait ended first (ForwardWait, the caller gone, the
	// job ended), and the error only says so.
	late := ferr != nil && wctx.Err() != nil &&
		(errors.Is(ferr, context.DeadlineExceeded) || errors.Is(ferr, context.Canceled))
	stop()

	e.mu.Lock()
	defer e.mu.Unlock()
	if late {
		if err := ctx.Err(); err != nil && !j.state.Terminal() {
			// The caller left before the job was accepted: nobody will
			// read it. Its cancel follows the forward on its delivery
			// stream, if it went. The caller gets an error, so OnEnd is
			// not called.
			endSpan(fspan, forwardResult(ferr, j.host != ""), codeOr(ferr, ""))
			j.onEnd = nil
			e.finishLocked(j, CodeCancelled, "the client went away before the job was accepted", nil)
			return nil, false, err
		}
		if j.state.Terminal() || j.gen != d.Gen {
			// Something answered for the job meanwhile: it stands.
			endSpan(fspan, forwardResult(ferr, j.host != ""), codeOr(ferr, ""))
			return j, false, nil
		}
		// Accepted: the forward goes on, and its verdict is applied when
		// it comes.
		e.forwardOnLocked(j, dispatcher, d, fspan, start)
		return j, false, nil
	}
	endSpan(fspan, forwardResult(ferr, j.host != ""), codeOr(ferr, ""))
	if ferr == nil || j.state.Terminal() || j.gen != d.Gen {
		// Taken, or something answered for the job after all: it stands.
		return j, false, nil
	}
	var ce *Error
	if errors.As(ferr, &ce) && j.host == "" && j.state == StateQueued && ce.Code != CodeDraining {
		e.unstartLocked(j)
		return nil, false, ce
	}
	if ce == nil && !e.cluster.Gone(dispatcher) && !errors.Is(ferr, ErrNodeReplaced) && !errors.Is(ferr, context.DeadlineExceeded) {
		// It failed at once without reaching the node (the job cannot be
		// carried, or the node is not in the catalog and never was): the
		// job never left, and the refusal changes nothing.
		e.unstartLocked(j)
		e.logJob(j.trace, slog.LevelWarn, "forward to dispatcher failed", "queue", j.Queue, "dispatcher", dispatcher, "job", j.ID, "err", ferr)
		return nil, false, &Error{Code: CodeDispatcherUnavailable, Detail: "the queue's dispatcher on another node could not be reached", RetryAfter: time.Second}
	}
	e.forwardVerdictLocked(j, dispatcher, d.Gen, ferr)
	return j, false, nil
}

// forwardUntil is when a forward of j that began at start gives up: after
// DispatcherWait, or at the job's deadline if that comes first.
func (e *Engine) forwardUntil(j *Job, start time.Time) time.Time {
	until := start.Add(e.cfg.DispatcherWait)
	if j.deadline.Before(until) {
		until = j.deadline
	}
	return until
}

// forwardOnLocked goes on with a new job's forward that got no verdict
// within ForwardWait (forwardNew began it at start), in the background,
// and applies its verdict when it comes. fspan is the forward's span,
// ended then.
func (e *Engine) forwardOnLocked(j *Job, dispatcher string, d Delivery, fspan trace.Span, start time.Time) {
	if e.closed {
		endSpan(fspan, "no verdict", "")
		return
	}
	fctx, stop := context.WithDeadline(e.bgCtx, e.forwardUntil(j, start))
	j.stopForward = stop
	if fspan != nil {
		fctx = trace.ContextWithSpan(fctx, fspan)
	}
	e.goLocked(func(context.Context) {
		defer stop()
		err := e.transport.Forward(fctx, dispatcher, d)
		e.mu.Lock()
		defer e.mu.Unlock()
		endSpan(fspan, forwardResult(err, j.host != ""), codeOr(err, ""))
		e.forwardVerdictLocked(j, dispatcher, d.Gen, err)
	})
}

// startLocked makes a new job live: indexed, counted, its first event
// written and its ingress deadline armed.
func (e *Engine) startLocked(j *Job) {
	e.jobs[j.ID] = j
	if j.idemKey != "" {
		e.idem[j.idemKey] = j.ID
	}
	e.active++
	j.History.Append(EventAccepted, 0, acceptedData{
		Queue: j.Queue, TraceID: j.trace.TraceID().String(), TTLMs: j.Limits.TTL.Milliseconds(),
	}.encode())
	j.timer = time.AfterFunc(j.Limits.TTL+e.cfg.ExpirySlack, func() { e.ingressDeadline(j.ID) })
}

// unstartLocked undoes startLocked for a job its dispatcher refused: the
// caller gets the refusal and the job never existed.
func (e *Engine) unstartLocked(j *Job) {
	endSpan(j.span, "refused", j.code)
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
		Window: j.pace.window, Trace: j.trace,
		Subject: j.Owner, Weight: j.weight, Priority: j.Env.Priority, AffinityKey: j.Env.AffinityKey,
	}
	for c := range j.exclude {
		d.Exclude = append(d.Exclude, c)
	}
	slices.Sort(d.Exclude)
	return d
}

// idemScope is the index key of an idempotency key: its owner's ("" for
// none).
func idemScope(owner, key string) string {
	if key == "" {
		return ""
	}
	return owner + "\x00" + key
}

// Job returns the job record for streaming.
func (e *Engine) Job(id string) (*Job, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	j := e.jobs[id]
	if j == nil {
		return nil, errJobNotFound()
	}
	return j, nil
}

// JobNotFound is the answer for a job the caller may not see: word for
// word the answer for one the node does not have, so that an id cannot be
// probed.
func JobNotFound() *Error { return errJobNotFound() }

// errJobNotFound is the answer for an id the node has no record of: it
// never had it, or the job ended and was evicted (retain.go). The two are
// one answer: telling them apart would take a record of every evicted job.
func errJobNotFound() *Error {
	return &Error{Code: CodeJobNotFound, Detail: "no job with this id on this node: it never existed here, or it ended and is no longer retained (a node keeps ended jobs for a limited time, number and size)"}
}

// View returns a snapshot of a job.
func (e *Engine) View(id string) (JobView, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	j := e.jobs[id]
	if j == nil {
		return JobView{}, errJobNotFound()
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
		return JobView{}, errJobNotFound()
	}
	e.finishLocked(j, CodeCancelled, detail, nil)
	return j.view(time.Now()), nil
}

// StreamOpened records that a stream of the job opened and reports whether
// it is an owner stream: one that keeps the job alive. claim is the
// transport's word that the stream is the submitter's — the stream of the
// job's own submission, or a resume whose token verified (the token is the
// proof: it is signed for the caller and the stream's filter). Only a job
// submitted as streamed has owner streams. An owner stream opened during the
// job's grace window saves the job: the window stops. Any other stream only
// watches, and its coming and going changes nothing.
func (e *Engine) StreamOpened(id string, claim bool) (owner bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	j := e.jobs[id]
	if j == nil || !claim || !j.streamed || j.state.Terminal() {
		return false
	}
	j.owners++
	if j.graceTimer != nil {
		// Stopped, or fired with its callback still waiting for e.mu: either
		// way the window is over without a cancel (the callback checks that
		// it is still the job's window).
		j.graceTimer.Stop()
		j.graceTimer = nil
		e.m.GraceSaves.Inc()
	}
	return true
}

// StreamClosed records that a stream ended; owner is what StreamOpened
// returned for it, and a stream that was not an owner changes nothing. When
// the last owner stream of a running job ends, the job is given a grace
// window to be resumed in, and is cancelled if no owner stream opens
// within it:
//   - clientLeft (the client went away, or stopped reading so that a write
//     failed): the envelope's grace window; without one the job is
//     cancelled at once.
//   - otherwise the node ended the stream (slow consumer, idle, max
//     duration, resync) and told the client to resume: the envelope's
//     window, or the node's MaxGrace if it asked for none. Cancelling at
//     once would break the node's own word, and running to the TTL would
//     hold a worker for a client that may never come back. With a MaxGrace
//     of 0 there is no window to give, and the job runs to its TTL.
func (e *Engine) StreamClosed(id string, owner, clientLeft bool) {
	if !owner {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	j := e.jobs[id]
	if j == nil {
		return
	}
	j.owners--
	if j.owners > 0 || j.state.Terminal() || e.closed {
		return
	}
	window, detail := j.Limits.Grace, "the client disconnected and did not resume within the grace window"
	switch {
	case clientLeft && window <= 0:
		e.finishLocked(j, CodeCancelled, "the client disconnected", nil)
		return
	case !clientLeft:
		if window <= 0 {
			window = e.cfg.Limits.MaxGrace
		}
		detail = "the node ended the client's stream and the client did not resume within the grace window"
	}
	if window <= 0 {
		return
	}
	stopTimer(j.graceTimer)
	var t *time.Timer
	t = time.AfterFunc(window, func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		// A window that an owner stream stopped, or that a later one
		// replaced, is not this timer's to end.
		if j.graceTimer != t || e.closed {
			return
		}
		j.graceTimer = nil
		if j.owners <= 0 {
			e.finishLocked(j, CodeCancelled, detail, nil)
		}
	})
	j.graceTimer = t
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
	e.startAttemptLocked(j, time.Now())
	if recording(j.span) {
		j.span.AddEvent("accepted", trace.WithAttributes(AttrConsumer.String(consumer), AttrWorker.String(name), AttrGeneration.Int64(int64(gen))))
	}
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
	// Credit counts the output as the worker sent it.
	size := int64(len(data))
	ev, n, ok := outputEvent(data)
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
	appended, _ := j.History.Append(EventOutput, gen, ev)
	e.outputTakenLocked(j, appended.Seq, size)
	return false
}

// onEndLocked: the worker completed (code "") or failed the job.
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
	e.retainLocked(j)
	if e.log.Enabled(context.Background(), slog.LevelDebug) { // else its arguments are built for nothing, once per job
		e.logJob(j.trace, slog.LevelDebug, "job ended", "job", j.ID, "queue", j.Queue, "outcome", outcome, "code", code)
	}
	return true
}
