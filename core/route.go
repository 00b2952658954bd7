package core

import (
	"context"
	"time"
)

// This file joins the three roles across nodes. Each role calls the next
// in-process when it is on this node and through Cluster.Send when it is
// not, so the single-node path (ingress, dispatcher and consumer host on
// one node) never touches the network, and the cluster path is the same
// code with a message in the middle.

// sendLocked queues a peer message. With no cluster every role is local
// and nothing may be sent: that would be a routing bug, so it is logged.
func (e *Engine) sendLocked(node string, m Message) {
	if e.cluster == nil || node == e.cfg.Node {
		e.log.Error("bug: peer message with no peer", "kind", m.Kind, "node", node, "job", m.JobID)
		return
	}
	e.cluster.Send(node, m)
}

// goLocked runs f on a goroutine the engine owns: Close cancels its context
// and waits for it. Catalog writes go this way, never under mu.
func (e *Engine) goLocked(f func(ctx context.Context)) {
	if e.closed {
		return
	}
	e.bg.Go(func() { f(e.bgCtx) })
}

// replyLocked sends a worker's answer (m's Accepted, Output or End) for d
// to d's remote ingress. A node whose lease may be gone forwards nothing:
// the cluster may already have handed the job to another worker.
func (e *Engine) replyLocked(w *Worker, d Delivery, m Message) {
	if !e.cluster.LeaseValid() {
		e.m.FencedMessages.Inc()
		return
	}
	m.Kind, m.JobID, m.Gen, m.Queue, m.Consumer, m.WorkerName = MsgReply, d.JobID, d.Gen, d.Queue, w.ID, w.Name
	if b := w.bindings[d.JobID]; b != nil {
		m.TTL = b.t.budget.Remaining(time.Now())
	}
	e.sendLocked(d.Ingress, m)
}

// releaseToIngressLocked hands a binding that ended without an outcome back
// to the job's ingress, which decides whether it runs again.
func (e *Engine) releaseToIngressLocked(d Delivery, consumer string, rejected bool, reason string) {
	if d.Ingress == e.cfg.Node {
		e.releaseAtIngressLocked(d.JobID, d.Gen, consumer, rejected, reason)
		return
	}
	if e.cluster.LeaseValid() {
		e.sendLocked(d.Ingress, Message{Kind: MsgRelease, JobID: d.JobID, Gen: d.Gen, Queue: d.Queue, Consumer: consumer, Rejected: rejected, Reason: reason})
	}
}

// reforwardLocked sends a job back to its queue under a new generation:
// whatever the earlier binding still says is stale from now on. The job
// goes to the queue's dispatcher as the view names it now, which is how a
// job whose dispatcher died is re-forwarded safely.
func (e *Engine) reforwardLocked(j *Job) {
	now := time.Now()
	j.gen++
	// No node holds the job until it is forwarded again: a node death
	// seen meanwhile must not release it a second time.
	j.state, j.consumer, j.worker, j.host, j.dispatcher, j.settled = StateQueued, "", "", "", "", false
	d := e.deliveryLocked(j, now)
	d.Front = true
	if d.TTL <= 0 {
		e.finishLocked(j, CodeExpired, "the job's TTL ran out before it could go back to its queue", nil)
		return
	}
	node := e.cfg.Node
	if e.cluster != nil {
		var ok bool
		if node, ok = e.cluster.CachedDispatcher(j.Queue); !ok {
			e.electAndForwardLocked(j, d)
			return
		}
	}
	e.forwardToLocked(j, node, d)
}

func (e *Engine) forwardToLocked(j *Job, node string, d Delivery) {
	j.dispatcher = node
	if node != e.cfg.Node {
		e.sendLocked(node, Message{Kind: MsgForward, JobID: d.JobID, Gen: d.Gen, Queue: d.Queue, Delivery: &d})
		return
	}
	if err := e.enqueueLocked(d, time.Now()); err != nil {
		e.finishLocked(j, codeOr(err, CodeDispatcherUnavailable), err.Error(), nil)
		return
	}
	e.dispatchLocked(e.queues[d.Queue])
}

