package core

import (
	"context"
	"slices"
)

// This file is the graceful drain: what a node does between SIGTERM and
// closing, so that leaving the cluster costs no job (docs/cluster.md,
// "Leaving the cluster"). In order:
//
//  1. It takes no new job (Submit and AttachWorker refuse with draining) and
//     offers its workers nothing new. It claims no queue from then on.
//  2. It resigns (Cluster.Resign): each queue it dispatches is handed to a
//     node that hosts consumers of it, and its node record says draining,
//     so no node routes anything new to it and its consumers stop counting
//     for the capability check.
//  3. It hands back the jobs waiting in its queues for other nodes'
//     requesters: none reached a worker, so their ingress forwards them
//     again, under a new generation, to the queue's dispatcher now. A
//     forward that still reaches it (from a view that has not caught up)
//     is taken, dispatched if a consumer on another node is free, and
//     otherwise handed back the same way: never refused. Its own
//     requesters' jobs it keeps, and dispatches them to consumers on other
//     nodes.
//  4. It waits until its requesters' jobs have ended and its workers hold
//     no job, or until the drain's deadline. Worker sessions, response
//     legs and the peer server stay up meanwhile: they are what those
//     jobs need.
//  5. Past the deadline its requesters' jobs end node_shutdown, and a job
//     its worker still runs for another node's requester is stopped on the
//     worker and released to its ingress, as a lost worker's would be.
//
// Then the node closes (switchyard.Node.Close): its transport first
// delivers what the drain sent, then the servers stop and its lease is
// revoked.

// drainState is the graceful drain's progress, guarded by Engine.mu. A
// fence also stops the node taking jobs (draining), but is no drain: a
// fenced node dispatches nothing and refuses forwards.
type drainState struct {
	// started: Drain was called. resigned: Cluster.Resign succeeded; from
	// then on jobs of other nodes' requesters are handed back, not kept.
	// over: Drain returned; forwards are refused, the node is closing.
	started, resigned, over bool
}

// Drain leaves the cluster gracefully (the steps are listed above). It
// returns once this node holds no open job, or once ctx is done; then it
// ends what is still open and returns how many jobs it had to end. It is
// called once, before Close.
func (e *Engine) Drain(ctx context.Context) int {
	e.mu.Lock()
	e.stopTakingLocked()
	e.drain.started = true
	e.mu.Unlock()
	resigned := true
	if e.cluster != nil {
		if err := e.cluster.Resign(ctx); err != nil {
			// Its records may still route jobs here: handing them back
			// would only bring them back. It keeps them and dispatches them
			// to consumers on other nodes; what is left when it closes goes
			// with its lease, and its peers route it again (proven death).
			e.log.Warn("resign: not every queue was handed over; keeping what reaches this node", "err", err)
			resigned = false
		}
	}
	e.mu.Lock()
	e.drain.resigned = resigned
	for _, q := range e.queues {
		e.handBackLocked(q)
		// Its own requesters' waiting jobs, to consumers on other nodes.
		e.dispatchLocked(q)
	}
	e.mu.Unlock()

	quiet := true
	select {
	case <-e.drained:
	case <-ctx.Done():
		quiet = false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.drain.over = true
	for _, q := range e.queues {
		e.handBackLocked(q)
	}
	if quiet {
		return 0
	}
	return e.endOpenLocked()
}

// quietLocked closes drained once the node is draining and holds no open
// job: none of its requesters' (active) and none on its workers (hosted)
// but those being cancelled, whose outcome is decided and whose worker
// has been told to stop.
func (e *Engine) quietLocked() {
	if !e.draining || e.active.Load() > 0 {
		return
	}
	for id, w := range e.hosted {
		if b := w.bindings[id]; b != nil && !b.cancelling {
			return
		}
	}
	select {
	case <-e.drained:
	default:
		close(e.drained)
	}
}

// takesForwardsLocked reports whether the dispatcher takes a forwarded job:
// while it runs, and while it drains, until the drain is over. A fenced
// node takes none: it may not dispatch.
func (e *Engine) takesForwardsLocked() bool {
	return !e.closed && (!e.draining || e.drain.started && !e.drain.over)
}

// handBackLocked returns q's waiting jobs of other nodes' requesters to
// their ingress, once this node has resigned. None has reached a worker
// (a waiting job was never offered under its generation), so its ingress
// forwards it again, under a new generation, to the queue's dispatcher as
// it names it then: at-most-once holds.
func (e *Engine) handBackLocked(q *queue) {
	if !e.drain.resigned || q == nil {
		return
	}
	for _, t := range slices.Clone(q.pending) {
		if t.d.Ingress == e.cfg.Node {
			continue
		}
		e.removePendingLocked(q, t)
		e.releaseToIngressLocked(t.d, "", false, "the queue's dispatcher is shutting down and handed the queue over")
	}
}

// endOpenLocked ends what the drain's deadline left open: this node's
// requesters' jobs with node_shutdown (a job running here is cancelled on
// its worker by that), then the jobs its workers still run for other
// nodes' requesters: each is stopped on the worker and released to its
// ingress, which runs it again if it produced no output and fails it
// worker_lost otherwise, as for a lost worker. It returns how many jobs it
// ended or released.
func (e *Engine) endOpenLocked() int {
	n := 0
	for _, j := range e.jobs {
		if e.finishLocked(j, CodeNodeShutdown, "the node shut down before the job ended", nil) {
			n++
		}
	}
	for id, w := range e.hosted {
		b := w.bindings[id]
		if b == nil || b.cancelling {
			// Its job ended above, and the worker was told to stop it.
			continue
		}
		d := b.t.d
		w.releaseLocked(id, b)
		// The worker is told to stop before the ingress hears: a job that
		// restarts elsewhere (restart.go) must not still run here.
		err := w.conn.SendCancel(id, d.Gen, CodeNodeShutdown)
		e.releaseToIngressLocked(d, w.ID, false, "the node running the job shut down before it ended (drain timeout)")
		if err != nil {
			e.dropLocked(w, err)
		}
		n++
	}
	return n
}
