package core

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
)

// Config configures an Engine. Start from DefaultConfig.
type Config struct {
	// Node is this node's id.
	Node string
	// Zone is this node's zone label; empty means unlabelled.
	Zone string
	// Limits are the node's ceilings.
	Limits Limits
	// DispatchTimeoutFraction of a job's remaining TTL is how long a worker
	// gets to accept it, between DispatchTimeoutFloor and
	// DispatchTimeoutCeiling (see DispatchTimeout). The same bound applies to
	// a worker acknowledging a cancel.
	DispatchTimeoutFraction float64
	DispatchTimeoutFloor    time.Duration
	DispatchTimeoutCeiling  time.Duration
	// HistoryEvents and HistoryBytes bound each job's retained history.
	HistoryEvents int
	HistoryBytes  int64
	// OutputWindowEvents and OutputWindowBytes are how far a job's worker
	// may run ahead of what the job's reader took: its output credit's
	// window (credit.go). Both at least 1; a node keeps them below its
	// streams' bounds, and so below the history's.
	OutputWindowEvents int
	OutputWindowBytes  int64
	// Retention is how long an ended job stays readable and resumable, at
	// most: RetainJobs and RetainBytes bound, node-wide, how many ended
	// jobs are kept and the bytes they hold, and the oldest ended job goes
	// first when either is passed (see retain.go).
	Retention   time.Duration
	RetainJobs  int
	RetainBytes int64
	// ExpirySlack delays the ingress node's own deadline past the job's TTL,
	// so a TTL that runs out is failed where it is found (in the queue, at
	// the worker) and the ingress timer is only the backstop that makes a
	// lost hop end in a terminal event rather than a hang.
	ExpirySlack time.Duration
	// ForwardWait is how long Submit waits for a remote dispatcher's
	// verdict on a new job before it answers with the job accepted (the
	// forward goes on in the background). A live dispatcher answers well
	// within it, so its refusals stay synchronous; a silent one costs the
	// requester no more than this before the first byte.
	ForwardWait time.Duration
	// DispatcherWait is how long, at most, a job waits for its queue's
	// dispatcher (one that does not answer, or a record naming none that is
	// routable) before it fails dispatcher_unavailable; its TTL bounds the
	// wait too. It should exceed the catalog's lease TTL, so that a dead
	// dispatcher's record is gone and replaced within it.
	DispatcherWait time.Duration
	// QueueIdle is how long a queue with no job and no worker lives on
	// before the reaper removes it.
	QueueIdle time.Duration
	// Catalog receives consumer records; nil runs without one (unit tests).
	Catalog Catalog
	// Cluster answers the engine's routing decisions about other nodes,
	// and Transport carries its messages to them; both nil is a single
	// node. A Cluster needs a Catalog and a Transport.
	Cluster   Cluster
	Transport Transport
	// Idempotency keeps idempotency keys across the cluster (the catalog;
	// see idempotency.go); nil keeps them on this node only.
	Idempotency IdempotencyStore
	// PinStable is how long a queue's consumers must have lived on one
	// other node before a dispatcher that hosts none of them hands the
	// queue over to that node (relocation hysteresis).
	PinStable time.Duration
	// Scheduling is how dispatchers order and place jobs: affinity's load
	// bound and priority aging (scheduling.go).
	Scheduling SchedulingConfig
	// Registerer receives the engine's metrics; nil means a private registry.
	Registerer prometheus.Registerer
	// Tracer records the spans of every job (trace.go); nil records none,
	// and jobs still carry their trace context through every hop.
	Tracer trace.Tracer
	Logger *slog.Logger
}

// DefaultConfig returns a Config with every tunable set.
func DefaultConfig() Config {
	return Config{
		Node:                    "node",
		Limits:                  DefaultLimits(),
		DispatchTimeoutFraction: 0.25,
		DispatchTimeoutFloor:    100 * time.Millisecond,
		DispatchTimeoutCeiling:  5 * time.Second,
		HistoryEvents:           8192,
		HistoryBytes:            8 << 20,
		OutputWindowEvents:      512,
		OutputWindowBytes:       2 << 20,
		Retention:               5 * time.Minute,
		RetainJobs:              50_000,
		RetainBytes:             64 << 20,
		ExpirySlack:             100 * time.Millisecond,
		ForwardWait:             time.Second,
		DispatcherWait:          30 * time.Second,
		QueueIdle:               5 * time.Minute,
		PinStable:               5 * time.Second,
		Scheduling:              DefaultSchedulingConfig(),
	}
}

