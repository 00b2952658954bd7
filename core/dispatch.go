package core

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// This file is the dispatcher role: a queue's pending jobs (the only copy),
// TTL decremented at dequeue, and the binding of each job to one consumer.

// Delivery is a job as it travels from ingress to dispatcher to consumer
// host. TTL is what the sender measured as remaining when it sent it: each
// hop subtracts what it spent, queue residence included.
type Delivery struct {
	JobID          string
	Gen            uint64
	Queue          string
	Ingress        string
	Input          json.RawMessage
	Options        json.RawMessage
	Capabilities   map[string]string
	Zone           string
	TTL            time.Duration
	MaxOutputBytes int64
	// MaxQueueDepth and MaxQueueBytes are the envelope's own (lowered)
	// queue caps; the dispatcher applies them under its node's ceilings.
	MaxQueueDepth int
	MaxQueueBytes int64
	// Exclude lists the consumers that refused this job: it is never
	// offered to them again.
	Exclude []string
	// Front puts a job that comes back to its queue (a reject, a lost
	// worker) at the head, so it keeps its place.
	Front bool
	// Window is the output window the ingress paces the job with: its
	// worker's first output credit (credit.go). Zero: not paced.
	Window OutputCredit
	// Subject is the submitter's subject ("": anonymous) and Weight its
	// fair-share weight, from its key on the ingress node; Priority and
	// AffinityKey are the envelope's. The dispatcher orders and places
	// the job by them (fairqueue.go, affinity.go).
	Subject     string
	Weight      int
	Priority    int
	AffinityKey string
	// Trace is the span context the next hop's span is a child of: the
	// sender's (the job's, its forward's, or its queue span's once bound).
	Trace trace.SpanContext
	// Epoch is the dispatcher's term for the queue when it bound the job
	// (its dispatch record's DispatchInfo.Epoch), set on deliveries only.
	// A consumer host refuses a delivery older than an epoch it has seen
	// for the queue (epoch.go). Zero: none, never refused for it.
	Epoch uint64
	// LatencyFirst is the ingress's hint that it held no other job in
	// flight when it sent this one: the host may favour the job's latency
	// over batching (Worker.Output's report). Set by the ingress only,
	// passed on unchanged by a dispatcher; false changes nothing.
	LatencyFirst bool
}

// queue is one queue on its dispatcher.
type queue struct {
	name string
	// depth is the queue's QueueDepth child, looked up once (setDepthLocked):
	// a label lookup per job is a hash of the name and a map read.
	depth   prometheus.Gauge
	pending []*task
	// fair orders pending for dispatch, aff places the jobs with an
	// affinity key, pool is the consumers one choice sees (fairqueue.go,
	// affinity.go, consumers.go).
	fair    fairQueue
	aff     affinityQueue
	pool    consumerPool
	bytes   int64
	bound   map[string]*task
	workers []*Worker
	// remote tracks the credits this dispatcher has used on consumers
	// hosted by other nodes (their records come from the catalog view).
	remote map[string]*remoteConsumer
	// seen makes a forward idempotent: the highest generation of each job
	// this dispatcher took, kept until the job's TTL has passed.
	seen map[string]seenJob
	// dispatching and again make dispatchLocked safe to re-enter: dropping a
	// worker mid-pass (a failed send) dispatches again from inside the pass.
	dispatching, again bool
	// claiming is set while a consumer's claim on the queue is in flight.
	claiming bool
	// reap removes the queue once it has been empty for QueueIdle.
	reap *time.Timer
	// pinTo is the node this dispatcher would hand the queue to, and
	// pinSince when that became so; pinTimer re-checks after PinStable.
	pinTo    string
	pinSince time.Time
	pinTimer *time.Timer
}

// remoteConsumer is a consumer on another node, as its dispatcher counts it.
type remoteConsumer struct {
	info  ConsumerInfo
	bound int
}

