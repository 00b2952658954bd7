package grpcapi

import (
	"context"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"

	"github.com/switchyard/switchyard/core"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// A JobService call's trace: the caller's W3C trace context comes in as
// "traceparent" and "tracestate" metadata, and a job submitted in the call
// is a child of it (docs/tracing.md). Worker sessions are not traced as
// calls: a session lives for hours and carries many jobs, each traced by
// the engine.
//
// With export on, otelgrpc's stats handler records the call's span (named
// "switchyard.v1.JobService/Submit" and so on) and reads the metadata.
// With export off there is no stats handler at all (a stats handler makes
// gRPC account every message of every call, worker sessions included):
// the guard reads the metadata into the call's context (callerTrace).

// traceCalls is the server option that records the span of every
// JobService call with tp.
func traceCalls(tp trace.TracerProvider) grpc.ServerOption {
	return grpc.StatsHandler(otelgrpc.NewServerHandler(
		otelgrpc.WithTracerProvider(tp),
		otelgrpc.WithMeterProvider(metricnoop.NewMeterProvider()),
		otelgrpc.WithPropagators(propagation.TraceContext{}),
		otelgrpc.WithFilter(func(info *stats.RPCTagInfo) bool { return jobCall(info.FullMethodName) }),
	))
}

// jobCall reports whether method is a JobService rpc.
func jobCall(method string) bool {
	return strings.HasPrefix(method, "/"+pb.JobService_ServiceDesc.ServiceName+"/")
}

// callerTrace is ctx with the caller's trace context from its metadata,
// as a remote parent; ctx as it is when there is none or it does not
// parse.
func callerTrace(ctx context.Context) context.Context {
	tp := metadata.ValueFromIncomingContext(ctx, "traceparent")
	if len(tp) == 0 {
		return ctx
	}
	var ts string
	if v := metadata.ValueFromIncomingContext(ctx, "tracestate"); len(v) > 0 {
		ts = v[0]
	}
	sc := core.ParseTrace(tp[0], ts)
	if !sc.IsValid() {
		return ctx
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc)
}
