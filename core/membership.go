package core

import "context"

// This file reacts to the catalog view changing: nodes and consumers that
// came or went, zone labels that changed, queues left without a dispatcher.

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
	replaced := e.incarnationsLocked()
	e.nodesGoneLocked(replaced)
	e.zonesChangedLocked()
	for _, q := range e.queues {
		e.consumersGoneLocked(q, replaced)
		e.dispatchLocked(q)
		e.pinCheckLocked(q)
		e.claimOrphansLocked(q)
	}
}

// incarnationsLocked records each node's incarnation from the catalog view
// and returns the nodes whose incarnation changed since the last call: a
// node that came back from a fence, or was restarted under the same name,
// possibly before its old record left the view (a restart inside the old
// lease replaces the record; a record deleted and written again between
// two calls is seen only as replaced). The previous incarnation is dead:
// it fenced before it recovered, or its process is gone. What it held is
// released at once, as for a node whose record is gone. This node's own
// record is never judged.
func (e *Engine) incarnationsLocked() map[string]bool {
	var replaced map[string]bool
	now := map[string]string{}
	for _, n := range e.cat.Nodes() {
		if n.ID == e.cfg.Node || n.Incarnation == "" {
			continue
		}
		now[n.ID] = n.Incarnation
		if was, ok := e.incarnations[n.ID]; ok && was != n.Incarnation {
			if replaced == nil {
				replaced = map[string]bool{}
			}
			replaced[n.ID] = true
			e.m.IncarnationsReplaced.Inc()
			e.log.Info("node came back under a new incarnation; releasing what the previous one held", "peer", n.ID, "previous", was, "incarnation", n.Incarnation)
		}
	}
	e.incarnations = now
	return replaced
}

// nodesGoneLocked acts on nodes whose catalog record is gone (their lease
// expired or was revoked, so they have fenced themselves and run nothing),
// and on the previous incarnation of nodes that came back under a new one
// (replaced, from incarnationsLocked).
//   - As ingress: a job held by a dead node (its consumer host, or its
//     dispatcher while no host is known) returns to its queue if it
//     produced no output and fails worker_lost otherwise. A job running on
//     one of this node's own workers is held here, whoever dispatched it.
//     A job held by a replaced node was held by its previous incarnation:
//     this node learnt its holder before it saw the new one, which routes
//     nothing to it while its record says in_progress.
//   - As consumer host: a job whose ingress is gone has no requester left
//     and is cancelled on its worker.
//   - As dispatcher: a pending job whose ingress is gone is dropped.
//
// A replaced ingress is not taken for gone in the last two: a job its new
// incarnation sends may reach this node before the new record does (with
// several etcd members the two travel apart), and nothing tells it from
// one of the previous incarnation's. Those, orphans of a process that is
// gone, run to the first reply, which the new incarnation answers with a
// cancel (it knows no such job).
func (e *Engine) nodesGoneLocked(replaced map[string]bool) {
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
		if j.state.Terminal() || e.runsHereLocked(j) {
			continue
		}
		holder := j.host
		if holder == "" {
			holder = j.dispatcher
		}
		if replaced[holder] || gone(holder) {
			e.releaseAtIngressLocked(j.ID, j.gen, "", false, lostProven, "node "+holder+" is gone")
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

// runsHereLocked reports whether j's current generation is bound to a
// worker of this node. The ingress records no host for such a job (no
// response leg is opened to itself), so without this its dispatcher would
// pass for its holder, and the dispatcher's death would end a job that
// runs on.
func (e *Engine) runsHereLocked(j *Job) bool {
	w := e.hosted[j.ID]
	if w == nil {
		return false
	}
	b := w.bindings[j.ID]
	return b != nil && b.t.d.Gen == j.gen
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
		// not): the host, once a reply or its response leg named it.
		if j.state.Terminal() || !outOfZone(j.Env.Zone, j.host) {
			continue
		}
		host := j.host
		e.sendLocked(host, Message{Kind: MsgCancel, JobID: j.ID, Gen: j.gen, Queue: j.Queue, Code: CodeCancelled})
		e.releaseAtIngressLocked(j.ID, j.gen, "", false, lostRunning, "node "+host+" left the job's zone "+j.Env.Zone)
	}
	for _, q := range e.queues {
		for id, t := range q.bound {
			if t.remote == nil || !outOfZone(t.d.Zone, t.remote.info.Node) {
				continue
			}
			node := t.remote.info.Node
			e.sendLocked(node, Message{Kind: MsgCancel, JobID: id, Gen: t.d.Gen, Queue: q.name, Code: CodeCancelled})
			e.unbindLocked(id, q.name, t.d.Gen)
			e.releaseRunningToIngressLocked(t.d, "node "+node+" left the job's zone "+t.d.Zone)
		}
	}
}

// consumersGoneLocked returns the jobs bound to remote consumers whose
// registration is gone, or whose node was replaced by a new incarnation
// (a recovered node publishes its live workers' records again under the
// same ids: a job bound to one before is the previous incarnation's, and
// was cancelled when that one fenced): the death the at-most-once rule
// accepts as proof.
func (e *Engine) consumersGoneLocked(q *queue, replaced map[string]bool) {
	if len(q.remote) == 0 {
		return
	}
	live := map[string]bool{}
	for _, c := range e.cat.Consumers(q.name) {
		live[c.ID] = !replaced[c.Node]
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

// claimOrphansLocked re-elects the queues this node hosts consumers of
// whose record names no routable dispatcher (its node died, or handed the
// queue over): a consumer's node claims it.
func (e *Engine) claimOrphansLocked(q *queue) {
	if len(q.workers) == 0 || e.draining {
		// A draining node has handed its queues over: it claims none back.
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