// electAndForwardLocked is reforwardLocked for a queue whose record names
// no routable dispatcher: the election writes to the catalog, so it runs
// off the lock, and the job is forwarded when it is decided.
func (e *Engine) electAndForwardLocked(j *Job, d Delivery) {
	e.goLocked(func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, d.TTL)
		defer cancel()
		node, err := e.cluster.Dispatcher(ctx, d.Queue)
		e.mu.Lock()
		defer e.mu.Unlock()
		if j.gen != d.Gen || j.state.Terminal() || e.closed {
			return
		}
		if err != nil {
			e.finishLocked(j, CodeDispatcherUnavailable, "the job could not go back to its queue: no dispatcher could be elected", nil)
			return
		}
		d.TTL = time.Until(j.deadline)
		e.forwardToLocked(j, node, d)
	})
}

// withdrawLocked stops an ended job wherever it is: out of this node's
// queue, off this node's worker, or by a cancel to the node that holds it
// (its consumer host when known, else its dispatcher, which passes the
// cancel on).
func (e *Engine) withdrawLocked(j *Job, code Code) {
	sent := e.cancelHereLocked(j.Queue, j.ID, j.gen, code)
	if j.settled || e.cluster == nil {
		return
	}
	to := ""
	switch {
	case j.host != "" && j.host != e.cfg.Node:
		to = j.host
	case j.host == "" && j.dispatcher != "" && j.dispatcher != e.cfg.Node:
		to = j.dispatcher
	}
	if to != "" && to != sent {
		e.sendLocked(to, Message{Kind: MsgCancel, JobID: j.ID, Gen: j.gen, Queue: j.Queue, Code: code})
	}
}

// cancelHereLocked stops job (id, gen) in whatever role this node holds it:
// a pending job leaves the queue; a job bound to a consumer elsewhere gets
// its cancel passed on; a job on a worker here is cancelled on the worker,
// which keeps its credit until it acknowledges. It returns the node it
// passed the cancel on to, if any.
func (e *Engine) cancelHereLocked(queue, id string, gen uint64, code Code) (sentTo string) {
	if q := e.queues[queue]; q != nil {
		for _, t := range q.pending {
			if t.d.JobID == id {
				e.removePendingLocked(q, t)
				break
			}
		}
		if t := q.bound[id]; t != nil && t.d.Gen == gen && t.remote != nil {
			sentTo = t.remote.info.Node
			e.sendLocked(sentTo, Message{Kind: MsgCancel, JobID: id, Gen: gen, Queue: queue, Code: code})
		}
	}
	if w := e.hosted[id]; w != nil {
		if b := w.bindings[id]; b != nil && b.t.d.Gen == gen {
			e.cancelOnWorkerLocked(w, id, gen, code)
		}
	}
	return sentTo
}

// HandleForward takes a job forwarded by the ingress node from into this
// node's queue. It returns the refusal (*Error) the ingress passes on to
// its caller; a retried forward of a (job, gen) already taken is accepted
// again without a second job.
func (e *Engine) HandleForward(from string, d Delivery) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.draining || e.closed {
		return &Error{Code: CodeDraining, Detail: "the dispatcher is shutting down", RetryAfter: time.Second}
	}
	if d.Ingress != from {
		return &Error{Code: CodeInvalidField, Field: "ingress", Detail: "a job is forwarded by its own ingress node"}
	}
	if err := e.enqueueLocked(d, time.Now()); err != nil {
		return err
	}
	e.dispatchLocked(e.queues[d.Queue])
	return nil
}

