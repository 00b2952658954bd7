package core

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"log/slog"
	"math/rand/v2"
	"slices"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/switchyard/switchyard/tracing/w3c"
)

// This file is a job's trace: the W3C trace context a job carries through
// every hop, and the spans each role records of it (docs/tracing.md).
//
// core uses the OpenTelemetry API only (trace, attribute, codes,
// propagation): a Tracer comes in through Config.Tracer, and which SDK, if
// any, records and exports its spans is the node's business. With no
// Tracer (export off) no span is started at all: a job's trace context is
// then the caller's, passed on unchanged, or a new one made here, and the
// spans cost a nil check.
//
// Every span ends when its part of the job ends: the job span in
// finishLocked, the queue span when its task leaves the queue (bound or
// removed) or the engine closes, the offer and run spans when their
// binding is released. None is ever held by a goroutine of its own.

// Span names: one per part of a job's way (docs/tracing.md, "Span tree").
const (
	// SpanJob is the job on its ingress, from its acceptance to its one
	// terminal outcome.
	SpanJob = "switchyard.job"
	// SpanAwaitDispatcher is a job on its ingress waiting for its queue's
	// dispatcher (reroute.go).
	SpanAwaitDispatcher = "switchyard.await_dispatcher"
	// SpanForward is the ingress handing a new job to a dispatcher on
	// another node, until its verdict.
	SpanForward = "switchyard.forward"
	// SpanQueue is a job in its queue on the dispatcher, until it is bound
	// to a consumer (or leaves the queue otherwise).
	SpanQueue = "switchyard.queue"
	// SpanOffer is the consumer host offering the job to its worker, until
	// the worker accepts or rejects it (or stalls, or leaves).
	SpanOffer = "switchyard.offer"
	// SpanRun is the job running on a worker, as its consumer host relays
	// it: from the accept to the end of the binding.
	SpanRun = "switchyard.run"
	// SpanResume is one reader of the job's stream after its submission's
	// own: a GET of its events, or a gRPC Resume.
	SpanResume = "switchyard.resume"
)

// Span attribute keys an operator filters on (docs/tracing.md,
// "Attributes"). The Go worker SDK repeats the ones it sets.
const (
	AttrQueue       = attribute.Key("switchyard.queue")
	AttrJob         = attribute.Key("switchyard.job.id")
	AttrNode        = attribute.Key("switchyard.node")
	AttrPeer        = attribute.Key("switchyard.peer")
	AttrConsumer    = attribute.Key("switchyard.consumer")
	AttrWorker      = attribute.Key("switchyard.worker")
	AttrOutcome     = attribute.Key("switchyard.outcome")
	AttrCode        = attribute.Key("switchyard.error.code")
	AttrGeneration  = attribute.Key("switchyard.generation")
	AttrAttempt     = attribute.Key("switchyard.attempt")
	AttrResult      = attribute.Key("switchyard.result")
	AttrOutputs     = attribute.Key("switchyard.outputs")
	AttrOutputBytes = attribute.Key("switchyard.output.bytes")
	AttrEvents      = attribute.Key("switchyard.events")
	AttrBytes       = attribute.Key("switchyard.bytes")
	AttrFromSeq     = attribute.Key("switchyard.from_seq")
	AttrReason      = attribute.Key("switchyard.reason")
	AttrRejected    = attribute.Key("switchyard.rejected")
)

// FormatTrace returns sc in its W3C text form: the traceparent and
// tracestate header values ("" and "" for an invalid sc).
func FormatTrace(sc trace.SpanContext) (traceparent, tracestate string) {
	if !sc.IsValid() {
		return "", ""
	}
	// Version 00, the only one: what propagation.TraceContext.Inject
	// writes, without its carrier map (this runs on every hop).
	tid, sid, flags := sc.TraceID(), sc.SpanID(), byte(sc.TraceFlags()&(trace.FlagsSampled|trace.FlagsRandom))
	var b [55]byte
	copy(b[:], "00-")
	hex.Encode(b[3:35], tid[:])
	b[35] = '-'
	hex.Encode(b[36:52], sid[:])
	b[52] = '-'
	hex.Encode(b[53:], []byte{flags})
	return string(b[:]), sc.TraceState().String()
}

// ParseTrace reads a W3C traceparent and tracestate as a remote span
// context: the invalid SpanContext when traceparent is absent or
// malformed (a malformed tracestate alone is dropped, as W3C asks).
func ParseTrace(traceparent, tracestate string) trace.SpanContext {
	return w3c.Parse(traceparent, tracestate)
}

// newRootSpanContext starts a trace for a job that came with none, on a
// node that records no spans: the job still has a trace id, for its logs
// and views and for the worker's spans, and it is not sampled.
func newRootSpanContext() trace.SpanContext {
	var tid trace.TraceID
	var sid trace.SpanID
	for !tid.IsValid() {
		binary.BigEndian.PutUint64(tid[:8], rand.Uint64())
		binary.BigEndian.PutUint64(tid[8:], rand.Uint64())
	}
	for !sid.IsValid() {
		binary.BigEndian.PutUint64(sid[:], rand.Uint64())
	}
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid})
}

