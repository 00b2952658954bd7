// Package metric declares the engine's Prometheus collectors (core's and
// core/stream's): every one is in the switchyard namespace, so a
// declaration says only its subsystem ("" for none), name, help and, for
// a vector, its labels.
package metric

import "github.com/prometheus/client_golang/prometheus"

const namespace = "switchyard"

func opts(subsystem, name, help string) prometheus.Opts {
	return prometheus.Opts{Namespace: namespace, Subsystem: subsystem, Name: name, Help: help}
}

func histogramOpts(subsystem, name, help string, buckets []float64) prometheus.HistogramOpts {
	return prometheus.HistogramOpts{Namespace: namespace, Subsystem: subsystem, Name: name, Help: help, Buckets: buckets}
}

// Counter is a new counter switchyard_<subsystem>_<name>.
func Counter(subsystem, name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts(opts(subsystem, name, help)))
}

// CounterVec is a new counter vector with labels.
func CounterVec(subsystem, name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts(opts(subsystem, name, help)), labels)
}

// Gauge is a new gauge.
func Gauge(subsystem, name, help string) prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts(opts(subsystem, name, help)))
}

// GaugeVec is a new gauge vector with labels.
func GaugeVec(subsystem, name, help string, labels ...string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts(opts(subsystem, name, help)), labels)
}

// Histogram is a new histogram with buckets.
func Histogram(subsystem, name, help string, buckets []float64) prometheus.Histogram {
	return prometheus.NewHistogram(histogramOpts(subsystem, name, help, buckets))
}

// HistogramVec is a new histogram vector with buckets and labels.
func HistogramVec(subsystem, name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(histogramOpts(subsystem, name, help, buckets), labels)
}
