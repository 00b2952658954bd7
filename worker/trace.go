package worker

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
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

// runSpanOptions are built once: an option is an allocation.
var runSpanOptions = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}

// startRunSpan starts the worker's span of job, a child of the span
// context jctx carries (the offer's); its attributes are set only when it
// records, so a worker without an SDK pays next to nothing for it.
func startRunSpan(jctx context.Context, tracer trace.Tracer, job *Job, worker string) (context.Context, trace.Span) {
	ctx, span := tracer.Start(jctx, spanRun, runSpanOptions...)
	if span.IsRecording() {
		span.SetAttributes(
			attribute.String("switchyard.job.id", job.ID), attribute.String("switchyard.queue", job.Queue),
			attribute.Int64("switchyard.generation", int64(job.Generation)), attribute.String("switchyard.worker", worker),
		)
	}
	return ctx, span
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
