package core

import "time"

// NodeFigures are one node's live figures, as the cluster view charts them:
// counts since the node started, from which a reader derives rates and
// quantiles between two readings, and gauges read at one moment. A node
// reads its own (httpapi.ReadFigures) and asks its peers for theirs over
// the peer transport while someone watches the cluster.
type NodeFigures struct {
	// Node is the node the figures are of.
	Node string
	// At is when the figures were read, on the clock of the node that read
	// or asked for them: two readings of one reader give a rate.
	At time.Time
	// Err says why the node's figures could not be read (it is silent, or
	// did not answer in time); every figure is empty then.
	Err string
	// JobsEnded counts the jobs that ended with this node as their
	// ingress, by outcome (switchyard_jobs_total).
	JobsEnded map[string]uint64
	// FirstOutput is the time from submission to first output of the jobs
	// this node was the ingress of (switchyard_time_to_first_output_seconds).
	FirstOutput Histogram
	// StreamsOpen is the client job streams open on the node now, every
	// transport's (switchyard_stream_open).
	StreamsOpen int
	// Queues are the queues the node holds, as their dispatcher, with their
	// waiting (Depth) and bound (Bound) jobs (Engine.QueueStats).
	Queues []QueueStat
}

// Histogram is a histogram read at one moment, as Prometheus counts it:
// Counts[i] observations were at most Bounds[i] (cumulative, bounds
// rising), and Count in all, those above the last bound included.
type Histogram struct {
	Bounds []float64
	Counts []uint64
	Count  uint64
}
