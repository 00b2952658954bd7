package core

import (
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/switchyard/switchyard/core/internal/metric"
)

// Metrics are the engine's collectors. Each node has its own registry (never
// the global one), so several nodes can run in one process.
type Metrics struct {
	Jobs             *prometheus.CounterVec
	QueueDepth       *prometheus.GaugeVec
	TimeToFirst      prometheus.Histogram
	Duration         *prometheus.HistogramVec
	WorkersConnected prometheus.Gauge
	Rejects          prometheus.Counter
	Stalls           prometheus.Counter
	Reclaims         prometheus.Counter
	StaleMessages    *prometheus.CounterVec
	LocalDeliveries  prometheus.Counter
	GraceSaves       prometheus.Counter
	QueuesReaped     prometheus.Counter
	FencedMessages   prometheus.Counter
	// IncarnationsReplaced counts peers seen back under a new incarnation
	// (membership.go), each the proven death of the one before.
	IncarnationsReplaced prometheus.Counter
	Relocations          prometheus.Counter
	RetainedJobs         prometheus.Gauge
	RetainedBytes        prometheus.Gauge
	Evictions            *prometheus.CounterVec
	CreditWaiting        prometheus.Gauge
	CreditWait           prometheus.Counter
	UnreadEvents         prometheus.Gauge
	UnreadBytes          prometheus.Gauge
	// Affinity counts the bindings of jobs with an affinity key, by
	// result (affinity.go).
	Affinity *prometheus.CounterVec
	// Restarts counts the jobs run again after their worker was lost with
	// output, by how it was lost (restart.go).
	Restarts *prometheus.CounterVec
	// StaleEpoch counts deliveries a consumer host refused for an epoch
	// older than one it has seen for the queue, StepDowns the times a
	// dispatcher handed a queue's waiting jobs back because its record
	// names another node (epoch.go), and QueueStalled the time from a
	// job's arrival at its dispatcher to its binding.
	StaleEpoch   prometheus.Counter
	StepDowns    prometheus.Counter
	QueueStalled prometheus.Histogram
}

