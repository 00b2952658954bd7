package httpapi

import (
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/switchyard/switchyard/core"
)

// ClusterLoad is the cluster's load as the live view charts it: every
// node's figures (core.NodeFigures: this node's own, its peers' asked over
// the peer transport), read at most once per ClusterEventsInterval however
// many streams watch, and the rates and quantiles over the last few
// readings (five intervals: five seconds by default; fewer while a node
// has fewer).
type ClusterLoad struct {
	// JobsPerSecond is jobs ended per second over the last few readings,
	// every node's (each counts the jobs it was the ingress of) together,
	// by outcome. Absent until two readings were made.
	JobsPerSecond map[string]float64 `json:"jobs_per_second,omitempty"`
	// FirstOutputMS is the time from submission to first output, in
	// milliseconds, of the jobs whose first output came within the last
	// few readings, every node's together: estimated from the histogram's
	// buckets (linearly within one, as Prometheus's histogram_quantile
	// does). Absent when no job had its first output then.
	FirstOutputMS *Quantiles `json:"first_output_ms,omitempty"`
	// Queues are the queues some node holds, sorted by name: jobs in
	// flight (bound to a worker) and waiting, the dispatcher's figures
	// (summed over nodes while a queue moves between two).
	Queues []QueueLoad `json:"queues"`
	// Nodes are the nodes of the catalog, sorted by id: this node, and
	// each peer that answered or why it did not.
	Nodes []NodeLoad `json:"nodes"`
} // @name ClusterLoad

// Quantiles are two quantiles of the jobs of one interval.
type Quantiles struct {
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
	// Jobs is how many jobs they are of.
	Jobs uint64 `json:"jobs"`
} // @name Quantiles

// QueueLoad is one queue's jobs now.
type QueueLoad struct {
	Name string `json:"name"`
	// InFlight is the jobs bound to a worker; Depth the jobs waiting.
	InFlight int `json:"in_flight"`
	Depth    int `json:"depth"`
} // @name QueueLoad

// NodeLoad is one node's figures.
type NodeLoad struct {
	Node string `json:"node"`
	// StreamsOpen is the client job streams open on the node, every
	// transport's (SSE, gRPC, OpenAI-compatible).
	StreamsOpen int `json:"streams_open"`
	// JobsPerSecond is the jobs ended per second with the node as their
	// ingress, every outcome, over the last few readings; absent until two
	// readings were made.
	JobsPerSecond *float64 `json:"jobs_per_second,omitempty"`
	// Error says why the node's figures are missing: it is silent to this
	// node's pings (not asked), or did not answer in time.
	Error string `json:"error,omitempty"`
} // @name NodeLoad

// deriveLoad is the load from each node's reading now (cur) and its last
// good one before (prev, by node). A previous reading older than stale
// gives no rate: an average over minutes is not "now".
func deriveLoad(prev map[string]core.NodeFigures, cur []core.NodeFigures, stale time.Duration) ClusterLoad {
	load := ClusterLoad{Queues: []QueueLoad{}, Nodes: []NodeLoad{}}
	perSecond := map[string]float64{}
	rated := false
	var first firstOutput
	queues := map[string]*QueueLoad{}
	for _, f := range cur {
		nl := NodeLoad{Node: f.Node, Error: f.Err}
		if f.Err != "" {
			load.Nodes = append(load.Nodes, nl)
			continue
		}
		nl.StreamsOpen = f.StreamsOpen
		for _, q := range f.Queues {
			ql := queues[q.Name]
			if ql == nil {
				ql = &QueueLoad{Name: q.Name}
				queues[q.Name] = ql
			}
			ql.InFlight += q.Bound
			ql.Depth += q.Depth
		}
		p, ok := prev[f.Node]
		if dt := f.At.Sub(p.At); ok && p.Err == "" && dt > 0 && dt <= stale {
			sec := dt.Seconds()
			total := 0.0
			for outcome, n := range f.JobsEnded {
				r := float64(grown(n, p.JobsEnded[outcome])) / sec
				perSecond[outcome] += r
				total += r
			}
			total = round(total, 100)
			nl.JobsPerSecond = &total
			rated = true
			first.add(p.FirstOutput, f.FirstOutput)
		}
		load.Nodes = append(load.Nodes, nl)
	}
	if rated {
		load.JobsPerSecond = map[string]float64{}
		for o, r := range perSecond {
			load.JobsPerSecond[o] = round(r, 100)
		}
	}
	if first.total > 0 {
		load.FirstOutputMS = &Quantiles{
			P50:  round(1000*first.quantile(0.5), 10),
			P99:  round(1000*first.quantile(0.99), 10),
			Jobs: first.total,
		}
	}
	for _, q := range queues {
		load.Queues = append(load.Queues, *q)
	}
	slices.SortFunc(load.Queues, func(a, b QueueLoad) int { return cmp.Compare(a.Name, b.Name) })
	slices.SortFunc(load.Nodes, func(a, b NodeLoad) int { return cmp.Compare(a.Node, b.Node) })
	return load
}

// firstOutput sums the first-output histograms' growth over nodes (one
// binary, one set of bounds; a node with other bounds is left out).
type firstOutput struct {
	bounds []float64
	counts []uint64 // cumulative, as the histograms'
	total  uint64
}

func (h *firstOutput) add(prev, cur core.Histogram) {
	if len(cur.Bounds) == 0 || len(cur.Counts) != len(cur.Bounds) {
		return
	}
	if h.bounds == nil {
		h.bounds, h.counts = cur.Bounds, make([]uint64, len(cur.Bounds))
	} else if !slices.Equal(h.bounds, cur.Bounds) {
		return
	}
	if cur.Count < prev.Count || !slices.Equal(prev.Bounds, cur.Bounds) {
		// The node restarted (or changed its buckets): everything it
		// counted is new.
		prev = core.Histogram{Counts: make([]uint64, len(cur.Counts))}
	}
	for i := range cur.Counts {
		h.counts[i] += grown(cur.Counts[i], prev.Counts[i])
	}
	h.total += cur.Count - prev.Count
}

// quantile estimates the q-quantile: the bucket its rank falls in,
// linearly within it (from 0 for the first); above the last bound, the
// last bound, which is all the buckets can say.
func (h *firstOutput) quantile(q float64) float64 {
	rank := q * float64(h.total)
	for i, upper := range h.bounds {
		if float64(h.counts[i]) < rank {
			continue
		}
		lower, below := 0.0, uint64(0)
		if i > 0 {
			lower, below = h.bounds[i-1], h.counts[i-1]
		}
		in := h.counts[i] - below
		if in == 0 {
			return upper
		}
		return lower + (upper-lower)*(rank-float64(below))/float64(in)
	}
	return h.bounds[len(h.bounds)-1]
}

// grown is how much a counter grew from prev to cur; a counter that went
// back was reset (its node restarted), and all of cur is new.
func grown(cur, prev uint64) uint64 {
	if cur < prev {
		return cur
	}
	return cur - prev
}

// round rounds x to 1/per (per 100: two decimals): a rate that did not
// move is the same number, and an unchanged snapshot is not sent again.
func round(x float64, per float64) float64 { return math.Round(x*per) / per }