// startSpan starts a span of one of a job's parts, as a child of parent
// (a span context from this node or, marked remote, from another). With
// no tracer it starts none and returns nil: the parts' spans are then
// nil, every helper here takes a nil span, and the next hop's parent is
// parent itself (spanContext), so a node without a tracer allocates
// nothing for them.
func (e *Engine) startSpan(parent trace.SpanContext, name string, kind trace.SpanKind, attrs ...attribute.KeyValue) trace.Span {
	if e.tracer == nil {
		return nil
	}
	ctx := trace.ContextWithSpanContext(context.Background(), parent)
	// A copy, so that attrs does not escape: a caller's arguments stay on
	// its stack, which is every call when tracing is off.
	_, span := e.tracer.Start(ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(slices.Clone(attrs)...))
	return span
}

// startJobSpan starts a job's span, as a child of the span ctx carries
// (the edge request's: the caller's trace) or, with none, as a new trace;
// it returns the job's trace context too. With no tracer the span is nil
// and the trace context is the caller's, or a new one.
func (e *Engine) startJobSpan(ctx context.Context, queue string) (trace.Span, trace.SpanContext) {
	if e.tracer == nil {
		sc := trace.SpanContextFromContext(ctx)
		if !sc.IsValid() {
			sc = newRootSpanContext()
		}
		return nil, sc
	}
	_, span := e.tracer.Start(ctx, SpanJob, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(AttrQueue.String(queue), AttrNode.String(e.cfg.Node)))
	return span, span.SpanContext()
}

// recording reports whether span is recorded (nil: no).
func recording(span trace.Span) bool { return span != nil && span.IsRecording() }

// spanContext is span's context, or parent's when there is no span.
func spanContext(span trace.Span, parent trace.SpanContext) trace.SpanContext {
	if span == nil {
		return parent
	}
	return span.SpanContext()
}

// endSpan ends span with an outcome: its result attribute, and an error
// status with code when code is one.
func endSpan(span trace.Span, result string, code Code, attrs ...attribute.KeyValue) {
	if span == nil {
		return
	}
	if span.IsRecording() {
		// A copy, as in startSpan: a caller's arguments stay on its stack.
		span.SetAttributes(slices.Clone(attrs)...)
		if result != "" {
			span.SetAttributes(AttrResult.String(result))
		}
		if code != "" {
			span.SetAttributes(AttrCode.String(string(code)))
			if code != CodeCancelled {
				span.SetStatus(codes.Error, string(code))
			}
		}
	}
	span.End()
}

// endJobSpanLocked ends j's span with its terminal outcome.
func endJobSpanLocked(j *Job, outcome Outcome) {
	if !recording(j.span) {
		endSpan(j.span, "", "")
		return
	}
	j.span.SetAttributes(
		AttrOutcome.String(string(outcome)), AttrGeneration.Int64(int64(j.gen)),
		AttrOutputs.Int(j.outputs), AttrOutputBytes.Int64(j.outBytes),
	)
	if j.consumer != "" {
		j.span.SetAttributes(AttrConsumer.String(j.consumer), AttrWorker.String(j.worker))
	}
	if j.host != "" {
		j.span.SetAttributes(AttrPeer.String(j.host))
	}
	endSpan(j.span, "", j.code)
}

// logJob logs msg about a job whose trace is sc: the node's log handler
// adds its trace_id from the context (docs/tracing.md, "Logs"). The
// context is made only when the level is enabled.
func (e *Engine) logJob(sc trace.SpanContext, level slog.Level, msg string, args ...any) {
	if !e.log.Enabled(context.Background(), level) {
		return
	}
	e.log.Log(trace.ContextWithSpanContext(context.Background(), sc), level, msg, args...)
}

// Trace is the job's trace context: its trace id names the job's trace in
// every log line and view, and its span is the parent of the job's
// resumes.
func (j *Job) Trace() trace.SpanContext { return j.trace }

// WithTrace is ctx carrying j's trace context: what a transport logs a
// line about j with, so the line carries the job's trace id.
func (j *Job) WithTrace(ctx context.Context) context.Context {
	return trace.ContextWithSpanContext(ctx, j.trace)
}

// StartResume starts the span of one reader of j's stream (a GET of its
// events, a gRPC Resume), as a child of the job's span, linked to the
// reader's own request span in ctx. The caller ends it.
func (e *Engine) StartResume(ctx context.Context, j *Job, after uint64) (context.Context, trace.Span) {
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(AttrJob.String(j.ID), AttrQueue.String(j.Queue), AttrNode.String(e.cfg.Node), AttrFromSeq.Int64(int64(after))),
	}
	if req := trace.SpanContextFromContext(ctx); req.IsValid() && req.TraceID() != j.trace.TraceID() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: req}))
	}
	ctx = trace.ContextWithSpanContext(ctx, j.trace)
	if e.tracer == nil {
		return ctx, trace.SpanFromContext(ctx)
	}
	return e.tracer.Start(ctx, SpanResume, opts...)
}

// forwardResult names a forward's verdict for its span. ran is whether a
// host answered for the job: a short job can end, and so stop its forward,
// before the dispatcher's verdict comes back on the delivery stream, and
// then its run is the proof that the forward was taken.
func forwardResult(err error, ran bool) string {
	if err == nil {
		return "taken"
	}
	if _, ok := CodeOf(err); ok {
		return "refused"
	}
	if ran {
		return "taken"
	}
	return "no verdict"
}