// Validate reports the first setting that cannot work.
func (c *Config) Validate() error {
	const validName = "must be 1-128 of [A-Za-z0-9._-]"
	if err := firstBroken([]setting{
		{!ValidName(c.Node), "name", c.Node, validName},
		{c.Zone != "" && !ValidName(c.Zone), "zone", c.Zone, validName},
	}); err != nil {
		return err
	}
	if err := c.Limits.Validate(); err != nil {
		return err
	}
	if err := firstBroken([]setting{
		{c.DispatchTimeoutFraction <= 0 || c.DispatchTimeoutFraction >= 1, "dispatch-timeout-fraction", c.DispatchTimeoutFraction, "must be between 0 and 1"},
		positive("dispatch-timeout-floor", c.DispatchTimeoutFloor),
		{c.DispatchTimeoutCeiling < c.DispatchTimeoutFloor, "dispatch-timeout", c.DispatchTimeoutCeiling, "must be at least the floor"},
		positive("history-events", c.HistoryEvents),
		{c.HistoryBytes < c.Limits.MaxInputBytes, "history-bytes", c.HistoryBytes, "must be at least max-input-bytes"},
		positive("output-window-events", c.OutputWindowEvents),
		positive("output-window-bytes", c.OutputWindowBytes),
		positive("retention", c.Retention),
		{c.RetainJobs < 1, "retain-jobs", c.RetainJobs, "must be at least 1, or a job submitted for later could never be read after it ended"},
		{c.RetainBytes < c.HistoryBytes, "retain-bytes", c.RetainBytes, "must be at least history-bytes, or one ended job with a full history would evict every other"},
		positive("queue-idle", c.QueueIdle),
		{c.Cluster != nil && c.Catalog == nil, "catalog", nil, "a cluster needs a catalog"},
		{(c.Cluster == nil) != (c.Transport == nil), "transport", nil, "a cluster and a transport come together"},
		positive("pin-stable", c.PinStable),
		positive("forward-wait", c.ForwardWait),
		{c.DispatcherWait < c.ForwardWait, "dispatcher-wait", c.DispatcherWait, "must be at least the forward wait"},
		notNegative("expiry-slack", c.ExpirySlack),
	}); err != nil {
		return err
	}
	return c.Scheduling.Validate()
}

// Engine is one node's job machinery: ingress, dispatcher and consumer host.
type Engine struct {
	cfg    Config
	log    *slog.Logger
	m      *Metrics
	tracer trace.Tracer
	cat    Catalog
	// cluster and transport are nil on a single node: see the *Locked
	// routing helpers in roles.go.
	cluster   Cluster
	transport Transport

	// bg owns the goroutines the engine starts itself (elections and
	// catalog writes that must not run under mu); bgCtx ends them on Close.
	bg       sync.WaitGroup
	bgCtx    context.Context
	bgCancel context.CancelFunc

	mu      sync.Mutex
	jobs    map[string]*Job
	idem    map[string]string
	idemp   idempotency
	queues  map[string]*queue
	workers map[string]*Worker
	// hosted indexes this node's bindings by job id: where a cancel for a
	// job running here finds its worker.
	hosted map[string]*Worker
	// unrouted holds, by queue, this ingress's jobs waiting for their
	// queue's dispatcher (reroute.go).
	unrouted map[string]*awaiting
	// silent is the set of nodes this node's peer tracker holds silent
	// (silence.go).
	silent map[string]bool
	// retain keeps the ended jobs (still in jobs) for late readers.
	retain retained
	// active counts the jobs this node holds as their ingress, not yet
	// ended. Changed under mu; atomic so that IngressJobs reads it without.
	active   atomic.Int64
	draining bool
	// fenced: Fence ran and Unfence has not (fence.go).
	fenced bool
	// drained closes once the node is draining and holds no open job
	// (quietLocked); drain is the graceful drain's progress (drain.go).
	drained chan struct{}
	drain   drainState
	closed  bool
	epoch   uint64
	// epochs is, per queue, the newest dispatch epoch this node has seen
	// (epoch.go).
	epochs map[string]seenEpoch
	// incarnations is each node's incarnation as the last ClusterChanged
	// saw it: a node whose record comes back under another one was
	// replaced, and its previous incarnation is dead (membership.go).
	incarnations map[string]string
}