type seenJob struct {
	gen     uint64
	expires time.Time
}

// task is a pending or bound job on the dispatcher, or a job bound to a
// local worker on its consumer host.
type task struct {
	d        Delivery
	budget   Budget
	timer    *time.Timer
	rejected map[string]bool
	worker   *Worker
	// remote is the consumer on another node this dispatcher bound it to.
	remote *remoteConsumer
	// from is, on a consumer host, the dispatcher node that delivered the
	// job ("" when the dispatcher is this node).
	from string
	// fair and aff are its place in its queue's order and its affinity
	// target, on the dispatcher.
	fair fairTask
	aff  affinityTask
	// span is the job's queue span while it is pending on the dispatcher
	// (trace.go); nil once it left the queue.
	span trace.Span
	// arrived is when it reached its dispatcher's queue.
	arrived time.Time
}

func newTask(d Delivery, now time.Time) *task {
	t := &task{d: d, budget: Budget{TTL: d.TTL, At: now}, arrived: now}
	if len(d.Exclude) > 0 {
		t.rejected = make(map[string]bool, len(d.Exclude))
		for _, c := range d.Exclude {
			t.rejected[c] = true
		}
	}
	return t
}

func (e *Engine) queueLocked(name string) *queue {
	q := e.queues[name]
	if q == nil {
		q = &queue{name: name, bound: map[string]*task{}, remote: map[string]*remoteConsumer{}, seen: map[string]seenJob{}}
		e.queues[name] = q
		e.idleLocked(q)
	}
	return q
}

// idleLocked arms the reaper of a queue that has just become empty: no
// waiting job, no bound job, no worker. Queues are created implicitly by
// any name a caller posts to, so without this the map would only grow.
func (e *Engine) idleLocked(q *queue) {
	if len(q.pending) > 0 || len(q.bound) > 0 || len(q.workers) > 0 || e.closed {
		return
	}
	stopTimer(q.reap)
	q.reap = time.AfterFunc(e.cfg.QueueIdle, func() { e.reapQueue(q) })
	e.pinCheckLocked(q)
}

// reapQueue removes an idle queue from memory and, when this node is its
// dispatcher and no consumer of it is left anywhere, from the catalog.
func (e *Engine) reapQueue(q *queue) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed || e.queues[q.name] != q || len(q.pending) > 0 || len(q.bound) > 0 || len(q.workers) > 0 {
		return
	}
	if e.cat != nil && len(e.cat.Consumers(q.name)) > 0 {
		// Consumers elsewhere still route through this dispatcher.
		e.idleLocked(q)
		return
	}
	delete(e.queues, q.name)
	// The catalog view keeps the record's epoch; what deliveries taught
	// this node goes with the queue.
	delete(e.epochs, q.name)
	stopTimer(q.pinTimer)
	e.m.QueueDepth.DeleteLabelValues(q.name)
	q.depth = nil
	e.m.QueuesReaped.Inc()
	e.log.Debug("queue reaped", "queue", q.name)
	if e.cluster != nil {
		if node, ok := e.cluster.CachedDispatcher(q.name); ok && node == e.cfg.Node {
			e.goLocked(func(ctx context.Context) {
				if err := e.cluster.ReleaseQueue(ctx, q.name); err != nil {
					e.log.Warn("release dispatch record", "queue", q.name, "err", err)
				}
			})
		}
	}
}

