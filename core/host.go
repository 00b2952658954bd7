package core

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// This file is the consumer-host role: worker sessions, their credits and
// their bindings, and the relay of accept, reject, output and end.

// Offer is a job as a worker receives it.
type Offer struct {
	JobID          string
	Gen            uint64
	Queue          string
	Input          json.RawMessage
	Options        json.RawMessage
	Capabilities   []string
	TTL            time.Duration
	MaxOutputBytes int64
	// Credit is the job's first output credit, its window: the output the
	// worker may send before it is granted more (see WorkerConn.SendCredit).
	// Zero: the job is not paced.
	Credit OutputCredit
	// AffinityKey and Priority are the envelope's: a worker may key a
	// cache or a session by the one, and the dispatcher ordered the job by
	// the other.
	AffinityKey string
	Priority    int
	// Trace is the span context of the offer: the worker's own spans of
	// the job are its children (the transport hands it on as a W3C
	// traceparent).
	Trace trace.SpanContext
}

// WorkerConn is the transport's side of a worker session. Its methods are
// called with Engine.mu held and must not block: they queue the message for
// the session's single stream writer and report an error if they cannot
// (the session is then dropped, exactly like a stall).
type WorkerConn interface {
	SendOffer(Offer) error
	SendCancel(jobID string, gen uint64, reason Code) error
	// SendCredit passes on a grant of output credit for binding (job, gen):
	// how much output it may have sent in all (cumulative, so only the
	// newest matters). A transport whose worker cannot see its credit
	// ignores it and waits for credit with Worker.OutputOrWait instead.
	SendCredit(jobID string, gen uint64, c OutputCredit) error
	// Close ends the session from the node's side; the transport then calls
	// Worker.Detach as it does for any session that ends.
	Close(cause error)
}

// WorkerSpec is what a worker declares when it registers.
type WorkerSpec struct {
	Queue        string
	Name         string
	Capabilities []string
	Concurrency  int
}

// Worker is one registered worker session on this node (a consumer).
type Worker struct {
	ID           string
	Name         string
	Queue        string
	Capabilities Capabilities
	Concurrency  int

	e    *Engine
	conn WorkerConn

	// guarded by Engine.mu
	bindings map[string]*binding
	gone     bool
}

// binding is a job bound to a worker, as the host tracks it.
type binding struct {
	t          *task
	accepted   bool
	cancelling bool
	// relayed: an output of the job went to its remote ingress (Output's
	// report, with the delivery's LatencyFirst).
	relayed bool
	timer   *time.Timer
	// short is set when the job's own TTL cut the accept window below
	// DispatchTimeoutFloor: missing it is the job running out of time, not
	// the worker stalling.
	short bool
	// credit is the binding's output credit (credit.go).
	credit hostCredit
	// offer is the offer's span until the worker answers it, run the
	// run's from the accept; each nil once ended (trace.go). cancelCode
	// is why the binding is cancelling, for the span of its end.
	offer, run trace.Span
	cancelCode Code
}

// endSpans ends whichever of the binding's spans is open, with result and
// code, and the output it relayed.
func (b *binding) endSpans(result string, code Code) {
	if b.offer != nil {
		endSpan(b.offer, result, code)
		b.offer = nil
	}
	if b.run != nil {
		endSpan(b.run, result, code, AttrOutputs.Int64(b.credit.used.Events), AttrOutputBytes.Int64(b.credit.used.Bytes))
		b.run = nil
	}
}

// ErrStalled is the cause given to a session dropped for not answering.
var ErrStalled = errors.New("core: worker did not answer within the dispatch timeout")

