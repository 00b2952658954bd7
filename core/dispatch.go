package core

import (
	"encoding/json"
	"slices"
	"strings"
	"time"
)

// This file is the dispatcher role: a queue's pending jobs (the only copy),
// TTL decremented at dequeue, and the binding of each job to one consumer.

// Delivery is a job as it travels from ingress to dispatcher to consumer
// host. TTL is what the sender measured as remaining when it sent it.
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
}

// queue is one queue on its dispatcher.
type queue struct {
	name    string
	pending []*task
	bytes   int64
	bound   map[string]*task
	workers []*Worker
	// dispatching and again make dispatchLocked safe to re-enter: dropping a
	// worker mid-pass (a failed send) dispatches again from inside the pass.
	dispatching, again bool
	// reap removes the queue once it has been empty for QueueIdle.
	reap *time.Timer
}

// task is a pending or bound job on the dispatcher.
type task struct {
	d        Delivery
	budget   Budget
	timer    *time.Timer
	rejected map[string]bool
	worker   *Worker
}

func (e *Engine) queueLocked(name string) *queue {
	q := e.queues[name]
	if q == nil {
		q = &queue{name: name, bound: map[string]*task{}}
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
}

func (e *Engine) reapQueue(q *queue) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed || e.queues[q.name] != q || len(q.pending) > 0 || len(q.bound) > 0 || len(q.workers) > 0 {
		return
	}
	delete(e.queues, q.name)
	e.m.QueueDepth.DeleteLabelValues(q.name)
	e.log.Debug("queue reaped", "queue", q.name)
}

// enqueueLocked takes a delivery into a queue, or refuses it synchronously
// when the queue is over depth or bytes. The time it spends queued counts
// against its TTL: the budget starts now, on this node's clock.
func (e *Engine) enqueueLocked(d Delivery, now time.Time, eff Effective) error {
	if d.TTL <= 0 {
		return &Error{Code: CodeExpired, Detail: "the job's TTL ran out before it reached the dispatcher"}
	}
	q := e.queueLocked(d.Queue)
	if len(q.pending)+1 > eff.MaxQueueDepth {
		return &Error{Code: CodeQueueFull, Detail: "the queue holds its maximum number of waiting jobs", RetryAfter: time.Second}
	}
	if n := int64(len(d.Input)); q.bytes+n > eff.MaxQueueBytes {
		return &Error{Code: CodeQueueBytesFull, Detail: "the queue holds its maximum bytes of waiting input", RetryAfter: time.Second}
	}
	t := &task{d: d, budget: Budget{TTL: d.TTL, At: now}}
	e.pushLocked(q, t, false)
	return nil
}

// pushLocked puts a task in the pending list (at the front for a job coming
// back from a reject or a lost worker, so it keeps its place) and arms its
// expiry in the queue.
func (e *Engine) pushLocked(q *queue, t *task, front bool) {
	if front {
		q.pending = slices.Insert(q.pending, 0, t)
	} else {
		q.pending = append(q.pending, t)
	}
	q.bytes += int64(len(t.d.Input))
	e.m.QueueDepth.WithLabelValues(q.name).Set(float64(len(q.pending)))
	left := t.budget.Remaining(time.Now())
	t.timer = time.AfterFunc(max(left, 0), func() { e.expireQueued(q.name, t) })
}

func (e *Engine) removePendingLocked(q *queue, t *task) bool {
	i := slices.Index(q.pending, t)
	if i < 0 {
		return false
	}
	q.pending = slices.Delete(q.pending, i, i+1)
	q.bytes -= int64(len(t.d.Input))
	stopTimer(t.timer)
	e.m.QueueDepth.WithLabelValues(q.name).Set(float64(len(q.pending)))
	e.idleLocked(q)
	return true
}

// expireQueued fails a job whose TTL ran out while it waited: it is failed
// here, where it was found, and never delivered.
func (e *Engine) expireQueued(name string, t *task) {
	e.mu.Lock()
	defer e.mu.Unlock()
	q := e.queues[name]
	if e.closed || q == nil || !e.removePendingLocked(q, t) {
		return
	}
	e.failAtIngressLocked(t.d, CodeExpired, "the job's TTL ran out while it waited in the queue")
}

// dispatchLocked binds as many pending jobs as there are capable consumers
// with free credits. Jobs are considered in order, but a job nobody can take
// now does not block the ones behind it.
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
	now := time.Now()
	for i := 0; i < len(q.pending); {
		t := q.pending[i]
		left := t.budget.Remaining(now)
		if left <= 0 {
			e.removePendingLocked(q, t)
			e.failAtIngressLocked(t.d, CodeExpired, "the job's TTL ran out while it waited in the queue")
			continue
		}
		w := e.pickLocked(q, t)
		if w == nil {
			i++
			continue
		}
		e.removePendingLocked(q, t)
		// Decrement at dequeue: what the consumer gets is what is left now,
		// queue residence included.
		t.d.TTL = left
		t.budget = Budget{TTL: left, At: now}
		t.d.Gen++
		t.worker = w
		q.bound[t.d.JobID] = t
		if t.d.Ingress == e.cfg.Node {
			e.m.LocalDeliveries.Inc()
		}
		e.onOfferedLocked(t.d.JobID, t.d.Gen, w.ID, w.Name)
		e.offerLocked(w, t)
	}
}

