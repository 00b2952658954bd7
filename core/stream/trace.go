package stream

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/switchyard/switchyard/core"
)

// EndSpan ends the span of a stream that read a job from after (a
// resume's: core.Engine.StartResume) with how the stream ended and how far
// it got.
func EndSpan(span trace.Span, res Result, after uint64) {
	if span.IsRecording() {
		span.SetAttributes(
			core.AttrResult.String(string(res.End)),
			attribute.Int64("switchyard.last_seq", int64(res.LastSeq)),
			core.AttrEvents.Int64(int64(max(res.LastSeq, after)-after)),
			attribute.Int("switchyard.dropped", res.Dropped),
		)
	}
	span.End()
}
