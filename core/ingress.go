package core

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// This file is the ingress's side of a submission: the checks, the job
// record made live with its history, and the job handed to its queue's
// dispatcher, in process or forwarded to another node. A job's reads,
// cancel and streams are ingress_reads.go; what the dispatcher and the host
// tell the ingress, and the job's one terminal outcome, ingress_replies.go.
// Nothing the ingress does talks to a worker directly.

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
	e.active.Add(1)
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
// what is left of its TTL now. It is latency first when j is the only job
// this node holds as their ingress, started (a resend) or about to be.
func (e *Engine) deliveryLocked(j *Job, now time.Time) Delivery {
	others := e.active.Load()
	if e.jobs[j.ID] == j {
		others--
	}
	d := Delivery{
		JobID: j.ID, Gen: j.gen, Queue: j.Queue, Ingress: e.cfg.Node,
		Input: j.Env.Input, Options: j.Env.Options, Capabilities: j.Env.Capabilities, Zone: j.Env.Zone,
		TTL: j.deadline.Sub(now), MaxOutputBytes: j.Limits.MaxOutputBytes,
		MaxQueueDepth: j.Limits.MaxQueueDepth, MaxQueueBytes: j.Limits.MaxQueueBytes,
		Window: j.pace.window, Trace: j.trace,
		Subject: j.Owner, Weight: j.weight, Priority: j.Env.Priority, AffinityKey: j.Env.AffinityKey,
		LatencyFirst: others == 0,
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