// HandleMessage acts on one peer message from node from.
func (e *Engine) HandleMessage(from string, m Message) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return
	}
	switch m.Kind {
	case MsgForward:
		if m.Delivery == nil {
			return
		}
		d := *m.Delivery
		err := error(&Error{Code: CodeDraining, Detail: "the dispatcher is shutting down"})
		if !e.draining && d.Ingress == from {
			if err = e.enqueueLocked(d, time.Now()); err == nil {
				e.dispatchLocked(e.queues[d.Queue])
				return
			}
		}
		e.sendLocked(from, Message{Kind: MsgReply, JobID: d.JobID, Gen: d.Gen, Queue: d.Queue,
			End: &End{Code: codeOr(err, CodeDispatcherUnavailable), Detail: "the job could not go back to its queue: " + err.Error()}})
	case MsgDeliver:
		if m.Delivery != nil {
			e.hostDeliverLocked(from, m)
		}
	case MsgReply:
		e.ingressReplyLocked(from, m)
	case MsgRelease:
		e.unbindLocked(m.JobID, m.Queue, m.Gen)
		e.releaseAtIngressLocked(m.JobID, m.Gen, m.Consumer, m.Rejected, m.Reason)
	case MsgUnbind:
		if e.unbindLocked(m.JobID, m.Queue, m.Gen) != nil {
			e.dispatchLocked(e.queues[m.Queue])
		}
	case MsgCancel:
		e.cancelHereLocked(m.Queue, m.JobID, m.Gen, m.Code)
	default:
		e.m.StaleMessages.WithLabelValues("unknown").Inc()
	}
}

// ingressReplyLocked applies a consumer host's reply to the job it names.
// Any reply implies the accept: a host at the dispatcher's node sends none
// of its own.
func (e *Engine) ingressReplyLocked(from string, m Message) {
	j := e.jobs[m.JobID]
	if j == nil {
		// The job is gone here (it ended and was forgotten, or never
		// started): whoever still runs it must stop.
		if m.End == nil {
			e.sendLocked(from, Message{Kind: MsgCancel, JobID: m.JobID, Gen: m.Gen, Queue: m.Queue, Code: CodeCancelled})
		}
		return
	}
	if m.Gen != j.gen {
		e.m.StaleMessages.WithLabelValues("reply").Inc()
		if m.Gen < j.gen && m.End == nil {
			// A binding the job has moved on from is still running: stop it.
			// The cancel names the old generation, so it cannot touch the
			// current one.
			e.sendLocked(from, Message{Kind: MsgCancel, JobID: m.JobID, Gen: m.Gen, Queue: m.Queue, Code: CodeCancelled})
		}
		return
	}
	if m.Consumer != "" {
		j.host = from
	}
	if m.End != nil {
		// The binding is over on the host: free its credit if this node is
		// also the dispatcher, and send it no cancel when the job ends.
		e.unbindLocked(m.JobID, m.Queue, m.Gen)
		j.settled = true
	}
	if m.Consumer != "" && (j.state == StateQueued || j.state == StateOffered) {
		e.onAcceptedLocked(j.ID, m.Gen, m.Consumer, m.WorkerName)
	}
	if m.Output != nil && e.onOutputLocked(j.ID, m.Gen, m.Output) {
		e.m.StaleMessages.WithLabelValues("output").Inc()
	}
	if m.End != nil {
		e.onEndLocked(j.ID, m.Gen, m.End.Code, m.End.Detail, m.End.Result)
	}
	if q := e.queues[j.Queue]; m.End != nil && q != nil {
		e.dispatchLocked(q)
	}
}

