package core

import (
	"log/slog"
	"time"
)

// This file is the outbound glue between the roles (ingress, dispatcher,
// consumer host): each role calls the next in-process when it is on this
// node and through Transport.Send (transport.go) when it is not, so the
// single-node path never touches the network, and the cluster path is the
// same code with a message in the middle. membership.go and relocate.go
// react to the catalog.

// sendLocked queues a peer message. With no cluster every role is local
// and nothing may be sent: that would be a routing bug, so it is logged.
func (e *Engine) sendLocked(node string, m Message) {
	if e.transport == nil || node == e.cfg.Node {
		e.logJob(e.traceOfLocked(m), slog.LevelError, "bug: peer message with no peer", "kind", m.Kind, "node", node, "job", m.JobID)
		return
	}
	e.transport.Send(node, m)
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
// to the job's ingress, which decides whether it runs again. The binding
// is over on its worker: the worker refused it, its session ended, or this
// node stopped it there (releaseRunningToIngressLocked is for a binding
// that may still run).
func (e *Engine) releaseToIngressLocked(d Delivery, consumer string, rejected bool, reason string) {
	if d.Ingress == e.cfg.Node {
		e.releaseAtIngressLocked(d.JobID, d.Gen, consumer, rejected, lostStopped, reason)
		return
	}
	if e.cluster.LeaseValid() {
		e.sendLocked(d.Ingress, Message{Kind: MsgRelease, JobID: d.JobID, Gen: d.Gen, Queue: d.Queue, Consumer: consumer, Rejected: rejected, Reason: reason})
	}
}

// releaseRunningToIngressLocked is releaseToIngressLocked for a binding
// this dispatcher let go of while its worker, on another node, may still
// run it (that node was only sent a cancel): the ingress runs it again
// only if it produced no output, never restarts it.
func (e *Engine) releaseRunningToIngressLocked(d Delivery, reason string) {
	if d.Ingress == e.cfg.Node {
		e.releaseAtIngressLocked(d.JobID, d.Gen, "", false, lostRunning, reason)
		return
	}
	if e.cluster.LeaseValid() {
		e.sendLocked(d.Ingress, Message{Kind: MsgRelease, JobID: d.JobID, Gen: d.Gen, Queue: d.Queue, Running: true, Reason: reason})
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
	// The new binding's credit starts from its window again.
	window, sent := j.pace.window, j.pace.sent
	e.paceEndedLocked(j)
	j.pace = newPace(window, sent)
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
			if !e.drain.started {
				e.awaitDispatcherLocked(j)
				return
			}
			// A draining node claims no queue: it dispatches its own
			// requester's job itself, to a consumer on another node.
			node = e.cfg.Node
		}
	}
	e.forwardToLocked(j, node, d)
}

func (e *Engine) forwardToLocked(j *Job, node string, d Delivery) {
	j.dispatcher = node
	if j.await != nil {
		endSpan(j.await, "found", "", AttrPeer.String(node))
		j.await = nil
	}
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

// codeOr returns err's code, or def when err is not an *Error.
func codeOr(err error, def Code) Code {
	if c, ok := CodeOf(err); ok {
		return c
	}
	return def
}
