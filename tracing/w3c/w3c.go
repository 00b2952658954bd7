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
// malformed tracestate alone is dropped, as W3C asks). It reads what
// OpenTelemetry's TraceContext propagator reads, to the bit; a version 00
// traceparent, the one in use, without allocating.
func Parse(traceparent, tracestate string) trace.SpanContext {
	if traceparent == "" {
		return trace.SpanContext{}
	}
	if sc, ok := parse00(traceparent, tracestate); ok {
		return sc
	}
	return trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), &carrier{traceparent, tracestate}))
}

// parse00 reads a version 00 traceparent ("00-" trace id "-" span id "-"
// flags, lower-case hex) as the propagator does. ok is false for anything
// else, which the propagator then reads (and most likely refuses).
func parse00(traceparent, tracestate string) (sc trace.SpanContext, ok bool) {
	const n = 2 + 1 + 32 + 1 + 16 + 1 + 2
	h := traceparent
	if len(h) != n || h[0] != '0' || h[1] != '0' || h[2] != '-' || h[35] != '-' || h[52] != '-' {
		return sc, false
	}
	var scc trace.SpanContextConfig
	var flags [1]byte
	if !unhex(scc.TraceID[:], h[3:35]) || !unhex(scc.SpanID[:], h[36:52]) || !unhex(flags[:], h[53:]) {
		return sc, false
	}
	if flags[0] > 3 {
		// Version 00 reserves the other flag bits.
		return sc, false
	}
	scc.TraceFlags = trace.TraceFlags(flags[0]) & (trace.FlagsSampled | trace.FlagsRandom)
	if tracestate != "" {
		// A malformed tracestate is dropped, the traceparent kept.
		scc.TraceState, _ = trace.ParseTraceState(tracestate)
	}
	scc.Remote = true
	sc = trace.NewSpanContext(scc)
	// An all-zero trace or span id is invalid: the propagator's answer
	// too.
	return sc, sc.IsValid()
}

// unhex decodes lower-case hex s into dst (len(s) == 2*len(dst)); false
// on any other character.
func unhex(dst []byte, s string) bool {
	for i := range dst {
		hi, ok1 := hexVal(s[2*i])
		lo, ok2 := hexVal(s[2*i+1])
		if !ok1 || !ok2 {
			return false
		}
		dst[i] = hi<<4 | lo
	}
	return true
}

func hexVal(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

// carrier is a W3C trace context as the propagator reads it: a
// TextMapCarrier without a map.
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