// hostDeliverLocked offers a job a remote dispatcher bound to one of this
// node's workers. A job that cannot be offered (the worker left, has no
// credit, or this node is going away) goes back to its ingress untouched.
func (e *Engine) hostDeliverLocked(from string, m Message) {
	d := *m.Delivery
	t := newTask(d, time.Now())
	t.from = from
	w := e.workers[m.Consumer]
	if old := e.hosted[d.JobID]; old != nil {
		if b := old.bindings[d.JobID]; b != nil {
			if b.t.d.Gen >= d.Gen {
				// A late delivery from a dispatcher the job has moved on
				// from: the binding here is newer.
				e.m.StaleMessages.WithLabelValues("deliver").Inc()
				if from != d.Ingress {
					e.sendLocked(from, Message{Kind: MsgUnbind, JobID: d.JobID, Gen: d.Gen, Queue: d.Queue, Consumer: m.Consumer})
				}
				return
			}
			// An older binding of the job is still here: stop it, and hand
			// the new one back until it has gone (one job id, one binding).
			e.cancelOnWorkerLocked(old, d.JobID, b.t.d.Gen, CodeCancelled)
			w = nil
		}
	}
	switch {
	case d.TTL <= 0:
		e.failAtIngressLocked(d, CodeExpired, "the job's TTL ran out before it reached its worker")
	case w == nil && e.hosted[d.JobID] != nil:
		e.releaseToIngressLocked(d, m.Consumer, false, "an earlier binding of the job is still ending on this node")
	case w == nil || w.gone:
		// The consumer is gone: it must not be offered the job again.
		e.releaseToIngressLocked(d, m.Consumer, true, "the consumer left before the job reached it")
	case !e.zoneOKLocked(d.Zone, e.selfZone()):
		// The stream's zone test at the receiving end: a delivery sent
		// before the sender saw this node's zone label change.
		e.releaseToIngressLocked(d, m.Consumer, true, "the job is scoped to zone "+d.Zone+", this node is not in it")
	case e.draining || !e.cluster.LeaseValid() || len(w.bindings) >= w.Concurrency:
		e.releaseToIngressLocked(d, m.Consumer, false, "the consumer's node could not offer the job")
	default:
		e.offerLocked(w, t)
		return
	}
	// A fenced node sends no unbind either: the dispatcher keeps the
	// binding, and hands the job back when this node's records are gone.
	if from != d.Ingress && e.cluster.LeaseValid() {
		e.sendLocked(from, Message{Kind: MsgUnbind, JobID: d.JobID, Gen: d.Gen, Queue: d.Queue, Consumer: m.Consumer})
	}
}

// ClusterChanged re-reads the catalog view after it changed. Proven deaths
// (a node's record gone with its lease, a consumer's record withdrawn) end
// or return the jobs they held; new consumers may take pending jobs; and
// dispatchers check whether their queue should move (relocation).
func (e *Engine) ClusterChanged() {
	if e.cluster == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return
	}
	e.nodesGoneLocked()
	e.zonesChangedLocked()
	for _, q := range e.queues {
		e.consumersGoneLocked(q)
		e.dispatchLocked(q)
		e.pinCheckLocked(q)
		e.claimOrphansLocked(q)
	}
}

// nodesGoneLocked acts on nodes whose catalog record is gone: their lease
// expired or was revoked, so they have fenced themselves and run nothing.
//   - As ingress: a job held by a dead node (its consumer host, or its
//     dispatcher while no host is known) returns to its queue if it
//     produced no output and fails worker_lost otherwise.
//   - As consumer host: a job whose ingress is dead has no requester left
//     and is cancelled on its worker.
//   - As dispatcher: a pending job whose ingress is dead is dropped.
func (e *Engine) nodesGoneLocked() {
	dead := map[string]bool{}
	gone := func(node string) bool {
		if node == "" || node == e.cfg.Node {
			return false
		}
		if v, ok := dead[node]; ok {
			return v
		}
		dead[node] = e.cluster.Gone(node)
		return dead[node]
	}
	for _, j := range e.jobs {
		if j.state.Terminal() {
			continue
		}
		holder := j.host
		if holder == "" {
			holder = j.dispatcher
		}
		if gone(holder) {
			e.releaseAtIngressLocked(j.ID, j.gen, "", false, "node "+holder+" is gone")
		}
	}
	for id, w := range e.hosted {
		if b := w.bindings[id]; b != nil && gone(b.t.d.Ingress) {
			e.cancelOnWorkerLocked(w, id, b.t.d.Gen, CodeCancelled)
		}
	}
	for _, q := range e.queues {
		for _, t := range append([]*task(nil), q.pending...) {
			if gone(t.d.Ingress) {
				e.removePendingLocked(q, t)
			}
		}
	}
}