// enqueueLocked takes a delivery into a queue, or refuses it synchronously
// when the queue is over depth or bytes (the node's ceilings, or the
// envelope's lower caps). The time it spends queued counts against its TTL:
// the budget starts now, on this node's clock. A job coming back to its
// queue (Front) is not a new arrival and is not refused for the caps.
func (e *Engine) enqueueLocked(d Delivery, now time.Time) error {
	if d.TTL <= 0 {
		return &Error{Code: CodeExpired, Detail: "the job's TTL ran out before it reached the dispatcher"}
	}
	q := e.queueLocked(d.Queue)
	if s, ok := q.seen[d.JobID]; ok && s.gen >= d.Gen {
		// A retried forward: this dispatcher already holds (or held) it.
		return nil
	}
	if !d.Front {
		depth, bytes := e.cfg.Limits.MaxQueueDepth, e.cfg.Limits.MaxQueueBytes
		if d.MaxQueueDepth > 0 {
			depth = min(depth, d.MaxQueueDepth)
		}
		if d.MaxQueueBytes > 0 {
			bytes = min(bytes, d.MaxQueueBytes)
		}
		if len(q.pending)+1 > depth {
			return &Error{Code: CodeQueueFull, Detail: "the queue holds its maximum number of waiting jobs", RetryAfter: time.Second}
		}
		if n := int64(len(d.Input)); q.bytes+n > bytes {
			return &Error{Code: CodeQueueBytesFull, Detail: "the queue holds its maximum bytes of waiting input", RetryAfter: time.Second}
		}
	}
	e.rememberLocked(q, d, now)
	t := newTask(d, now)
	t.span = e.startSpan(d.Trace, SpanQueue, trace.SpanKindConsumer, AttrJob.String(d.JobID), AttrQueue.String(d.Queue),
		AttrNode.String(e.cfg.Node), AttrGeneration.Int64(int64(d.Gen)), AttrPeer.String(d.Ingress))
	e.pushLocked(q, t, d.Front)
	return nil
}

// rememberLocked records (job, gen) for forward idempotency. Entries live
// as long as the job's TTL could, and are swept when the map has doubled.
func (e *Engine) rememberLocked(q *queue, d Delivery, now time.Time) {
	q.seen[d.JobID] = seenJob{gen: d.Gen, expires: now.Add(d.TTL)}
	if len(q.seen) >= 64 && len(q.seen)&(len(q.seen)-1) == 0 {
		for id, s := range q.seen {
			if now.After(s.expires) {
				delete(q.seen, id)
			}
		}
	}
}

// pushLocked puts a task in the pending list (at the front for a job coming
// back from a reject or a lost worker, so it keeps its place) and arms its
// expiry in the queue.
func (e *Engine) pushLocked(q *queue, t *task, front bool) {
	if front {
		// Ahead of every new arrival, and among the jobs that came back,
		// the one with the least TTL left first: a node's death returns
		// many jobs at once, in no particular order, and the job that has
		// waited longest must not queue behind the ones posted after it.
		now, left := time.Now(), t.budget.Remaining(time.Now())
		i := slices.IndexFunc(q.pending, func(p *task) bool { return !p.d.Front || p.budget.Remaining(now) > left })
		if i < 0 {
			i = len(q.pending)
		}
		q.pending = slices.Insert(q.pending, i, t)
	} else {
		q.pending = append(q.pending, t)
	}
	q.bytes += int64(len(t.d.Input))
	q.fair.push(t, time.Now(), e.cfg.Scheduling.PriorityAging)
	if t.d.AffinityKey != "" {
		t.aff.hash = keyHash(t.d.AffinityKey)
	}
	e.setDepthLocked(q)
	left := t.budget.Remaining(time.Now())
	t.timer = time.AfterFunc(max(left, 0), func() { e.expireQueued(q.name, t) })
}

// setDepthLocked publishes the queue's depth.
func (e *Engine) setDepthLocked(q *queue) {
	if q.depth == nil {
		q.depth = e.m.QueueDepth.WithLabelValues(q.name)
	}
	q.depth.Set(float64(len(q.pending)))
}

func (e *Engine) removePendingLocked(q *queue, t *task) bool {
	i := slices.Index(q.pending, t)
	if i < 0 {
		return false
	}
	q.pending = slices.Delete(q.pending, i, i+1)
	q.fair.remove(t)
	e.untargetLocked(q, t)
	q.bytes -= int64(len(t.d.Input))
	stopTimer(t.timer)
	t.endSpan("left the queue", "")
	e.setDepthLocked(q)
	e.idleLocked(q)
	return true
}

