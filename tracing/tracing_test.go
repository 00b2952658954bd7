package tracing_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/switchyard/switchyard/tracing"
)

// clearEnv unsets every variable that turns export on or off.
func clearEnv(t *testing.T) {
	for _, v := range []string{"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"} {
		t.Setenv(v, "")
	}
}

// Export is off unless the flag or the standard variables ask for it.
func TestOpenExport(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cfg     tracing.Config
		env     map[string]string
		want    bool
		wantErr bool
	}{
		{name: "nothing set: off"},
		{name: "the flag", cfg: tracing.Config{Endpoint: "http://127.0.0.1:4318"}, want: true},
		{name: "the flag, grpc", cfg: tracing.Config{Endpoint: "http://127.0.0.1:4317", Protocol: tracing.ProtocolGRPC}, want: true},
		{name: "the endpoint variable", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, want: true},
		{name: "the traces endpoint variable, grpc", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, want: true},
		{name: "OTEL_TRACES_EXPORTER=otlp", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, want: true},
		{name: "OTEL_TRACES_EXPORTER=none beats an endpoint", env: map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}},
		{name: "OTEL_SDK_DISABLED beats the flag", cfg: tracing.Config{Endpoint: "http://127.0.0.1:4318"}, env: map[string]string{"OTEL_SDK_DISABLED": "true"}},
		{name: "an exporter this node lacks", env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, wantErr: true},
		{name: "an unknown protocol", cfg: tracing.Config{Endpoint: "http://127.0.0.1:4318", Protocol: "carrier-pigeon"}, wantErr: true},
		{name: "an endpoint that is no URL", cfg: tracing.Config{Endpoint: "127.0.0.1:4318"}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clearEnv(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			p, err := tracing.Open(context.Background(), tc.cfg)
			if tc.wantErr {
				if err == nil {
					t.Fatal("Open succeeded, want an error")
				}
				if tc.cfg.Protocol != "" && !errors.Is(err, tracing.ErrProtocol) {
					t.Errorf("error %v, want ErrProtocol", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.Exporting() != tc.want {
				t.Errorf("Exporting() = %v, want %v", p.Exporting(), tc.want)
			}
			_, span := p.Tracer().Start(context.Background(), "x")
			if span.IsRecording() != tc.want {
				t.Errorf("a root span records: %v, want %v", span.IsRecording(), tc.want)
			}
			// Nothing listens there: shut down before the span ends, so
			// there is nothing to export.
			if err := p.Shutdown(context.Background()); err != nil {
				t.Errorf("Shutdown: %v", err)
			}
			span.End()
		})
	}
}

// The log handler adds the trace id and span id of the record's context,
// and nothing to a record without one.
func TestLogHandler(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(tracing.LogHandler(slog.NewTextHandler(&buf, nil))).With("node", "n1")
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid}))
	log.InfoContext(ctx, "job ended", "job", "j_1")
	log.Info("node serving")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines: %q", len(lines), buf.String())
	}
	if want := "node=n1 job=j_1 trace_id=4bf92f3577b34da6a3ce929d0e0e4736 span_id=00f067aa0ba902b7"; !strings.Contains(lines[0], want) {
		t.Errorf("line %q lacks %q", lines[0], want)
	}
	if strings.Contains(lines[1], "trace_id") {
		t.Errorf("a line without a trace has one: %q", lines[1])
	}
}