// pickLocked chooses a consumer for t: a capable worker with a free credit
// that has not refused this job, the least loaded first. Local workers are
// the only kind a single node has; remote consumers join here in a cluster.
func (e *Engine) pickLocked(q *queue, t *task) *Worker {
	var best *Worker
	for _, w := range q.workers {
		if w.gone || len(w.bindings) >= w.Concurrency || t.rejected[w.ID] ||
			!w.Capabilities.Satisfies(t.d.Capabilities) || !e.zoneOKLocked(t.d.Zone, e.cfg.Zone) {
			continue
		}
		if best == nil || len(w.bindings) < len(best.bindings) {
			best = w
		}
	}
	return best
}

// zoneOKLocked is the zone test: a zone-scoped job goes only to a node
// labelled with that zone. "No label" is not "same zone".
func (e *Engine) zoneOKLocked(jobZone, nodeZone string) bool {
	return jobZone == "" || jobZone == nodeZone
}

// capableLocked reports whether any consumer anywhere (local sessions, then
// the catalog's view of other nodes) could run a job, ignoring credits and
// skipping the consumers in exclude.
func (e *Engine) capableLocked(queue string, caps map[string]string, zone string, exclude map[string]bool) bool {
	if q := e.queues[queue]; q != nil {
		for _, w := range q.workers {
			if !w.gone && !exclude[w.ID] && w.Capabilities.Satisfies(caps) && e.zoneOKLocked(zone, e.cfg.Zone) {
				return true
			}
		}
	}
	// Consumers on other nodes count only once this engine can route a job
	// to them. Until then (no peer transport yet: docs/cluster.md) counting
	// them would accept a job that can only wait in a queue with no worker
	// until it expires — the "job that waits to die" the capability check
	// exists to prevent.
	if e.cat == nil || !e.routesRemote {
		return false
	}
	for _, c := range e.cat.Consumers(queue) {
		if c.Node != e.cfg.Node && !exclude[c.ID] && c.Capabilities.Satisfies(caps) && e.zoneOKLocked(zone, c.Zone) {
			return true
		}
	}
	return false
}

// unbindLocked forgets a bound task on the dispatcher.
func (e *Engine) unbindLocked(id string, queueName string) *task {
	q := e.queues[queueName]
	if q == nil {
		return nil
	}
	t := q.bound[id]
	delete(q.bound, id)
	if t != nil {
		t.worker = nil
	}
	e.idleLocked(q)
	return t
}

// rejectedLocked: a worker refused t. The binding is cleared at once and the
// job is offered to a different consumer, never back to this one; with no
// other capable consumer left it fails as rejected.
func (e *Engine) rejectedLocked(t *task, by *Worker, reason string) {
	e.m.Rejects.Inc()
	if t.rejected == nil {
		t.rejected = map[string]bool{}
	}
	t.rejected[by.ID] = true
	if !e.reclaimLocked(t.d.JobID, t.d.Gen) {
		return
	}
	if !e.capableLocked(t.d.Queue, t.d.Capabilities, t.d.Zone, t.rejected) {
		e.failAtIngressLocked(t.d, CodeRejected, "every capable worker refused the job; last reason: "+reason)
		return
	}
	t.budget = Budget{TTL: t.budget.Remaining(time.Now()), At: time.Now()}
	q := e.queueLocked(t.d.Queue)
	e.pushLocked(q, t, true)
	e.dispatchLocked(q)
}

// lostLocked: t's worker is gone (disconnected or dropped as stalled). The
// job runs again only if the ingress says it produced no output.
func (e *Engine) lostLocked(t *task) {
	if !e.reclaimLocked(t.d.JobID, t.d.Gen) {
		return
	}
	e.m.Reclaims.Inc()
	t.budget = Budget{TTL: t.budget.Remaining(time.Now()), At: time.Now()}
	e.pushLocked(e.queueLocked(t.d.Queue), t, true)
}

// withdrawLocked takes an ended job out of the dispatcher: out of the queue
// if it waited, or off its worker (which is told to stop) if it was bound.
func (e *Engine) withdrawLocked(j *Job, code Code) {
	q := e.queues[j.Queue]
	if q == nil {
		return
	}
	for _, t := range q.pending {
		if t.d.JobID == j.ID {
			e.removePendingLocked(q, t)
			return
		}
	}
	if t := q.bound[j.ID]; t != nil && t.worker != nil {
		e.cancelOnWorkerLocked(t.worker, t.d.JobID, t.d.Gen, code)
	}
}

// failAtIngressLocked ends a job from the dispatcher's side.
func (e *Engine) failAtIngressLocked(d Delivery, code Code, detail string) {
	if j := e.jobs[d.JobID]; j != nil {
		e.finishLocked(j, code, detail, nil)
	}
}

// QueueStat is one queue as this node's dispatcher holds it.
type QueueStat struct {
	Name    string
	Depth   int
	Bytes   int64
	Bound   int
	Workers int
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
		out = append(out, QueueStat{Name: q.name, Depth: len(q.pending), Bytes: q.bytes, Bound: len(q.bound), Workers: n})
	}
	slices.SortFunc(out, func(a, b QueueStat) int { return strings.Compare(a.Name, b.Name) })
	return out
}
