package worker

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// The worker's span of each job (Config.TracerProvider): its name and
// scope. Its attributes are the node's (switchyard.job.id, .queue,
// .generation, .worker), with the outcome, the error code and the output
// sent when the job ends (docs/tracing.md).
const (
	spanRun   = "switchyard.worker.run"
	scopeName = "github.com/switchyard/switchyard/worker"
)

// parseTrace reads the W3C trace context of an offer: the invalid
// SpanContext when the node sent none or one that does not parse (the
// worker's span then starts a trace of its own).
func parseTrace(traceparent, tracestate string) trace.SpanContext {
	if traceparent == "" {
		return trace.SpanContext{}
	}
	c := propagation.MapCarrier{"traceparent": traceparent}
	if tracestate != "" {
		c["tracestate"] = tracestate
	}
	return trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), c))
}

// endRunSpan ends a job's span with its outcome, its error code, and the
// output the job sent.
func endRunSpan(span trace.Span, outcome, code string, out *Output) {
	if span.IsRecording() {
		out.mu.Lock()
		sent := out.sent
		out.mu.Unlock()
		span.SetAttributes(
			attribute.String("switchyard.outcome", outcome),
			attribute.Int64("switchyard.outputs", int64(sent.events)),
			attribute.Int64("switchyard.output.bytes", int64(sent.bytes)),
		)
		if code != "" {
			span.SetAttributes(attribute.String("switchyard.error.code", code))
			if code != "cancelled" {
				span.SetStatus(codes.Error, code)
			}
		}
	}
	span.End()
}