// expireQueued fails a job whose TTL ran out while it waited: it is failed
// here, where it was found, and never delivered.
func (e *Engine) expireQueued(name string, t *task) {
	e.mu.Lock()
	defer e.mu.Unlock()
	q := e.queues[name]
	if e.closed || q == nil || !slices.Contains(q.pending, t) {
		return
	}
	t.endSpan("expired", CodeExpired)
	e.removePendingLocked(q, t)
	e.failAtIngressLocked(t.d, CodeExpired, "the job's TTL ran out while it waited in the queue")
}

// dispatchLocked binds as many pending jobs as there are capable consumers
// with free credits. Jobs are considered in the fair queue's order
// (fairqueue.go), but a job nobody can take now does not block the ones
// behind it.
func (e *Engine) dispatchLocked(q *queue) {
	if q == nil || e.closed {
		return
	}
	if q.dispatching {
		q.again = true
		return
	}
	q.dispatching = true
	defer func() { q.dispatching = false }()
	for q.again = true; q.again; {
		q.again = false
		e.dispatchPassLocked(q)
	}
}

func (e *Engine) dispatchPassLocked(q *queue) {
	if e.cluster != nil && !e.cluster.LeaseValid() {
		// Fenced: the cluster may already be running these jobs elsewhere.
		return
	}
	if e.stepDownLocked(q) {
		return
	}
	now := time.Now()
	epoch := e.dispatchEpochLocked(q)
	for {
		t, p, c := e.nextLocked(q)
		if t == nil {
			return
		}
		left := t.budget.Remaining(now)
		if left <= 0 {
			t.endSpan("expired", CodeExpired)
			e.removePendingLocked(q, t)
			e.failAtIngressLocked(t.d, CodeExpired, "the job's TTL ran out while it waited in the queue")
			continue
		}
		w, rc := c.w, c.rc
		q.fair.bind(t)
		e.affinityBoundLocked(q, p, t, c)
		// The next hop (the offer, here or on the consumer's node) is a
		// child of the queue span, which ends bound.
		t.d.Trace = spanContext(t.span, t.d.Trace)
		t.endSpan("bound", "", AttrConsumer.String(consumerOf(w, rc)))
		e.removePendingLocked(q, t)
		// Decrement at dequeue: what the consumer gets is what is left now,
		// queue residence included.
		t.d.TTL = left
		t.budget = Budget{TTL: left, At: now}
		t.d.Epoch = epoch
		q.bound[t.d.JobID] = t
		observe(e.m.QueueStalled, now.Sub(t.arrived).Seconds(), t.d.Trace)
		if rc != nil {
			rc.bound++
			t.remote = rc
			d := t.d
			e.sendLocked(rc.info.Node, Message{Kind: MsgDeliver, JobID: d.JobID, Gen: d.Gen, Queue: d.Queue, Delivery: &d, Consumer: rc.info.ID})
			continue
		}
		t.worker = w
		if t.d.Ingress == e.cfg.Node {
			e.m.LocalDeliveries.Inc()
		}
		e.onOfferedLocked(t.d.JobID, t.d.Gen, w.ID, w.Name)
		e.offerLocked(w, t)
	}
}

// selfZone is this node's zone as the cluster sees it: its catalog record
// once it has one, its configuration before.
func (e *Engine) selfZone() string {
	if e.cluster != nil && e.cluster.Alive(e.cfg.Node) {
		return e.cluster.NodeZone(e.cfg.Node)
	}
	return e.cfg.Zone
}

// zoneOKLocked is the zone test: a zone-scoped job goes only to a node
// labelled with that zone. "No label" is not "same zone".
func (e *Engine) zoneOKLocked(jobZone, nodeZone string) bool { return zoneOK(jobZone, nodeZone) }