// NewMetrics creates the engine's collectors and registers them on reg.
// A labelled collector has its series created at once, so dashboards see
// zeros rather than nothing.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Jobs: metric.CounterVec("", "jobs_total",
			"Jobs ended, by their one terminal outcome, counted on the ingress node.", "outcome"),
		QueueDepth: metric.GaugeVec("", "queue_depth",
			"Jobs waiting in a queue on its dispatcher (bound jobs excluded).", "queue"),
		TimeToFirst: metric.Histogram("", "time_to_first_output_seconds",
			"From submission to the first output of a job.", prometheus.ExponentialBuckets(0.0005, 2, 18)),
		Duration: metric.HistogramVec("", "job_duration_seconds",
			"From submission to the terminal outcome of a job.", prometheus.ExponentialBuckets(0.001, 2, 20), "outcome"),
		WorkersConnected: metric.Gauge("", "workers_connected",
			"Worker sessions registered on this node."),
		Rejects: metric.Counter("dispatch", "rejects_total",
			"Jobs a worker refused; each went to a different worker or failed rejected."),
		Stalls: metric.Counter("dispatch", "stalls_total",
			"Workers dropped for not answering an offer, or a cancel, within the dispatch timeout."),
		Reclaims: metric.Counter("dispatch", "reclaims_total",
			"Bound jobs returned to the queue because their worker was lost before any output."),
		StaleMessages: metric.CounterVec("dispatch", "stale_messages_total",
			"Worker messages refused because their (job, generation) was not the current binding.", "kind"),
		LocalDeliveries: metric.Counter("dispatch", "colocated_deliveries_total",
			"Deliveries where ingress, dispatcher and consumer were this node: no network involved."),
		GraceSaves: metric.Counter("stream", "grace_saves_total",
			"Jobs whose streaming client came back within the disconnect grace window."),
		QueuesReaped: metric.Counter("dispatch", "queues_reaped_total",
			"Queues removed after staying empty, with no consumer, for the queue idle time."),
		IncarnationsReplaced: metric.Counter("cluster", "incarnations_replaced_total",
			"Peers seen back under a new incarnation (restarted, or recovered from a fence): each releases at once what the previous incarnation held."),
		FencedMessages: metric.Counter("dispatch", "fenced_messages_total",
			"Worker answers this node did not forward because it had to treat its catalog lease as lost."),
		Relocations: metric.Counter("dispatch", "relocations_total",
			"Queues whose dispatch this node handed to the node hosting all their consumers."),
		RetainedJobs: metric.Gauge("retention", "jobs",
			"Ended jobs this node keeps for late readers (GET, events, resume)."),
		RetainedBytes: metric.Gauge("retention", "bytes",
			"Bytes the ended jobs this node keeps are accounted for (record, history, index entries), bounded by --retain-bytes."),
		Evictions: metric.CounterVec("retention", "evictions_total",
			"Ended jobs this node let go of, by the bound that made it: retention (time), count (--retain-jobs) or bytes (--retain-bytes).", "reason"),
		CreditWaiting: metric.Gauge("worker", "credit_waiting",
			"Jobs on this node's workers that used all their output credit: paced, waiting for their reader to take their output."),
		CreditWait: metric.Counter("worker", "credit_wait_seconds_total",
			"Time this node's workers' jobs spent out of output credit, waiting for their readers."),
		UnreadEvents: metric.Gauge("output", "unread_events",
			"Outputs this node (as ingress) holds that its jobs' readers have not taken yet: at most the output window per streamed job."),
		UnreadBytes: metric.Gauge("output", "unread_bytes",
			"Bytes of output (as the workers sent it) this node (as ingress) holds that its jobs' readers have not taken yet: at most the output window per streamed job, and one output."),
		Affinity: metric.CounterVec("dispatch", "affinity_total",
			"Jobs with an affinity key bound by this node's dispatchers, by result: hit (the first consumer in its key's order), or a miss: full (no room there), gone (the key's consumer left), none_capable (the key's consumer cannot run this job).", "result"),
		Restarts: metric.CounterVec("", "job_restarts_total",
			"Jobs this node (as ingress) ran again after their worker was lost with output (on_worker_lost: restart), by how it was lost: worker_lost (its host let go of it: the session ended, or the host stopped it) or node_gone (its node's death proven).", "reason"),
		StaleEpoch: metric.Counter("dispatch", "stale_epoch_total",
			"Deliveries this node, as consumer host, refused because their dispatcher's epoch was older than one it has seen for the queue: a dispatcher that had been replaced. Each went back to its ingress unrun."),
		StepDowns: metric.Counter("dispatch", "step_downs_total",
			"Times this node stopped dispatching a queue whose record came to name another node, handing the queue's waiting jobs back to their ingresses."),
		// No queue label: queues are named by callers, and a histogram per
		// queue is a dozen series each. The depth gauge says which queue.
		QueueStalled: metric.Histogram("", "queue_stalled_seconds",
			"From a job's arrival at its dispatcher to its binding to a consumer: how long jobs wait in their queue (the wait at the ingress for a dispatcher is not in it).", prometheus.ExponentialBuckets(0.001, 2, 16)),
	}
	for _, r := range []EvictReason{EvictRetention, EvictCount, EvictBytes} {
		m.Evictions.WithLabelValues(string(r))
	}
	for _, o := range []Outcome{OutcomeCompleted, OutcomeFailed, OutcomeCancelled, OutcomeExpired} {
		m.Jobs.WithLabelValues(string(o))
	}
	for _, r := range []string{AffinityHit, AffinityFull, AffinityGone, AffinityNoneCapable} {
		m.Affinity.WithLabelValues(r)
	}
	for _, r := range []lost{lostStopped, lostProven} {
		m.Restarts.WithLabelValues(r.restartReason())
	}
	reg.MustRegister(m.Jobs, m.QueueDepth, m.TimeToFirst, m.Duration, m.WorkersConnected,
		m.Rejects, m.Stalls, m.Reclaims, m.StaleMessages, m.LocalDeliveries, m.GraceSaves,
		m.QueuesReaped, m.FencedMessages, m.IncarnationsReplaced, m.Relocations, m.RetainedJobs, m.RetainedBytes, m.Evictions,
		m.CreditWaiting, m.CreditWait, m.UnreadEvents, m.UnreadBytes, m.Affinity, m.Restarts,
		m.StaleEpoch, m.StepDowns, m.QueueStalled)
	return m
}

// observe records a job's latency v on h, with the job's trace id as the
// bucket's exemplar when its trace is sampled: a slow bucket then links to
// a trace that was recorded (exemplars are exposed in the OpenMetrics
// format only: docs/tracing.md, "Exemplars").
func observe(h prometheus.Observer, v float64, sc trace.SpanContext) {
	if sc.IsSampled() {
		if eo, ok := h.(prometheus.ExemplarObserver); ok {
			eo.ObserveWithExemplar(v, prometheus.Labels{"trace_id": sc.TraceID().String()})
			return
		}
	}
	h.Observe(v)
}
