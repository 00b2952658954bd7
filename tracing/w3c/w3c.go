// Package w3c reads a W3C trace context (the traceparent and tracestate
// header values) as a remote span context: what a node does with a job's
// trace context on every hop, and the worker SDK with an offer's. It uses
// the OpenTelemetry API only, so the worker SDK may import it.
package w3c

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Parse reads a W3C traceparent and tracestate as a remote span context:
// the invalid SpanContext when traceparent is absent or malformed (a
// malformed tracestate alone is dropped, as W3C asks).
func Parse(traceparent, tracestate string) trace.SpanContext {
	if traceparent == "" {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), &carrier{traceparent, tracestate}))
}

// carrier is a W3C trace context as the propagator reads it: a
// TextMapCarrier without a map (Parse runs on every hop).
type carrier struct{ traceparent, tracestate string }

func (c *carrier) Get(key string) string {
	switch key {
	case "traceparent":
		return c.traceparent
	case "tracestate":
		return c.tracestate
	}
	return ""
}

func (c *carrier) Set(string, string) {}

func (c *carrier) Keys() []string { return []string{"traceparent", "tracestate"} }