func zoneOK(jobZone, nodeZone string) bool { return jobZone == "" || jobZone == nodeZone }

// capableLocked reports whether any consumer anywhere (local sessions, then
// the catalog's view of other serving nodes) could run a job, ignoring
// credits and skipping the consumers in exclude. A draining node's own
// workers take nothing new, so they do not count. A suspected node's
// consumers do (Cluster.Serves): suspicion stops offers, not admission,
// so a job only they can run waits for them instead of being refused.
func (e *Engine) capableLocked(queue string, caps map[string]string, zone string, exclude map[string]bool) bool {
	if q := e.queues[queue]; q != nil && !e.draining && e.zoneOKLocked(zone, e.selfZone()) {
		for _, w := range q.workers {
			if !w.gone && !exclude[w.ID] && w.Capabilities.Satisfies(caps) {
				return true
			}
		}
	}
	if e.cluster == nil {
		return false
	}
	for _, c := range e.cat.Consumers(queue) {
		if c.Node != e.cfg.Node && !exclude[c.ID] && c.Capabilities.Satisfies(caps) &&
			e.zoneOKLocked(zone, e.cluster.NodeZone(c.Node)) && e.cluster.Serves(c.Node) {
			return true
		}
	}
	return false
}

// unbindLocked forgets the bound task (id, gen) on the dispatcher and frees
// the credit it held on a remote consumer.
func (e *Engine) unbindLocked(id string, queueName string, gen uint64) *task {
	q := e.queues[queueName]
	if q == nil {
		return nil
	}
	t := q.bound[id]
	if t == nil || t.d.Gen != gen {
		return nil
	}
	delete(q.bound, id)
	q.fair.unbind(t)
	t.worker = nil
	if t.remote != nil {
		t.remote.bound--
		t.remote = nil
	}
	e.idleLocked(q)
	return t
}

// failAtIngressLocked ends a job from the dispatcher's or host's side: in
// place when the ingress is this node, by a reply carrying the end when it
// is another.
func (e *Engine) failAtIngressLocked(d Delivery, code Code, detail string) {
	if d.Ingress == e.cfg.Node {
		if j := e.jobs[d.JobID]; j != nil && j.gen == d.Gen {
			j.settled = true
			e.finishLocked(j, code, detail, nil)
		}
		return
	}
	e.sendLocked(d.Ingress, Message{Kind: MsgReply, JobID: d.JobID, Gen: d.Gen, Queue: d.Queue, End: &End{Code: code, Detail: detail}})
}

// QueueStat is one queue as this node's dispatcher holds it.
type QueueStat struct {
	Name    string
	Depth   int
	Bytes   int64
	Bound   int
	Workers int
	// Subjects are the subjects with a job waiting or bound here, by
	// subject (fairqueue.go).
	Subjects []SubjectStat
}

// QueueStats returns the queues this node holds, sorted by name.
func (e *Engine) QueueStats() []QueueStat {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]QueueStat, 0, len(e.queues))
	for _, q := range e.queues {
		n := 0
		for _, w := range q.workers {
			if !w.gone {
				n++
			}
		}
		out = append(out, QueueStat{Name: q.name, Depth: len(q.pending), Bytes: q.bytes, Bound: len(q.bound), Workers: n, Subjects: q.fair.stats()})
	}
	slices.SortFunc(out, func(a, b QueueStat) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// endSpan ends the task's queue span, once.
func (t *task) endSpan(result string, code Code, attrs ...attribute.KeyValue) {
	if t.span != nil {
		endSpan(t.span, result, code, attrs...)
		t.span = nil
	}
}

// consumerOf names the consumer a pass bound a job to.
func consumerOf(w *Worker, rc *remoteConsumer) string {
	if w != nil {
		return w.ID
	}
	return rc.info.ID
}