// zonesChangedLocked applies the zone test again to zone-scoped jobs bound
// on other nodes, after a node's zone label changed in the catalog: a
// binding on a node that is no longer in the job's zone is stopped there
// and the job re-routed (run again in its zone if it produced no output,
// else failed worker_lost). The ingress judges the jobs whose host it
// knows; a dispatcher, the jobs it bound to remote consumers.
func (e *Engine) zonesChangedLocked() {
	outOfZone := func(zone, node string) bool {
		return zone != "" && node != "" && node != e.cfg.Node && e.cluster.Alive(node) && e.cluster.NodeZone(node) != zone
	}
	for _, j := range e.jobs {
		// Only where the job runs matters (a dispatcher's own zone does
		// not): the host, once a reply or its reply leg named it.
		if j.state.Terminal() || !outOfZone(j.Env.Zone, j.host) {
			continue
		}
		host := j.host
		e.sendLocked(host, Message{Kind: MsgCancel, JobID: j.ID, Gen: j.gen, Queue: j.Queue, Code: CodeCancelled})
		e.releaseAtIngressLocked(j.ID, j.gen, "", false, "node "+host+" left the job's zone "+j.Env.Zone)
	}
	for _, q := range e.queues {
		for id, t := range q.bound {
			if t.remote == nil || !outOfZone(t.d.Zone, t.remote.info.Node) {
				continue
			}
			node := t.remote.info.Node
			e.sendLocked(node, Message{Kind: MsgCancel, JobID: id, Gen: t.d.Gen, Queue: q.name, Code: CodeCancelled})
			e.unbindLocked(id, q.name, t.d.Gen)
			e.releaseToIngressLocked(t.d, "", false, "node "+node+" left the job's zone "+t.d.Zone)
		}
	}
}

// consumersGoneLocked returns the jobs bound to remote consumers whose
// registration is gone: the death the at-most-once rule accepts as proof.
func (e *Engine) consumersGoneLocked(q *queue) {
	if len(q.remote) == 0 {
		return
	}
	live := map[string]bool{}
	for _, c := range e.cat.Consumers(q.name) {
		live[c.ID] = true
	}
	for id, t := range q.bound {
		if t.remote == nil || live[t.remote.info.ID] {
			continue
		}
		consumer := t.remote.info.ID
		e.unbindLocked(id, q.name, t.d.Gen)
		e.releaseToIngressLocked(t.d, consumer, false, "the consumer's registration is gone")
	}
	for id, rc := range q.remote {
		if !live[id] && rc.bound == 0 {
			delete(q.remote, id)
		}
	}
}

// pinCheckLocked moves a queue's dispatch to its consumers' node when this
// node dispatches it but hosts none of its consumers, every consumer lives
// on one other node and has for PinStable, and no job is waiting or bound
// here. Two consumers on two nodes leave the dispatcher where it is:
// affinity is an optimisation, never a constraint.
func (e *Engine) pinCheckLocked(q *queue) {
	if e.cluster == nil || e.closed {
		return
	}
	target := ""
	if node, ok := e.cluster.CachedDispatcher(q.name); ok && node == e.cfg.Node && len(q.workers) == 0 {
		for _, c := range e.cat.Consumers(q.name) {
			if c.Node == e.cfg.Node || target != "" && c.Node != target {
				target = ""
				break
			}
			target = c.Node
		}
	}
	if target == "" || !e.cluster.Routable(target) {
		q.pinTo = ""
		stopTimer(q.pinTimer)
		return
	}
	now := time.Now()
	if q.pinTo != target {
		q.pinTo, q.pinSince = target, now
	}
	if wait := q.pinSince.Add(e.cfg.PinStable).Sub(now); wait > 0 {
		stopTimer(q.pinTimer)
		q.pinTimer = time.AfterFunc(wait, func() {
			e.mu.Lock()
			defer e.mu.Unlock()
			if e.queues[q.name] == q {
				e.pinCheckLocked(q)
			}
		})
		return
	}
	if len(q.pending) > 0 || len(q.bound) > 0 {
		// Never while jobs are here: idleLocked checks again when the
		// queue empties.
		return
	}
	q.pinTo = ""
	name := q.name
	e.m.Relocations.Inc()
	e.log.Info("handing the queue's dispatch to its consumers' node", "queue", name, "to", target)
	e.goLocked(func(ctx context.Context) {
		if err := e.cluster.ReleaseQueue(ctx, name); err != nil {
			e.log.Warn("release dispatch record for relocation", "queue", name, "err", err)
		}
	})
}

