package w3c

import (
	"context"
	"math/rand/v2"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// propagator is what Parse must answer: OpenTelemetry's TraceContext
// propagator reading the same two values.
func propagator(traceparent, tracestate string) trace.SpanContext {
	return trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), &carrier{traceparent, tracestate}))
}

// TestParseMatchesPropagator holds Parse (its version 00 fast path and
// the propagator behind it) to the propagator's answer for well-formed
// values, each flag, zero ids, other versions, and every byte of a valid
// traceparent replaced by each of a set of characters.
func TestParseMatchesPropagator(t *testing.T) {
	const valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	cases := []struct{ tp, ts string }{
		{"", ""},
		{valid, ""},
		{valid, "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"},
		{valid, "not a tracestate=="},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", ""},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-02", ""},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03", ""},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-04", ""},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-ff", ""},
		{"00-00000000000000000000000000000000-00f067aa0ba902b7-01", ""},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", ""},
		{"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", ""},
		{"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", ""},
		{"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", ""},
		{"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", ""},
		{valid + "-", ""},
		{valid[:54], ""},
	}
	for i := range valid {
		for _, c := range "0af-gA. \x00\xff" {
			b := []byte(valid)
			b[i] = byte(c)
			cases = append(cases, struct{ tp, ts string }{string(b), ""})
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 1000 {
		b := []byte(valid)
		for j := range b {
			if b[j] != '-' {
				b[j] = "0123456789abcdef"[r.IntN(16)]
			}
		}
		cases = append(cases, struct{ tp, ts string }{string(b), ""})
	}
	for _, c := range cases {
		got, want := Parse(c.tp, c.ts), propagator(c.tp, c.ts)
		if !got.Equal(want) || got.IsRemote() != want.IsRemote() || got.TraceState().String() != want.TraceState().String() {
			t.Errorf("Parse(%q, %q) = %v, the propagator reads %v", c.tp, c.ts, got, want)
		}
	}
}

// TestParseAllocs: a version 00 traceparent without a tracestate, what
// every job carries, is read without allocating.
func TestParseAllocs(t *testing.T) {
	const valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if n := testing.AllocsPerRun(100, func() { _ = Parse(valid, "") }); n != 0 {
		t.Errorf("Parse allocates %v times", n)
	}
}
