// Package promtest reads a Prometheus registry in tests: one series' value
// by its name and some of its labels, or every series of a name. It is
// what client_golang's testutil leaves out: ToFloat64 needs the collector
// itself (tests hold a registry), GatherAndCount counts series without
// reading them, and GatherAndCompare wants a family's whole text.
//
// A series that is not there is not an error here: each caller says what
// it means (a failure, a zero, a sentinel).
package promtest

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Value returns the value of the first series of name in g whose labels
// include labels (nil: the family's first series), and whether there was
// one. name is as the text exposition prints it: a counter's, gauge's or
// untyped metric's own name, or name_count and name_sum for a histogram's
// or summary's sample count and sum. It fails tb when g cannot gather, or
// when name is a histogram's or summary's own name (count or sum?).
func Value(tb testing.TB, g prometheus.Gatherer, name string, labels map[string]string) (float64, bool) {
	tb.Helper()
	mfs := gather(tb, g)
	for _, mf := range mfs {
		part := ""
		switch mf.GetName() {
		case name:
		case strings.TrimSuffix(name, "_count"):
			part = "count"
		case strings.TrimSuffix(name, "_sum"):
			part = "sum"
		default:
			continue
		}
		for _, m := range mf.GetMetric() {
			if !includes(m, labels) {
				continue
			}
			switch {
			case part == "" && m.Counter != nil:
				return m.Counter.GetValue(), true
			case part == "" && m.Gauge != nil:
				return m.Gauge.GetValue(), true
			case part == "" && m.Untyped != nil:
				return m.Untyped.GetValue(), true
			case part == "count" && m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount()), true
			case part == "sum" && m.Histogram != nil:
				return m.Histogram.GetSampleSum(), true
			case part == "count" && m.Summary != nil:
				return float64(m.Summary.GetSampleCount()), true
			case part == "sum" && m.Summary != nil:
				return m.Summary.GetSampleSum(), true
			case part == "" && (m.Histogram != nil || m.Summary != nil):
				tb.Fatalf("promtest: %s is a %s: read %[1]s_count or %[1]s_sum", name, strings.ToLower(mf.GetType().String()))
			}
		}
	}
	return 0, false
}

// Series is one series of a counter, gauge or untyped metric.
type Series struct {
	Labels map[string]string
	Value  float64
}

// All returns every series of the counter, gauge or untyped metric name in
// g, in the registry's order (none when g has no such family). It fails tb
// when g cannot gather.
func All(tb testing.TB, g prometheus.Gatherer, name string) []Series {
	tb.Helper()
	var out []Series
	for _, mf := range gather(tb, g) {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			s := Series{Labels: map[string]string{}}
			for _, lp := range m.GetLabel() {
				s.Labels[lp.GetName()] = lp.GetValue()
			}
			switch {
			case m.Counter != nil:
				s.Value = m.Counter.GetValue()
			case m.Gauge != nil:
				s.Value = m.Gauge.GetValue()
			case m.Untyped != nil:
				s.Value = m.Untyped.GetValue()
			default:
				tb.Fatalf("promtest: %s is a %s: All reads counters, gauges and untyped metrics", name, strings.ToLower(mf.GetType().String()))
			}
			out = append(out, s)
		}
	}
	return out
}

func gather(tb testing.TB, g prometheus.Gatherer) []*dto.MetricFamily {
	tb.Helper()
	mfs, err := g.Gather()
	if err != nil {
		tb.Fatalf("promtest: gather: %v", err)
	}
	return mfs
}

// includes reports whether m has every label of want, with its value.
func includes(m *dto.Metric, want map[string]string) bool {
	have := 0
	for _, lp := range m.GetLabel() {
		if v, ok := want[lp.GetName()]; ok {
			if v != lp.GetValue() {
				return false
			}
			have++
		}
	}
	return have == len(want)
}
