package core

import (
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// This file is the engine's Receiver (transport.go): what other nodes send,
// handed over by the transport, applied in whichever role this node holds
// the job.

// HandleForward takes a job forwarded by the ingress node from into this
// node's queue. It returns the refusal (*Error) the ingress passes on to
// its caller; a retried forward of a (job, gen) already taken is accepted
// again without a second job. A draining dispatcher takes it too, and
// hands it back if no consumer on another node takes it at once (drain.go).
func (e *Engine) HandleForward(from string, d Delivery) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.takesForwardsLocked() {
		return &Error{Code: CodeDraining, Detail: "the dispatcher is shutting down", RetryAfter: time.Second}
	}
	if d.Ingress != from {
		return &Error{Code: CodeInvalidField, Field: "ingress", Detail: "a job is forwarded by its own ingress node"}
	}
	if err := e.enqueueLocked(d, time.Now()); err != nil {
		return err
	}
	e.dispatchLocked(e.queues[d.Queue])
	e.handBackLocked(e.queues[d.Queue])
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
		switch {
		case d.Ingress != from:
			// Not its ingress's forward: answered with the refusal below.
		case e.takesForwardsLocked():
			if err = e.enqueueLocked(d, time.Now()); err == nil {
				e.dispatchLocked(e.queues[d.Queue])
				e.handBackLocked(e.queues[d.Queue])
				return
			}
		case e.drain.resigned:
			// Closing after a drain: the job never reached a worker here, so
			// it goes back to its ingress to be routed again, not failed.
			e.releaseToIngressLocked(d, "", false, "the dispatcher is shutting down")
			return
		case e.drain.started:
			// Closing, with records that may still name this node: a job
			// handed back would come back. Its ingress routes it again
			// once this node's record is gone (proven death).
			return
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
		how := lostStopped
		if m.Running {
			how = lostRunning
		}
		e.releaseAtIngressLocked(m.JobID, m.Gen, m.Consumer, m.Rejected, how, m.Reason)
	case MsgUnbind:
		if e.unbindLocked(m.JobID, m.Queue, m.Gen) != nil {
			e.dispatchLocked(e.queues[m.Queue])
		}
	case MsgCancel:
		e.cancelHereLocked(m.Queue, m.JobID, m.Gen, m.Code)
	case MsgGrant:
		e.hostGrantLocked(m)
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
	case e.staleDeliveryLocked(from, d):
		// Bound by a dispatcher that has been replaced (epoch.go): the
		// new one may bind this worker's credits too. Handed back unrun,
		// the job goes to the new dispatcher under a new generation.
		e.m.StaleEpoch.Inc()
		e.releaseToIngressLocked(d, m.Consumer, false, "the job was bound by a dispatcher that has been replaced (stale epoch)")
	case w == nil && e.hosted[d.JobID] != nil:
		e.releaseToIngressLocked(d, m.Consumer, false, "an earlier binding of the job is still ending on this node")
	case w == nil || w.gone:
		// The consumer left: that is no refusal (the job may wait for a
		// capable worker within its TTL), and a consumer that comes back
		// is a new one, so nothing needs excluding.
		e.releaseToIngressLocked(d, m.Consumer, false, "the consumer left before the job reached it")
	case !e.zoneOKLocked(d.Zone, e.selfZone()):
		// The stream's zone test at the receiving end: a delivery sent
		// before the sender saw this node's zone label change.
		e.releaseToIngressLocked(d, m.Consumer, true, "the job is scoped to zone "+d.Zone+", this node is not in it")
	case e.silent[d.Ingress]:
		// Nobody may be reading it: the ingress decides when it answers.
		e.releaseToIngressLocked(d, m.Consumer, false, "the job's ingress node is silent")
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
	e.logJob(e.traceOfLocked(m), slog.LevelWarn, "peer message undeliverable", "kind", m.Kind, "node", node, "job", m.JobID, "reason", reason)
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

// ResponseLegOpened is the transport reporting that host opened the
// response leg of job (id, gen): the job runs there. The ingress records it, so a cancel
// goes straight to the host and the zone test knows where to look.
func (e *Engine) ResponseLegOpened(host, id string, gen uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if j := e.jobs[id]; j != nil && j.gen == gen && !j.state.Terminal() && host != e.cfg.Node {
		j.host = host
	}
}

// traceOfLocked is the trace of the job m is about, as far as this node
// knows it: its delivery's, the ingress's record, or the binding's here.
func (e *Engine) traceOfLocked(m Message) trace.SpanContext {
	switch {
	case m.Delivery != nil:
		return m.Delivery.Trace
	case e.jobs[m.JobID] != nil:
		return e.jobs[m.JobID].trace
	case e.hosted[m.JobID] != nil && e.hosted[m.JobID].bindings[m.JobID] != nil:
		return e.hosted[m.JobID].bindings[m.JobID].t.d.Trace
	}
	return trace.SpanContext{}
}
