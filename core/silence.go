package core

import "log/slog"

// This file is silence: a node that stops answering, crashed or paused
// alike, ends the jobs that depended on it within the heartbeat silence
// bound, never the lease TTL (docs/cluster.md, "Silence and proven
// death"). Silence is not proof of death, so at-most-once does not move:
//   - as ingress, a job whose host went silent after it produced output
//     fails worker_lost (it can never run again), unless it opted into
//     restarts; one without output, or one that may restart, waits for
//     proof (nodesGoneLocked: the host's record gone) and then runs again,
//     or goes on if the host comes back;
//   - as consumer host, a job whose ingress went silent is stopped on its
//     worker: nobody may be reading it. It is released to the ingress, so
//     that an ingress that comes back decides (runs it again if it saw no
//     output, fails it worker_lost otherwise).

// ResponseLegSilent is the transport reporting that the response leg of job
// (id, gen) from host went silent: no frame and no heartbeat for several
// heartbeat intervals, whether the connection stayed open (a host paused,
// partitioned or swapping) or broke and no new one took the leg up (a host
// killed). A job that produced output fails worker_lost, and the host is
// told to stop it should it come back. One that did not, or one that
// opted into restarts and has one left, waits for the host's death to be
// proven (or for the host to answer again): failing it now would throw
// work away that a live host may finish, and running it elsewhere now
// could run it twice.
func (e *Engine) ResponseLegSilent(host, id string, gen uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	j := e.jobs[id]
	if e.closed || j == nil || j.gen != gen || j.state.Terminal() {
		return
	}
	if !j.produced || j.Env.OnWorkerLost == LostRestart && j.restarts < j.Limits.MaxRestarts {
		if j.host == "" && host != e.cfg.Node {
			// The host is who holds it now: its proven death releases it.
			j.host = host
		}
		e.logJob(j.trace, slog.LevelInfo, "a silent host holds a job that may run again; it waits for proof of the host's death", "job", id, "gen", gen, "host", host, "produced", j.produced)
		return
	}
	e.finishLocked(j, CodeWorkerLost, "the consumer host "+host+" went silent (no heartbeat on the job's reply stream)", nil)
}

// PeersSilent is this node's peer tracker reporting which other nodes miss
// their pings now (silent: spare in this node's view). It is called
// without Engine.mu, after every change and on every heartbeat. A node
// that turned silent has the jobs this node runs for it, as their ingress,
// stopped on their workers and released to it.
func (e *Engine) PeersSilent(nodes []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return
	}
	now := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		if n != e.cfg.Node {
			now[n] = true
		}
	}
	for n := range now {
		if !e.silent[n] {
			e.log.Warn("a peer went silent; stopping the jobs run here for it", "peer", n)
		}
	}
	e.silent = now
	if len(now) > 0 {
		// Every time, not only when a node turns silent: a dispatcher here
		// may have offered a silent ingress's waiting job since.
		e.ingressSilentLocked()
	}
}

// ingressSilentLocked stops, on this node's workers, the jobs whose
// ingress is silent, and releases each to its ingress: sent after
// whatever the job sent before on the same leg, so an ingress that comes
// back sees its outputs first and decides as for a lost worker.
func (e *Engine) ingressSilentLocked() {
	for id, w := range e.hosted {
		b := w.bindings[id]
		if b == nil || b.cancelling || !e.silent[b.t.d.Ingress] {
			continue
		}
		d := b.t.d
		e.cancelOnWorkerLocked(w, id, d.Gen, CodeCancelled)
		e.releaseToIngressLocked(d, w.ID, false, "the job's ingress node "+d.Ingress+" went silent")
	}
}
