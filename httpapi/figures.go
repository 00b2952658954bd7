package httpapi

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/core"
)

// ReadFigures reads e's node's live figures now: the counts and gauges
// from its metrics registry g (what /metrics serves), its queues from the
// engine. The node answers its peers' Figures calls with it too.
func ReadFigures(e *core.Engine, g prometheus.Gatherer) core.NodeFigures {
	f := core.NodeFigures{Node: e.Config().Node, JobsEnded: map[string]uint64{}, Queues: e.QueueStats()}
	if g == nil {
		return f
	}
	// A registry that fails to gather some collector still returns the
	// rest (see counters).
	mfs, _ := g.Gather()
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "switchyard_jobs_total":
				f.JobsEnded[label(m, "outcome")] += uint64(value(m))
			case "switchyard_stream_open":
				f.StreamsOpen += int(value(m))
			case "switchyard_time_to_first_output_seconds":
				h := m.GetHistogram()
				f.FirstOutput.Count = h.GetSampleCount()
				for _, b := range h.GetBucket() {
					if math.IsInf(b.GetUpperBound(), 1) {
						continue // Count has it
					}
					f.FirstOutput.Bounds = append(f.FirstOutput.Bounds, b.GetUpperBound())
					f.FirstOutput.Counts = append(f.FirstOutput.Counts, b.GetCumulativeCount())
				}
			}
		}
	}
	return f
}

// loadSampler reads every node's figures for the cluster event streams, at
// most once per minAge however many streams ask, and keeps the load
// derived from its last two readings: every stream shows the same figures,
// and the peers are asked once, not once per watcher. Nothing is read
// while nobody watches.
type loadSampler struct {
	// self reads this node's figures; peers asks every other node for
	// theirs (nil: a node alone), within the context's deadline.
	self  func() core.NodeFigures
	peers func(ctx context.Context) []core.NodeFigures
	// minAge: a reading younger than this is reused. stale: a previous
	// reading older than this gives no rate. timeout bounds the peers.
	minAge, stale, timeout time.Duration

	mu   sync.Mutex
	at   time.Time                   // of the last reading
	last map[string]core.NodeFigures // each node's last good reading
	load *ClusterLoad
}

func newLoadSampler(self func() core.NodeFigures, peers func(context.Context) []core.NodeFigures, interval time.Duration) *loadSampler {
	return &loadSampler{
		self: self, peers: peers,
		// Just under the interval: a stream ticking every interval gets a
		// new reading at each tick, and a second stream out of phase with
		// it reuses the first one's.
		minAge:  interval * 9 / 10,
		stale:   3 * interval,
		timeout: min(max(interval/2, 100*time.Millisecond), time.Second),
		last:    map[string]core.NodeFigures{},
	}
}

// Load returns the cluster's load, reading it again when the last reading
// is older than minAge. It may wait for the peers' answers (at most
// timeout), holding the sampler: a stream that asks meanwhile gets the
// same reading.
func (l *loadSampler) Load(ctx context.Context) *ClusterLoad {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if l.load != nil && now.Sub(l.at) < l.minAge {
		return l.load
	}
	self := l.self()
	self.At = now
	readings := []core.NodeFigures{self}
	if l.peers != nil {
		// The reading serves every stream, not only the one whose tick
		// asked: its leaving must not cut it short (the timeout bounds it).
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.timeout)
		readings = append(readings, l.peers(pctx)...)
		cancel()
	}
	load := deriveLoad(l.last, readings, l.stale)
	for _, f := range readings {
		if f.Err == "" {
			l.last[f.Node] = f
		}
	}
	// Nodes gone from the cluster are forgotten.
	for node := range l.last {
		if !hasNode(readings, node) {
			delete(l.last, node)
		}
	}
	l.at, l.load = now, &load
	return l.load
}

func hasNode(fs []core.NodeFigures, node string) bool {
	for _, f := range fs {
		if f.Node == node {
			return true
		}
	}
	return false
}
