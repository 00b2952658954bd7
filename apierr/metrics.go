package apierr

import (
	"context"
	"errors"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/core"
)

// Metrics counts the errors a node's public APIs answer with. A node has
// one set, shared by its transports.
type Metrics struct {
	errors *prometheus.CounterVec
}

// NewMetrics returns a set of error metrics registered with reg (nil: not
// registered, for tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{errors: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "switchyard", Subsystem: "api", Name: "errors_total",
		Help: `Errors the public APIs answered with, by transport (http, grpc) and code. code="internal" counts server faults, whose cause is only logged.`,
	}, []string{"transport", "code"})}
	if reg != nil {
		reg.MustRegister(m.errors)
	}
	return m
}

// Reporter logs and counts the errors one transport answers with, so that
// every transport draws the same line between the client's errors and the
// node's.
type Reporter struct {
	log    *slog.Logger
	errors *prometheus.CounterVec
}

// Reporter returns the reporter of transport ("http", "grpc"), logging to
// log.
func (m *Metrics) Reporter(transport string, log *slog.Logger) *Reporter {
	return &Reporter{log: log, errors: m.errors.MustCurryWith(prometheus.Labels{"transport": transport})}
}

// Report records err, which the caller is about to answer with; args say
// where (for example "path", r.URL.Path). A context's end is the client
// leaving: debug, and not counted. A *core.Error is a refusal the caller
// caused or the engine decided on: debug (the engine logs its own faults,
// such as catalog_unavailable, with their causes where it meets them).
// Anything else is a server fault: logged at warn with its text, which the client
// never sees, and counted as code internal.
func (r *Reporter) Report(err error, args ...any) {
	var ce *core.Error
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		r.log.Debug("request ended by the client", append([]any{"err", err}, args...)...)
	case errors.As(err, &ce) && ce != nil:
		r.log.Debug("request refused", append([]any{"code", ce.Code, "detail", ce.Detail}, args...)...)
		r.errors.WithLabelValues(codeLabel(ce.Code)).Inc()
	default:
		r.log.Warn("request failed", append([]any{"err", err}, args...)...)
		r.errors.WithLabelValues(string(core.CodeInternal)).Inc()
	}
}

// codeLabel bounds the label's values to the table's codes: a code from a
// newer peer is counted as "unknown".
func codeLabel(code core.Code) string {
	if _, ok := table[code]; ok {
		return string(code)
	}
	return "unknown"
}
