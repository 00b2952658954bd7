package stream

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/core/internal/metric"
)

// Metrics are the client-stream collectors of one node, shared by every
// transport and told apart by a transport label ("sse", "grpc").
type Metrics struct {
	open            *prometheus.GaugeVec
	ended           *prometheus.CounterVec
	gaps            *prometheus.CounterVec
	resumesAccepted *prometheus.CounterVec
	resumesRefused  *prometheus.CounterVec
	slowLagEvents   *prometheus.HistogramVec
	slowLagBytes    *prometheus.HistogramVec
	// writers counts what the node's streams write, on every transport.
	writers Writers
}

// NewMetrics creates the stream collectors and registers them on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		open: metric.GaugeVec("stream", "open",
			"Client job streams open on this node.", "transport"),
		ended: metric.CounterVec("stream", "ended_total",
			"Client job streams ended, by reason: terminal, client_gone, write_failed, slow (terminated as a slow consumer), idle, max_duration, resync (full resync required).", "transport", "reason"),
		gaps: metric.CounterVec("stream", "drop_oldest_gaps_total",
			"Gaps announced on drop-oldest streams that fell behind (skipping ahead, or past the retained history). The gap a stream read from the start gets for events no longer retained is not counted.", "transport"),
		resumesAccepted: metric.CounterVec("stream", "resumes_accepted_total",
			"Streams resumed from a valid resume token.", "transport"),
		resumesRefused: metric.CounterVec("stream", "resumes_refused_total",
			"Resume tokens refused, by internal reason (clients always see one identical error).", "transport", "reason"),
		slowLagEvents: metric.HistogramVec("stream", "slow_terminated_lag_events",
			"Events queued for a stream when it was terminated as a slow consumer.", prometheus.ExponentialBuckets(16, 2, 14), "transport"),
		slowLagBytes: metric.HistogramVec("stream", "slow_terminated_lag_bytes",
			"Bytes queued for a stream when it was terminated as a slow consumer.", prometheus.ExponentialBuckets(4096, 2, 16), "transport"),
	}
	reg.MustRegister(m.open, m.ended, m.gaps, m.resumesAccepted, m.resumesRefused, m.slowLagEvents, m.slowLagBytes)
	return m
}

// TransportMetrics are the stream metrics of one transport.
type TransportMetrics struct {
	m         *Metrics
	transport string
}

// For returns the metrics of one transport, with every series created so
// dashboards see zeros rather than nothing.
func (m *Metrics) For(transport string) *TransportMetrics {
	m.open.WithLabelValues(transport)
	m.gaps.WithLabelValues(transport)
	m.resumesAccepted.WithLabelValues(transport)
	for _, r := range []End{EndTerminal, EndClientGone, EndWriteFailed, EndSlow, EndIdle, EndMaxDuration, EndResync} {
		m.ended.WithLabelValues(transport, string(r))
	}
	return &TransportMetrics{m: m, transport: transport}
}

// Writers is the node's count of what its streams write
// (Request.Writers): the same for every transport.
func (t *TransportMetrics) Writers() *Writers { return &t.m.writers }

// Opened counts a stream that started.
func (t *TransportMetrics) Opened() { t.m.open.WithLabelValues(t.transport).Inc() }

// Closed counts a stream that ended, and how.
func (t *TransportMetrics) Closed(res Result) {
	t.m.open.WithLabelValues(t.transport).Dec()
	t.m.ended.WithLabelValues(t.transport, string(res.End)).Inc()
	t.m.gaps.WithLabelValues(t.transport).Add(float64(res.Gaps))
	if res.End == EndSlow {
		t.m.slowLagEvents.WithLabelValues(t.transport).Observe(float64(res.LagEvents))
		t.m.slowLagBytes.WithLabelValues(t.transport).Observe(float64(res.LagBytes))
	}
}

// Resumed counts an accepted resume token.
func (t *TransportMetrics) Resumed() { t.m.resumesAccepted.WithLabelValues(t.transport).Inc() }

// Refused counts a refused resume token by its internal reason.
func (t *TransportMetrics) Refused(reason string) {
	t.m.resumesRefused.WithLabelValues(t.transport, reason).Inc()
}