// claimOrphansLocked re-elects the queues this node hosts consumers of
// whose record names no routable dispatcher (its node died, or handed the
// queue over): a consumer's node claims it.
func (e *Engine) claimOrphansLocked(q *queue) {
	if len(q.workers) == 0 {
		return
	}
	if _, ok := e.cluster.CachedDispatcher(q.name); ok || q.claiming {
		return
	}
	q.claiming = true
	name := q.name
	e.goLocked(func(ctx context.Context) {
		if err := e.cluster.ClaimConsumer(ctx, name); err != nil {
			e.log.Warn("claim orphaned queue", "queue", name, "err", err)
		}
		e.mu.Lock()
		q.claiming = false
		e.mu.Unlock()
	})
}

// ReasonZone is the reason Undeliverable is given for a zone-scoped
// delivery the transport would not send: its node is not in the job's zone
// (any more). The job is routed again, not failed.
const ReasonZone = "zone"

// Undeliverable is the transport reporting that m could not be sent to
// node at all: larger than the peer message limit, or not encodable. That
// is the job's fault, not the link's, so the job fails too_large where it
// is decided, rather than wait for a route that cannot carry it. A
// delivery refused for ReasonZone goes back to its ingress to be routed
// again.
func (e *Engine) Undeliverable(node string, m Message, reason string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return
	}
	e.log.Warn("peer message undeliverable", "kind", m.Kind, "node", node, "job", m.JobID, "reason", reason)
	detail := "a message of the job could not be sent between nodes: " + reason
	switch m.Kind {
	case MsgForward:
		if j := e.jobs[m.JobID]; j != nil && j.gen == m.Gen {
			j.settled = true
			e.finishLocked(j, CodeTooLarge, detail, nil)
		}
	case MsgDeliver:
		if t := e.unbindLocked(m.JobID, m.Queue, m.Gen); t != nil {
			if reason == ReasonZone {
				// Not the job's fault: the node left its zone. Route it again.
				e.releaseToIngressLocked(t.d, m.Consumer, true, "node "+node+" is not in the job's zone "+t.d.Zone)
			} else {
				e.failAtIngressLocked(t.d, CodeTooLarge, detail)
			}
			e.dispatchLocked(e.queues[m.Queue])
		}
	case MsgReply:
		// The host could not carry an output (or the end) to the ingress:
		// stop the worker and tell the ingress in a message that fits.
		if w := e.hosted[m.JobID]; w != nil {
			if b := w.bindings[m.JobID]; b != nil && b.t.d.Gen == m.Gen {
				e.cancelOnWorkerLocked(w, m.JobID, m.Gen, CodeTooLarge)
			}
		}
		if m.Output != nil || m.End != nil && m.End.Result != nil {
			e.sendLocked(node, Message{Kind: MsgReply, JobID: m.JobID, Gen: m.Gen, Queue: m.Queue, Consumer: m.Consumer, WorkerName: m.WorkerName,
				End: &End{Code: CodeTooLarge, Detail: detail}})
		}
	}
}

// ReplyLegOpened is the transport reporting that host opened the reply leg
// of job (id, gen): the job runs there. The ingress records it, so a cancel
// goes straight to the host and the zone test knows where to look.
func (e *Engine) ReplyLegOpened(host, id string, gen uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if j := e.jobs[id]; j != nil && j.gen == gen && !j.state.Terminal() && host != e.cfg.Node {
		j.host = host
	}
}

// ReplyLegSilent is the transport reporting that the reply stream of job
// (id, gen) from host went silent: no frame and no heartbeat for several
// heartbeat intervals, without the connection closing. Silence is not proof
// of death (only the catalog gives that), so the job is not run again: it
// fails worker_lost, and the host is told to stop it should it come back.
func (e *Engine) ReplyLegSilent(host, id string, gen uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	j := e.jobs[id]
	if e.closed || j == nil || j.gen != gen || j.state.Terminal() {
		return
	}
	e.finishLocked(j, CodeWorkerLost, "the consumer host "+host+" went silent (no heartbeat on the job's reply stream)", nil)
}

// codeOr returns err's code, or def when err is not an *Error.
func codeOr(err error, def Code) Code {
	if c, ok := CodeOf(err); ok {
		return c
	}
	return def
}
