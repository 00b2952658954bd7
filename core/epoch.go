package core

// This file is dispatch fencing by epoch (docs/cluster.md, "Epochs and
// step-down"). A queue's dispatch record carries an epoch, the catalog
// revision of the write that named its dispatcher, which only grows. So a
// queue can be taken over from a dispatcher that is only suspected (it
// missed a ping) without waiting for its lease, and two dispatchers of one
// queue cannot both keep binding it:
//
//   - a dispatcher stamps its epoch on every delivery it sends;
//   - a consumer host keeps, per queue, the newest epoch it has seen (from
//     deliveries and from its catalog view) and refuses a delivery from
//     another node with an older one: it hands it back to the ingress unrun,
//     which sends the job to the queue's dispatcher under a new generation;
//   - a dispatcher whose record names another node steps down: its waiting
//     jobs go back to their ingresses the same way, and the jobs it bound run
//     on.
//
// None of this is what keeps a job from running twice (generations at the
// ingress and proof of death before a re-run do that); it keeps an old
// dispatcher, woken from a pause, from binding what the new one binds.

// seenEpoch is the newest epoch a node has seen for a queue, and the
// dispatcher it named.
type seenEpoch struct {
	epoch uint64
	node  string
}

// observeEpochLocked records that node dispatches queue under epoch, if it
// is newer than what this node has seen.
func (e *Engine) observeEpochLocked(queue, node string, epoch uint64) {
	if epoch > e.epochs[queue].epoch {
		e.epochs[queue] = seenEpoch{epoch: epoch, node: node}
	}
}

// staleDeliveryLocked reports whether delivery d, from dispatcher from, was
// bound under an epoch older than one this node has seen another node
// dispatch d's queue under: from has been replaced. A delivery without an
// epoch is never stale; one from the node of the newer epoch is not either
// (a dispatcher's own record rewritten, as on a new lease, gets a new
// epoch without a change of hands).
func (e *Engine) staleDeliveryLocked(from string, d Delivery) bool {
	if e.cluster != nil {
		if rec, ok := e.cluster.DispatchRecord(d.Queue); ok {
			e.observeEpochLocked(d.Queue, rec.Dispatcher, rec.Epoch)
		}
	}
	seen := e.epochs[d.Queue]
	if d.Epoch == 0 || d.Epoch >= seen.epoch || seen.node == from {
		e.observeEpochLocked(d.Queue, from, d.Epoch)
		return false
	}
	return true
}

// dispatchEpochLocked is the epoch this node stamps on q's deliveries: its
// dispatch record's, when the record names this node (0 otherwise: no
// record, as with a node alone, or a draining node dispatching its own
// requesters' jobs after handing the queue over).
func (e *Engine) dispatchEpochLocked(q *queue) uint64 {
	if e.cluster == nil {
		return 0
	}
	if rec, ok := e.cluster.DispatchRecord(q.name); ok && rec.Dispatcher == e.cfg.Node {
		return rec.Epoch
	}
	return 0
}

// stepDownLocked ends this node's dispatch of q once its dispatch record
// names another node (a takeover over this node while it was suspected, a
// consumer's node claiming the queue, a relocation): every waiting job goes
// back to its ingress unbound, which sends it to the new dispatcher under
// a new generation; the jobs bound here run on, and their ends and
// releases still come here. It reports whether it stepped down. A node
// that drains is exempt: it handed its queues over itself and dispatches
// its own requesters' jobs to the end (drain.go).
func (e *Engine) stepDownLocked(q *queue) bool {
	if e.cluster == nil || e.drain.started {
		return false
	}
	rec, ok := e.cluster.DispatchRecord(q.name)
	if !ok || rec.Dispatcher == e.cfg.Node {
		return false
	}
	if len(q.pending) == 0 {
		return true
	}
	e.m.StepDowns.Inc()
	e.log.Info("the queue's dispatch moved to another node; handing its waiting jobs back to their ingresses",
		"queue", q.name, "to", rec.Dispatcher, "epoch", rec.Epoch, "jobs", len(q.pending))
	reason := "the queue's dispatch moved to node " + rec.Dispatcher
	for _, t := range append([]*task(nil), q.pending...) {
		t.endSpan("stepped down", "")
		e.removePendingLocked(q, t)
		e.releaseToIngressLocked(t.d, "", false, reason)
	}
	return true
}