// New returns an Engine. It starts no goroutines: everything it does later
// happens on callers' goroutines, on timers it stops in Close, or (in a
// cluster) on short-lived goroutines for catalog writes, which Close
// cancels and waits for.
func New(cfg Config) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	e := &Engine{
		cfg:       cfg,
		log:       cfg.Logger,
		tracer:    cfg.Tracer,
		m:         NewMetrics(cfg.Registerer),
		cat:       cfg.Catalog,
		cluster:   cfg.Cluster,
		transport: cfg.Transport,
		jobs:      map[string]*Job{},
		idem:      map[string]string{},
		idemp:     idempotency{pending: map[string]chan struct{}{}},
		queues:    map[string]*queue{},
		workers:   map[string]*Worker{},
		hosted:    map[string]*Worker{},
		unrouted:  map[string]*awaiting{},
		silent:    map[string]bool{},
		drained:   make(chan struct{}),
		epoch:     uint64(time.Now().UnixMilli()),

		incarnations: map[string]string{},
		epochs:       map[string]seenEpoch{},
	}
	e.bgCtx, e.bgCancel = context.WithCancel(context.Background())
	return e, nil
}

// Epoch identifies this engine's incarnation: the snapshot version of every
// history it holds. Histories live in memory, so a position from before a
// restart refers to events that no longer exist and must be refused.
func (e *Engine) Epoch() uint64 { return e.epoch }

// Config returns the engine's configuration.
func (e *Engine) Config() Config { return e.cfg }

// Draining reports whether the engine has stopped taking jobs.
func (e *Engine) Draining() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.draining
}

// Close stops every timer. Jobs still open are ended with node_shutdown, so
// no requester is left waiting on a stream that will never end.
func (e *Engine) Close() {
	e.bgCancel()
	defer e.bg.Wait()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return
	}
	for _, j := range e.jobs {
		e.finishLocked(j, CodeNodeShutdown, "the node shut down before the job ended", nil)
	}
	e.closed = true
	stopTimer(e.retain.timer)
	for _, j := range e.jobs {
		stopTimer(j.timer)
		stopTimer(j.graceTimer)
		stopTimer(j.rerouteTimer)
	}
	for _, q := range e.queues {
		stopTimer(q.reap)
		stopTimer(q.pinTimer)
		for _, t := range q.pending {
			stopTimer(t.timer)
			t.endSpan("node closed", CodeNodeShutdown)
		}
	}
	for _, w := range e.workers {
		for _, b := range w.bindings {
			stopTimer(b.timer)
			b.endSpans("node closed", CodeNodeShutdown)
		}
	}
}

// stopTakingLocked refuses new jobs from now on; drained closes once the
// last open job has ended (quietLocked).
func (e *Engine) stopTakingLocked() {
	if !e.draining {
		e.draining = true
		e.quietLocked()
	}
}

// IngressJobs is the number of jobs this node holds as their ingress and
// that have not ended. It takes no lock: the count may be a moment old,
// good for a hint (the peer layer's reply stream reader yields for a job
// alone at its ingress, peer/reply_recv.go) and nothing that must be exact.
func (e *Engine) IngressJobs() int {
	return int(e.active.Load())
}

// activeDoneLocked accounts for a job reaching its terminal outcome.
func (e *Engine) activeDoneLocked() {
	e.active.Add(-1)
	e.quietLocked()
}

// goLocked runs f on a goroutine the engine owns: Close cancels its context
// and waits for it. Catalog writes go this way, never under mu.
func (e *Engine) goLocked(f func(ctx context.Context)) {
	if e.closed {
		return
	}
	e.bg.Go(func() { f(e.bgCtx) })
}

func stopTimer(t *time.Timer) {
	if t != nil {
		t.Stop()
	}
}
