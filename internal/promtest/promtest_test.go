package promtest_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/internal/promtest"
)

func TestValueAndAll(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c_total", Help: "c"}, []string{"kind", "side"})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g", Help: "g"})
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "h_seconds", Help: "h"})
	reg.MustRegister(c, g, h)
	c.WithLabelValues("a", "in").Add(2)
	c.WithLabelValues("b", "in").Add(3)
	g.Set(7)
	h.Observe(0.5)
	h.Observe(1.5)

	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   float64
		found  bool
	}{
		{"c_total", map[string]string{"kind": "b"}, 3, true},
		{"c_total", map[string]string{"kind": "b", "side": "in"}, 3, true},
		{"c_total", map[string]string{"kind": "b", "side": "out"}, 0, false},
		{"c_total", map[string]string{"zone": "x"}, 0, false}, // a label the series lacks
		{"c_total", nil, 2, true},                             // the first series
		{"g", nil, 7, true},
		{"h_seconds_count", nil, 2, true},
		{"h_seconds_sum", nil, 2, true},
		{"missing", nil, 0, false},
	} {
		if got, ok := promtest.Value(t, reg, tc.name, tc.labels); got != tc.want || ok != tc.found {
			t.Errorf("Value(%s, %v) = %v, %v; want %v, %v", tc.name, tc.labels, got, ok, tc.want, tc.found)
		}
	}

	all := promtest.All(t, reg, "c_total")
	if len(all) != 2 || all[0].Labels["kind"] != "a" || all[0].Value != 2 || all[1].Labels["kind"] != "b" || all[1].Value != 3 {
		t.Errorf("All(c_total) = %+v", all)
	}
	if all := promtest.All(t, reg, "missing"); len(all) != 0 {
		t.Errorf("All(missing) = %+v, want none", all)
	}
}
