// Package tracing sets up a node's traces: the OpenTelemetry SDK with the
// standard OTLP exporter, configured from the node's flags and the
// standard OTEL_* environment variables, the W3C propagator every edge
// reads a caller's trace context with, and the log handler that puts a
// job's trace id on every log line about it (docs/tracing.md).
//
// Export is off unless asked for. Off, the node records no span at all:
// its tracer is the API's no-op, and jobs still carry their W3C trace
// context through every hop (the caller's, or a new one), so propagation
// costs next to nothing.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Protocols of the OTLP exporter, as OTEL_EXPORTER_OTLP_PROTOCOL names
// them.
const (
	ProtocolGRPC = "grpc"
	ProtocolHTTP = "http/protobuf"
)

// ScopeName is the instrumentation scope of the node's own spans.
const ScopeName = "github.com/switchyard/switchyard"

// Config is how a node exports its spans. The zero Config takes
// everything from the environment: export is on when OTEL_TRACES_EXPORTER
// is otlp, or when it is unset and an OTLP endpoint variable
// (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is
// set; OTEL_SDK_DISABLED=true turns it off whatever else says.
type Config struct {
	// Endpoint (--otlp-endpoint) turns export on and sends spans there: a
	// URL (http://collector:4317 for grpc, http://collector:4318 for
	// http/protobuf, whose path defaults to /v1/traces). It overrides the
	// endpoint variables; the other OTEL_EXPORTER_OTLP_* variables
	// (headers, TLS, timeout, compression) still apply.
	Endpoint string
	// Protocol is ProtocolGRPC or ProtocolHTTP; "" reads
	// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, then OTEL_EXPORTER_OTLP_PROTOCOL,
	// then takes http/protobuf (the OpenTelemetry default).
	Protocol string
	// Sampler decides which traces that begin here are recorded; nil
	// reads OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG (the SDK's
	// default: parentbased_always_on). Parent-based samplers honour the
	// caller's sampled flag.
	Sampler sdktrace.Sampler
	// BatchTimeout is the longest a finished span waits before it is
	// exported; 0: OTEL_BSP_SCHEDULE_DELAY or the SDK's 5s.
	BatchTimeout time.Duration
	// Node is the node's id, the resource's service.instance.id and
	// switchyard.node ("": neither, as for a worker). ServiceName defaults
	// to "switchyard" (OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
	// override both).
	Node        string
	ServiceName string
}

// Provider is a node's tracer provider and propagator.
type Provider struct {
	tp  trace.TracerProvider
	sdk *sdktrace.TracerProvider
}

// Propagator is the W3C trace context (traceparent, tracestate): what
// the node reads from every caller and hands to every worker. Baggage is
// not carried: a job's hops carry its trace context only.
var Propagator propagation.TextMapPropagator = propagation.TraceContext{}

// Open returns cfg's provider: the SDK with an OTLP exporter when export
// is on, the API's no-op otherwise. It dials nothing: the exporter
// connects when it first exports.
func Open(ctx context.Context, cfg Config) (*Provider, error) {
	on, err := exportOn(cfg)
	if err != nil || !on {
		return &Provider{tp: noop.NewTracerProvider()}, err
	}
	exp, err := newExporter(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if cfg.ServiceName == "" {
		cfg.ServiceName = "switchyard"
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", cfg.ServiceName)}
	if cfg.Node != "" {
		attrs = append(attrs, attribute.String("service.instance.id", cfg.Node), attribute.String("switchyard.node", cfg.Node))
	}
	// Ours first, then the environment's, which win.
	res, err := resource.New(ctx, resource.WithAttributes(attrs...), resource.WithTelemetrySDK(), resource.WithFromEnv())
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	var bsp []sdktrace.BatchSpanProcessorOption
	if cfg.BatchTimeout > 0 {
		bsp = append(bsp, sdktrace.WithBatchTimeout(cfg.BatchTimeout))
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithBatcher(exp, bsp...), sdktrace.WithResource(res)}
	if cfg.Sampler != nil {
		opts = append(opts, sdktrace.WithSampler(cfg.Sampler))
	}
	sdk := sdktrace.NewTracerProvider(opts...)
	return &Provider{tp: sdk, sdk: sdk}, nil
}

// TracerProvider is the provider of every span the node records.
func (p *Provider) TracerProvider() trace.TracerProvider { return p.tp }

// Tracer is the tracer of the node's own spans.
func (p *Provider) Tracer() trace.Tracer { return p.tp.Tracer(ScopeName) }

// Exporting reports whether spans are recorded and exported.
func (p *Provider) Exporting() bool { return p.sdk != nil }

// Flush exports every span that has ended.
func (p *Provider) Flush(ctx context.Context) error {
	if p.sdk == nil {
		return nil
	}
	return p.sdk.ForceFlush(ctx)
}

// Shutdown exports what has ended and stops the exporter; spans that end
// later are dropped.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p.sdk == nil {
		return nil
	}
	return p.sdk.Shutdown(ctx)
}

// exportOn decides whether spans are exported (see Config).
func exportOn(cfg Config) (bool, error) {
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		return false, nil
	}
	if cfg.Endpoint != "" {
		return true, nil
	}
	switch v := strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER")); v {
	case "none":
		return false, nil
	case "otlp":
		return true, nil
	case "":
		return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "", nil
	default:
		return false, fmt.Errorf("tracing: OTEL_TRACES_EXPORTER=%s: this node exports otlp or none", v)
	}
}

// ErrProtocol is the error of an OTLP protocol the node cannot speak.
var ErrProtocol = errors.New("tracing: the OTLP protocol must be grpc or http/protobuf")

// newExporter is the OTLP exporter of cfg's protocol; the endpoint, when
// cfg names one, overrides the environment's.
func newExporter(ctx context.Context, cfg Config) (*otlptrace.Exporter, error) {
	protocol := cfg.Protocol
	for _, v := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if protocol == "" {
			protocol = strings.TrimSpace(os.Getenv(v))
		}
	}
	var u *url.URL
	if cfg.Endpoint != "" {
		var err error
		if u, err = url.Parse(cfg.Endpoint); err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			return nil, fmt.Errorf("tracing: the OTLP endpoint %q must be an http:// or https:// URL", cfg.Endpoint)
		}
	}
	switch protocol {
	case ProtocolGRPC:
		var opts []otlptracegrpc.Option
		if u != nil {
			opts = append(opts, otlptracegrpc.WithEndpointURL(u.String()))
		}
		return otlptracegrpc.New(ctx, opts...)
	case ProtocolHTTP, "":
		var opts []otlptracehttp.Option
		if u != nil {
			if u.Path == "" || u.Path == "/" {
				u.Path = "/v1/traces"
			}
			opts = append(opts, otlptracehttp.WithEndpointURL(u.String()))
		}
		return otlptracehttp.New(ctx, opts...)
	}
	return nil, fmt.Errorf("%w, not %q", ErrProtocol, protocol)
}
