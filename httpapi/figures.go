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

// rateWindow is how many intervals the load's rates and quantiles span:
// jobs end in bursts (a batch of jobs started together ends together), and
// a rate over one second of them zigzags; over five it reads at a glance
// and is still now.
const rateWindow = 5

// loadSampler reads every node's figures for the cluster event streams, at
// most once per minAge however many streams ask, and keeps the load
// derived from its readings: every stream shows the same figures, and the
// peers are asked once, not once per watcher. Nothing is read while nobody
// watches.
type loadSampler struct {
	// self reads this node's figures; peers asks every other node for
	// theirs (nil: a node alone), within the context's deadline.
	self  func() core.NodeFigures
	peers func(ctx context.Context) []core.NodeFigures
	// minAge: a reading younger than this is reused. window: the rates
	// are over the oldest reading this recent (rateWindow intervals).
	// timeout bounds the peers.
	minAge, window, timeout time.Duration

	mu   sync.Mutex
	at   time.Time                     // of the last reading
	hist map[string][]core.NodeFigures // each node's good readings within the window, oldest first
	load *ClusterLoad
}

func newLoadSampler(self func() core.NodeFigures, peers func(context.Context) []core.NodeFigures, interval time.Duration) *loadSampler {
	return &loadSampler{
		self: self, peers: peers,
		// Just under the interval: a stream ticking every interval gets a
		// new reading at each tick, and a second stream out of phase with
		// it reuses the first one's.
		minAge:  interval * 9 / 10,
		window:  rateWindow * interval,
		timeout: min(max(interval/2, 100*time.Millisecond), time.Second),
		hist:    map[string][]core.NodeFigures{},
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
	// Each node's rates are over its oldest reading within the window (a
	// node just seen has none yet: no rate).
	prev := map[string]core.NodeFigures{}
	for node, h := range l.hist {
		for _, f := range h {
			if now.Sub(f.At) <= l.window {
				prev[node] = f
				break
			}
		}
	}
	// The window chose prev by this reading's start; a peer's answer came
	// a little later, so its span may pass the window by that much.
	load := deriveLoad(prev, readings, l.window+l.timeout)
	for _, f := range readings {
		if f.Err == "" {
			l.hist[f.Node] = append(l.hist[f.Node], f)
		}
	}
	for node, h := range l.hist {
		// Nodes gone from the cluster are forgotten, and readings past the
		// window.
		if !hasNode(readings, node) {
			delete(l.hist, node)
			continue
		}
		i := 0
		for i < len(h) && now.Sub(h[i].At) > l.window {
			i++
		}
		l.hist[node] = h[i:]
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
