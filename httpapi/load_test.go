package httpapi

import (
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/switchyard/switchyard/core"
)

// figures is a node's reading at t0+at with jobs ended by outcome, first
// outputs as cumulative counts over the bounds 1ms, 2ms, 4ms, 8ms (and
// total above), open streams and queues.
func figures(node string, at time.Duration, jobs map[string]uint64, counts []uint64, total uint64, streams int, queues ...core.QueueStat) core.NodeFigures {
	return core.NodeFigures{
		Node: node, At: t0.Add(at), JobsEnded: jobs,
		FirstOutput: core.Histogram{Bounds: []float64{0.001, 0.002, 0.004, 0.008}, Counts: counts, Count: total},
		StreamsOpen: streams, Queues: queues,
	}
}

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func TestDeriveLoad(t *testing.T) {
	prev := map[string]core.NodeFigures{
		"a": figures("a", 0, map[string]uint64{"completed": 10, "failed": 1}, []uint64{0, 0, 0, 0}, 0, 1),
		"b": figures("b", 0, map[string]uint64{"completed": 5, "failed": 0}, []uint64{2, 2, 2, 2}, 2, 0),
	}
	cur := []core.NodeFigures{
		// b first: the load sorts nodes by id.
		// 500ms later: 2 more completed, so 4/s; 10 first outputs between
		// 1 and 2ms.
		figures("b", 500*time.Millisecond, map[string]uint64{"completed": 7, "failed": 0}, []uint64{2, 12, 12, 12}, 12, 3,
			core.QueueStat{Name: "demo", Depth: 1, Bound: 4}),
		// 1s later: 6 more completed, 1 more failed; 100 first outputs: 50
		// up to 1ms, 40 in (1ms, 2ms], 10 in (4ms, 8ms].
		figures("a", time.Second, map[string]uint64{"completed": 16, "failed": 2}, []uint64{50, 90, 90, 100}, 100, 2,
			core.QueueStat{Name: "demo", Depth: 2, Bound: 3}, core.QueueStat{Name: "chat", Bound: 1}),
		{Node: "c", Err: "silent to this node's pings: not asked"},
	}
	got := deriveLoad(prev, cur, 3*time.Second)

	if want := map[string]float64{"completed": 6 + 4, "failed": 1}; !reflect.DeepEqual(got.JobsPerSecond, want) {
		t.Errorf("jobs per second %v, want %v", got.JobsPerSecond, want)
	}
	if want := []QueueLoad{{Name: "chat", InFlight: 1}, {Name: "demo", InFlight: 7, Depth: 3}}; !reflect.DeepEqual(got.Queues, want) {
		t.Errorf("queues %+v, want %+v", got.Queues, want)
	}
	seven, four := 7.0, 4.0
	if want := []NodeLoad{
		{Node: "a", StreamsOpen: 2, JobsPerSecond: &seven},
		{Node: "b", StreamsOpen: 3, JobsPerSecond: &four},
		{Node: "c", Error: "silent to this node's pings: not asked"},
	}; !reflect.DeepEqual(got.Nodes, want) {
		t.Errorf("nodes %+v, want %+v", got.Nodes, want)
	}
	// 110 first outputs: 50 up to 1ms, 40 + b's 10 in (1ms, 2ms], 10 in
	// (4ms, 8ms]. The median (rank 55) is 5 into the 50 of (1ms, 2ms]; the
	// 99th percentile (rank 108.9) 8.9 into the 10 of (4ms, 8ms].
	q := got.FirstOutputMS
	if q == nil || q.Jobs != 110 {
		t.Fatalf("first output %+v, want 110 jobs", q)
	}
	if want := round(1+5.0/50, 10); q.P50 != want {
		t.Errorf("p50 %v ms, want %v", q.P50, want)
	}
	if want := round(4+4*8.9/10, 10); q.P99 != want {
		t.Errorf("p99 %v ms, want %v", q.P99, want)
	}
}

// No rate without a previous reading, or from one too old to be "now"; a
// node that restarted counts from zero again.
func TestDeriveLoadFirstStaleAndReset(t *testing.T) {
	cur := []core.NodeFigures{figures("a", time.Minute, map[string]uint64{"completed": 3}, []uint64{1, 1, 1, 1}, 1, 0)}
	if got := deriveLoad(nil, cur, 3*time.Second); got.JobsPerSecond != nil || got.FirstOutputMS != nil || got.Nodes[0].JobsPerSecond != nil {
		t.Errorf("first reading: %+v, want no rates", got)
	}
	old := map[string]core.NodeFigures{"a": figures("a", 0, map[string]uint64{"completed": 1}, []uint64{0, 0, 0, 0}, 0, 0)}
	if got := deriveLoad(old, cur, 3*time.Second); got.JobsPerSecond != nil {
		t.Errorf("a previous reading a minute old gave rates %v", got.JobsPerSecond)
	}
	// The node restarted between readings: its counts went back.
	before := map[string]core.NodeFigures{"a": figures("a", 59*time.Second, map[string]uint64{"completed": 40}, []uint64{9, 9, 9, 9}, 9, 0)}
	got := deriveLoad(before, cur, 3*time.Second)
	if r := got.JobsPerSecond["completed"]; r != 3 {
		t.Errorf("after a restart: %v completed/s, want 3 (all it counted since)", r)
	}
	if q := got.FirstOutputMS; q == nil || q.Jobs != 1 {
		t.Errorf("after a restart: first output %+v, want 1 job", q)
	}
}

// Above the last bound a quantile is the last bound: the buckets say no
// more.
func TestQuantileAboveTheBuckets(t *testing.T) {
	h := firstOutput{bounds: []float64{1, 2}, counts: []uint64{0, 1}, total: 10}
	if got := h.quantile(0.99); got != 2 {
		t.Errorf("p99 %v, want the last bound 2", got)
	}
	if got := h.quantile(0.05); math.Abs(got-1.5) > 1e-9 {
		t.Errorf("p5 %v, want 1.5 (rank 0.5: half into the one in (1, 2])", got)
	}
}
