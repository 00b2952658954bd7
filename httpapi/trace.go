package httpapi

import (
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/switchyard/switchyard/core"
)

// traceRequests is the edge span of every API request (/v1 and the
// OpenAI-compatible front door): otelhttp's server span, which reads the
// caller's W3C traceparent and tracestate, named by the chi route pattern
// once the request was routed ("POST /v1/queues/{queue}/jobs"). A job
// submitted in the request is a child of it (core: switchyard.job). The
// web page, its assets, /metrics and the health checks are not traced.
//
// With export off (tp nil) no span is recorded and otelhttp is not used:
// the middleware only reads the caller's trace context into the request's
// context, which is what carries it into the job. (otelhttp with a no-op
// provider still wraps every request and response and computes its
// attributes: a few percent of a job's CPU, for nothing.)
func traceRequests(tp trace.TracerProvider) func(http.Handler) http.Handler {
	if tp == nil {
		return callerTrace
	}
	return func(next http.Handler) http.Handler {
		named := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			next.ServeHTTP(w, r)
			span := trace.SpanFromContext(r.Context())
			if !span.IsRecording() {
				return
			}
			if rc := chi.RouteContext(r.Context()); rc != nil && rc.RoutePattern() != "" {
				span.SetName(r.Method + " " + rc.RoutePattern())
				span.SetAttributes(attribute.String("http.route", rc.RoutePattern()))
			}
		})
		return otelhttp.NewHandler(named, "http",
			otelhttp.WithTracerProvider(tp),
			otelhttp.WithMeterProvider(metricnoop.NewMeterProvider()),
			otelhttp.WithPropagators(propagation.TraceContext{}),
			otelhttp.WithFilter(apiRequest),
			otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return r.Method }),
		)
	}
}

// apiRequest reports whether r is an API call: the requests traced.
func apiRequest(r *http.Request) bool {
	return strings.HasPrefix(r.URL.Path, "/v1/") || strings.HasPrefix(r.URL.Path, OpenAIPrefix+"/")
}

// callerTrace passes an API request on with the caller's W3C trace
// context (its traceparent and tracestate headers) in its context, as a
// remote parent; a request without one, or with one that does not parse,
// passes on as it is.
func callerTrace(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The canonical keys, looked up as they are: Get would make
		// them canonical on every request.
		if tp := r.Header["Traceparent"]; len(tp) > 0 && apiRequest(r) {
			var ts string
			if v := r.Header["Tracestate"]; len(v) > 0 {
				ts = v[0]
			}
			if sc := core.ParseTrace(tp[0], ts); sc.IsValid() {
				r = r.WithContext(trace.ContextWithRemoteSpanContext(r.Context(), sc))
			}
		}
		next.ServeHTTP(w, r)
	})
}