// AttachWorker registers a worker session: it validates the declaration,
// publishes the consumer record to the catalog (so ingress nodes anywhere
// can match capabilities against it), then makes the worker eligible.
func (e *Engine) AttachWorker(ctx context.Context, spec WorkerSpec, conn WorkerConn) (*Worker, error) {
	if err := CheckQueueName(spec.Queue); err != nil {
		return nil, err
	}
	caps, err := ParseCapabilities(spec.Capabilities)
	if err != nil {
		return nil, &Error{Code: CodeInvalidWorker, Field: "capabilities", Detail: err.Error()}
	}
	if spec.Concurrency == 0 {
		spec.Concurrency = 1
	}
	if spec.Concurrency < 0 || spec.Concurrency > MaxWorkerConcurrency {
		return nil, &Error{Code: CodeInvalidWorker, Field: "concurrency", Detail: fmt.Sprintf("concurrency must be between 1 and %d", MaxWorkerConcurrency)}
	}
	if len(spec.Name) > 128 {
		return nil, &Error{Code: CodeInvalidWorker, Field: "name", Detail: "name must be at most 128 bytes"}
	}
	w := &Worker{
		ID: newID("c_"), Name: spec.Name, Queue: spec.Queue, Capabilities: caps,
		Concurrency: spec.Concurrency, e: e, conn: conn, bindings: map[string]*binding{},
	}
	if e.Draining() {
		// Checked before the catalog write too: a draining node must not
		// publish a consumer it will not keep.
		return nil, errWorkerDraining()
	}
	if e.cat != nil {
		if err := e.cat.PublishConsumer(ctx, w.record(caps)); err != nil {
			return nil, e.catalogUnavailable(ctx, "publish consumer", err)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.draining || e.closed {
		// It drained while the record was written: the record goes with
		// the node's lease.
		return nil, errWorkerDraining()
	}
	e.workers[w.ID] = w
	q := e.queueLocked(w.Queue)
	q.workers = append(q.workers, w)
	e.m.WorkersConnected.Inc()
	e.log.Info("worker registered", "consumer", w.ID, "name", w.Name, "queue", w.Queue, "capabilities", caps.Strings(), "concurrency", w.Concurrency)
	e.dispatchLocked(q)
	if e.cluster != nil {
		// A consumer's node claims the queue at once, taking it over from a
		// dispatcher that hosts no consumer: the dispatcher then sits at the
		// consumer's end and a job costs one hop to reach it. The claim is a
		// catalog write, off this caller's path.
		e.goLocked(func(ctx context.Context) {
			if err := e.cluster.ClaimConsumer(ctx, w.Queue); err != nil {
				e.log.Warn("claim queue as consumer host", "queue", w.Queue, "err", err)
			}
		})
	}
	return w, nil
}

// errWorkerDraining refuses a worker's registration on a node that is
// going away; the worker registers on another node, or here once the node
// is back.
func errWorkerDraining() *Error {
	return &Error{Code: CodeDraining, Detail: "the node is shutting down", RetryAfter: time.Second}
}

// catalogUnavailable is the refusal of a request whose catalog write
// failed: a code the worker retries on, with the cause logged here, where it
// is known, and never sent (it is etcd's, not the caller's). A caller that
// went away gets its context's error instead: nobody reads the answer, and
// its going is not the catalog's fault.
func (e *Engine) catalogUnavailable(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	e.log.Warn("catalog write failed", "op", op, "err", err)
	return &Error{Code: CodeCatalogUnavailable, Detail: "the node could not write to the catalog; retry", RetryAfter: time.Second}
}

// record is the worker's consumer record with capabilities caps.
func (w *Worker) record(caps Capabilities) ConsumerInfo {
	return ConsumerInfo{
		ID: w.ID, Queue: w.Queue, Node: w.e.cfg.Node, Name: w.Name,
		Capabilities: caps, Concurrency: w.Concurrency, Zone: w.e.cfg.Zone,
	}
}

// UpdateCapabilities replaces what the worker declared it can run. The
// consumer record is republished first, so ingress nodes elsewhere match
// against the new set; jobs already bound keep running (they matched when
// they were bound), and waiting jobs the worker can now run are offered.
func (w *Worker) UpdateCapabilities(ctx context.Context, capabilities []string) error {
	caps, err := ParseCapabilities(capabilities)
	if err != nil {
		return &Error{Code: CodeInvalidWorker, Field: "capabilities", Detail: err.Error()}
	}
	e := w.e
	if e.cat != nil {
		if err := e.cat.PublishConsumer(ctx, w.record(caps)); err != nil {
			return e.catalogUnavailable(ctx, "republish consumer", err)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if w.gone {
		// Detach withdrew the record before this republished it.
		if e.cat != nil {
			e.goLocked(func(ctx context.Context) { _ = e.cat.WithdrawConsumer(ctx, w.Queue, w.ID) })
		}
		return &Error{Code: CodeInvalidWorker, Detail: "the worker session has ended"}
	}
	w.Capabilities = caps
	e.log.Info("worker capabilities changed", "consumer", w.ID, "name", w.Name, "queue", w.Queue, "capabilities", caps.Strings())
	e.dispatchLocked(e.queues[w.Queue])
	return nil
}

// offerLocked sends a bound job to the worker and arms the accept deadline.
func (e *Engine) offerLocked(w *Worker, t *task) {
	left := t.budget.Remaining(time.Now())
	b := &binding{t: t, credit: hostCredit{granted: t.d.Window}}
	w.bindings[t.d.JobID] = b
	e.hosted[t.d.JobID] = w
	wait := DispatchTimeout(left, e.cfg.DispatchTimeoutFloor, e.cfg.DispatchTimeoutCeiling, e.cfg.DispatchTimeoutFraction)
	b.short = wait < e.cfg.DispatchTimeoutFloor
	b.timer = time.AfterFunc(wait, func() { e.stalled(w, t.d.JobID, t.d.Gen) })
	b.offer = e.startSpan(t.d.Trace, SpanOffer, trace.SpanKindProducer, AttrJob.String(t.d.JobID), AttrQueue.String(t.d.Queue),
		AttrNode.String(e.cfg.Node), AttrGeneration.Int64(int64(t.d.Gen)), AttrConsumer.String(w.ID), AttrWorker.String(w.Name))
	err := w.conn.SendOffer(Offer{
		JobID: t.d.JobID, Gen: t.d.Gen, Queue: t.d.Queue, Input: t.d.Input, Options: t.d.Options,
		Capabilities: capabilityStrings(t.d.Capabilities), TTL: left, MaxOutputBytes: t.d.MaxOutputBytes,
		Credit: t.d.Window, Trace: spanContext(b.offer, t.d.Trace),
		AffinityKey: t.d.AffinityKey, Priority: t.d.Priority,
	})
	if err != nil {
		e.dropLocked(w, fmt.Errorf("send offer: %w", err))
		return
	}
	if t.d.Ingress != e.cfg.Node {
		// After the offer: the worker's session goes first, the leg's
		// stream is set up while the worker starts.
		e.transport.Expect(t.d.Ingress, t.d.JobID, t.d.Gen, t.d.Queue, left)
	}
}

// stalled fires when a worker did not accept (or acknowledge a cancel) in
// time. A stall is the worker being slow or gone, so it is dropped; its jobs
// follow the lost-worker rule. (A reject is different: see Reject.)
func (e *Engine) stalled(w *Worker, id string, gen uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	b := w.bindings[id]
	if e.closed || w.gone || b == nil || b.t.d.Gen != gen || (b.accepted && !b.cancelling) {
		return
	}
	if b.short && !b.accepted && !b.cancelling {
		// The worker was not given the floor: expire the job and tell the
		// worker to stop it, rather than drop a healthy worker and every
		// other job it runs.
		e.cancelOnWorkerLocked(w, id, gen, CodeExpired)
		e.failAtIngressLocked(b.t.d, CodeExpired, "too little of the job's TTL was left for a worker to accept it in time")
		return
	}
	e.m.Stalls.Inc()
	e.logJob(b.t.d.Trace, slog.LevelWarn, "worker stalled; dropping it", "consumer", w.ID, "name", w.Name, "job", id, "cancelling", b.cancelling)
	b.endSpans("stalled", CodeWorkerLost)
	e.dropLocked(w, ErrStalled)
}

// dropLocked removes a worker from service now and closes its session.
func (e *Engine) dropLocked(w *Worker, cause error) {
	if w.gone {
		return
	}
	e.detachLocked(w)
	w.conn.Close(cause)
}

// Detach ends a worker session: called by the transport when the stream
// ends for any reason. Its bound jobs that produced no output go back to
// the queue; the others fail worker_lost. Detach is idempotent.
func (w *Worker) Detach(ctx context.Context) {
	e := w.e
	e.mu.Lock()
	e.detachLocked(w)
	e.mu.Unlock()
	if e.cluster != nil && !e.cluster.LeaseValid() {
		// The record goes with the lease; a write now would only wait on a
		// catalog this node has lost.
		return
	}
	if e.cat != nil {
		if err := e.cat.WithdrawConsumer(ctx, w.Queue, w.ID); err != nil {
			// The record is attached to the node's lease: it goes when the
			// node does, so a failed withdraw leaves a stale entry, not a leak.
			e.log.Warn("withdraw consumer", "consumer", w.ID, "err", err)
		}
	}
}

func (e *Engine) detachLocked(w *Worker) {
	if w.gone {
		return
	}
	w.gone = true
	delete(e.workers, w.ID)
	e.m.WorkersConnected.Dec()
	q := e.queues[w.Queue]
	if q != nil {
		if i := indexOf(q.workers, w); i >= 0 {
			q.workers = append(q.workers[:i:i], q.workers[i+1:]...)
		}
	}
	for id, b := range w.bindings {
		b.endSpans("worker lost", CodeWorkerLost)
		w.releaseLocked(id, b)
		if !b.cancelling {
			e.releaseToIngressLocked(b.t.d, w.ID, false, "the worker disconnected")
		}
	}
	e.log.Info("worker withdrawn", "consumer", w.ID, "name", w.Name, "queue", w.Queue)
	e.dispatchLocked(q)
	if q != nil {
		e.idleLocked(q)
	}
}

// bindingLocked returns the binding a worker message refers to, or nil (and
// counts it) when (job, gen) is not this worker's current binding: the
// fencing check every accept, output and end goes through.
func (w *Worker) bindingLocked(kind, id string, gen uint64) *binding {
	b := w.bindings[id]
	if w.gone || b == nil || b.t.d.Gen != gen {
		w.e.m.StaleMessages.WithLabelValues(kind).Inc()
		return nil
	}
	return b
}

// offeredLocked returns the binding an accept or a reject answers:
// bindingLocked's, while the worker has not accepted it; else nil.
func (w *Worker) offeredLocked(kind, id string, gen uint64) *binding {
	if b := w.bindingLocked(kind, id, gen); b != nil && !b.accepted {
		return b
	}
	return nil
}

// Accept records that the worker took a job.
func (w *Worker) Accept(id string, gen uint64) {
	w.e.mu.Lock()
	defer w.e.mu.Unlock()
	if b := w.offeredLocked("accept", id, gen); b != nil {
		w.acceptLocked(b)
	}
}

// acceptLocked relays an accept. To a remote ingress it is sent on its own
// only when the dispatcher is a third node: the ingress must then learn
// where the job runs before that dispatcher could die (see
// Engine.nodesGoneLocked). When this node dispatched the job, the accept
// rides on the first output or the end instead, which keeps a round trip
// at two peer messages (docs/cluster.md, cost model).
func (w *Worker) acceptLocked(b *binding) {
	e := w.e
	b.accepted = true
	if b.cancelling {
		return
	}
	stopTimer(b.timer)
	d := b.t.d
	if b.offer != nil {
		// The run is the offer's child, beside the worker's own spans.
		b.run = e.startSpan(b.offer.SpanContext(), SpanRun, trace.SpanKindInternal, AttrJob.String(d.JobID), AttrQueue.String(d.Queue),
			AttrNode.String(e.cfg.Node), AttrGeneration.Int64(int64(d.Gen)), AttrConsumer.String(w.ID), AttrWorker.String(w.Name))
		endSpan(b.offer, "accepted", "")
		b.offer = nil
	}
	switch {
	case d.Ingress == e.cfg.Node:
		e.onAcceptedLocked(d.JobID, d.Gen, w.ID, w.Name)
	case b.t.from != "" && b.t.from != d.Ingress:
		e.replyLocked(w, d, Message{Accepted: true})
	}
}

// Reject records that the worker refused a job. The worker keeps its
// registration: being wrong for one job is not being dead.
func (w *Worker) Reject(id string, gen uint64, reason string) {
	e := w.e
	e.mu.Lock()
	defer e.mu.Unlock()
	b := w.offeredLocked("reject", id, gen)
	if b == nil {
		return
	}
	if recording(b.offer) {
		b.offer.SetAttributes(AttrReason.String(reason))
	}
	b.endSpans("rejected", "")
	w.releaseLocked(id, b)
	if !b.cancelling {
		e.m.Rejects.Inc()
		e.releaseToIngressLocked(b.t.d, w.ID, true, reason)
	}
	e.dispatchLocked(e.queues[w.Queue])
}

// Output relays one chunk of output to the job's ingress. Output before an
// Accept counts as the accept. It never waits: a paced job's worker sends
// output only within the credit it was given (WorkerConn.SendCredit), and
// an output past it fails the job credit_exceeded (credit.go).
//
// It reports whether data was the first output of a job relayed to a
// remote ingress that sent the job latency first (Delivery.LatencyFirst:
// it held no other job in flight) while that job is the only one this
// node hosts. The transport's sender for it was woken and waits for a
// processor, and a worker that answers at once has the job's other outputs
// read right behind it: a reader that reads them first delays the job's
// first output by their handling (with one job in flight, the whole path's
// latency). The caller may then let the sender run first (grpcapi's
// session reader yields). Otherwise it reports false: with other jobs
// hosted their outputs are what the reader reads next, and yielding would
// delay them; and a host alone at one moment is not a cluster at rest —
// under load at the ingress (the usual bottleneck) a host often holds one
// job at a time, and yielding for each would cost every job the trips.
func (w *Worker) Output(id string, gen uint64, data []byte) (firstAlone bool) {
	e := w.e
	e.mu.Lock()
	defer e.mu.Unlock()
	b := w.bindingLocked("output", id, gen)
	if b == nil || b.cancelling {
		return false
	}
	if !b.credit.granted.covers(b.credit.used) {
		e.creditExceededLocked(w, b)
		return false
	}
	first := !b.relayed && b.t.d.LatencyFirst && b.t.d.Ingress != e.cfg.Node
	w.outputLocked(b, data)
	return first && len(e.hosted) == 1
}

// OutputOrWait is Output for a transport whose worker does not see its
// credit (an HTTP worker): it relays data if the job's credit allows it
// now; otherwise it relays nothing and returns a channel, closed once the
// job gets more credit or the binding ends, on which the transport waits
// before it tries again.
func (w *Worker) OutputOrWait(id string, gen uint64, data []byte) (wait <-chan struct{}) {
	e := w.e
	e.mu.Lock()
	defer e.mu.Unlock()
	b := w.bindingLocked("output", id, gen)
	if b == nil || b.cancelling {
		return nil
	}
	if c := &b.credit; !c.granted.covers(c.used) {
		if c.wake == nil {
			c.wake = make(chan struct{})
		}
		return c.wake
	}
	w.outputLocked(b, data)
	return nil
}

// outputLocked counts an output against its binding's credit and relays
// it to the job's ingress.
func (w *Worker) outputLocked(b *binding, data []byte) {
	e := w.e
	if !b.accepted {
		w.acceptLocked(b)
	}
	e.useCreditLocked(b, int64(len(data)))
	d := b.t.d
	if d.Ingress != e.cfg.Node {
		b.relayed = true
		e.replyLocked(w, d, Message{Output: data})
		return
	}
	if e.onOutputLocked(d.JobID, d.Gen, data) {
		e.m.StaleMessages.WithLabelValues("output").Inc()
	}
}

// End records that the worker finished a job: code "" is success, anything
// else a failure with that code. It frees the worker's credit.
func (w *Worker) End(id string, gen uint64, code Code, detail string, result json.RawMessage) {
	e := w.e
	e.mu.Lock()
	defer e.mu.Unlock()
	b := w.bindingLocked("end", id, gen)
	if b == nil {
		return
	}
	if b.cancelling {
		b.endSpans("cancelled", b.cancelCode)
	} else {
		b.endSpans("ended", code)
	}
	w.releaseLocked(id, b)
	if !b.cancelling {
		if code != "" && !validWorkerCode(code) {
			detail, code = fmt.Sprintf("%s (worker code %q)", detail, code), CodeWorkerError
		}
		if b.t.d.Ingress != e.cfg.Node {
			e.replyLocked(w, b.t.d, Message{End: &End{Code: code, Detail: detail, Result: result}})
		} else {
			e.onEndLocked(id, gen, code, detail, result)
		}
	}
	e.dispatchLocked(e.queues[w.Queue])
}

// releaseLocked frees a binding and its credit, on this node and on the
// job's dispatcher.
func (w *Worker) releaseLocked(id string, b *binding) {
	e := w.e
	b.endSpans("released", "")
	stopTimer(b.timer)
	e.stopWaitingLocked(&b.credit)
	delete(w.bindings, id)
	if e.hosted[id] == w {
		delete(e.hosted, id)
		e.quietLocked()
	}
	t := b.t
	switch {
	case t.from == "":
		e.unbindLocked(id, w.Queue, t.d.Gen)
	case t.from == t.d.Ingress && !b.cancelling:
		// The dispatcher is the ingress: the end or release this binding
		// finishes with frees the credit there, one message instead of two.
	case !e.cluster.LeaseValid():
		// Fenced: the release to the ingress is not sent either, so the
		// dispatcher must keep the binding and hand the job back once this
		// node's records are gone (proven death), not free it now.
	default:
		e.sendLocked(t.from, Message{Kind: MsgUnbind, JobID: id, Gen: t.d.Gen, Queue: t.d.Queue, Consumer: w.ID})
	}
}

// cancelOnWorkerLocked tells a worker to stop a job. The binding (and the
// credit) is held until the worker acknowledges with an end, or is dropped
// as stalled if it does not within the dispatch timeout ceiling.
func (e *Engine) cancelOnWorkerLocked(w *Worker, id string, gen uint64, reason Code) {
	b := w.bindings[id]
	if b == nil || b.cancelling || w.gone {
		return
	}
	b.cancelling, b.cancelCode = true, reason
	for _, span := range []trace.Span{b.offer, b.run} {
		if recording(span) {
			span.AddEvent("cancel", trace.WithAttributes(AttrCode.String(string(reason))))
		}
	}
	// The worker is told to stop, not to wait for its reader any more.
	e.stopWaitingLocked(&b.credit)
	e.quietLocked()
	stopTimer(b.timer)
	b.timer = time.AfterFunc(e.cfg.DispatchTimeoutCeiling, func() { e.stalled(w, id, gen) })
	if err := w.conn.SendCancel(id, gen, reason); err != nil {
		e.dropLocked(w, fmt.Errorf("send cancel: %w", err))
	}
}

// validWorkerCode keeps worker-chosen codes short and printable; a code is
// a machine-readable word, not a message.
func validWorkerCode(c Code) bool {
	return len(c) <= 64 && ValidName(string(c))
}

// capabilityStrings is a job's required capabilities as an offer lists
// them: what Capabilities.Strings makes of the same pairs (one value per
// key, so "key=value" sorted), nil for none — the usual job, built on
// every offer without a map or a sort.
func capabilityStrings(m map[string]string) []string {
	if len(m) == 0 {
		return nil
	}
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}

func indexOf(ws []*Worker, w *Worker) int {
	for i, x := range ws {
		if x == w {
			return i
		}
	}
	return -1
}

// Holds reports whether the worker holds the job at generation gen: the
// binding its accept, reject, output or end must name. A transport that
// answers each worker message (HTTP) refuses one it does not hold instead
// of dropping it silently; the engine still applies the same fencing when
// the message arrives (the binding may end in between).
func (w *Worker) Holds(id string, gen uint64) bool {
	e := w.e
	e.mu.Lock()
	defer e.mu.Unlock()
	b := w.bindings[id]
	return !w.gone && b != nil && b.t.d.Gen == gen
}

// MaxWorkerConcurrency is the most credits one worker session may declare.
const MaxWorkerConcurrency = 10000

// WorkerSendQueue is the bound every WorkerConn puts on the messages it has
// queued for its writer: a count (four per credit, plus 16) and bytes.
// Offers carry job inputs, so the count alone would let a worker with many
// credits that stops reading hold gigabytes of the node's memory; the byte
// bound is never less than two offers of the largest input the node
// accepts, so a large job cannot drop a healthy worker. A transport sizes
// its queue before AttachWorker validates the declaration, so the
// concurrency is clamped here to what AttachWorker accepts.
func WorkerSendQueue(concurrency int, maxInput int64) (count int, bytes int64) {
	return 4*min(max(concurrency, 1), MaxWorkerConcurrency) + 16, max(16<<20, 2*(maxInput+64<<10))
}
