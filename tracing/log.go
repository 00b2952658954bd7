package tracing

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/trace"
)

// Log attribute keys of a record's trace.
const (
	LogTraceID = "trace_id"
	LogSpanID  = "span_id"
)

// LogHandler returns h with every record that is logged with a context
// carrying a span context given trace_id and span_id attributes: the one
// place a log line about a job gets its trace id (the node logs about a
// job with the job's span context: core's Engine.logJob, the request
// context of the HTTP and gRPC edges, the forward's context in peer).
func LogHandler(h slog.Handler) slog.Handler {
	if _, ok := h.(logHandler); ok {
		return h
	}
	return logHandler{h}
}

type logHandler struct{ slog.Handler }

func (h logHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r = r.Clone()
		r.AddAttrs(slog.String(LogTraceID, sc.TraceID().String()), slog.String(LogSpanID, sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h logHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return logHandler{h.Handler.WithAttrs(attrs)}
}

func (h logHandler) WithGroup(name string) slog.Handler {
	return logHandler{h.Handler.WithGroup(name)}
}
