package core

import (
	"context"
	"time"
)

// pinCheckLocked moves a queue's dispatch to its consumers' node when this
// node dispatches it but hosts none of its consumers, every consumer lives
// on one other node and has for PinStable, and no job is waiting or bound
// here (a move is for a quiet queue: it is an optimisation, never a
// constraint). Two consumers on two nodes leave the dispatcher where it
// is. It releases the record; the consumers' node claims it
// (claimOrphansLocked), and this node steps down as from any record that
// came to name another node (epoch.go): a job that arrived in between goes
// back to its ingress.
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
