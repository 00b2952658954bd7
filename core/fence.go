package core

import (
	"context"
	"errors"
	"fmt"
)

// This file is the fence and the way back from it: what a node does when
// its catalog lease must be treated as lost, and when it holds a new one
// (docs/cluster.md, "Fencing" and "A fenced node comes back").

// Fence stops all work on this node because its catalog lease must be
// treated as lost: other nodes will soon take its registrations as proof of
// death and run its jobs elsewhere, so nothing may keep running here. It
// refuses new jobs, cancels every job bound to this node's workers (whoever
// its ingress), drops queued jobs that other nodes forwarded here (their
// ingress re-forwards them once this node's record is gone), and ends this
// node's own jobs with node_shutdown.
func (e *Engine) Fence() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.fenced = true
	e.stopTakingLocked()
	for id, w := range e.hosted {
		if b := w.bindings[id]; b != nil {
			e.cancelOnWorkerLocked(w, id, b.t.d.Gen, CodeNodeShutdown)
		}
	}
	for _, q := range e.queues {
		for _, t := range append([]*task(nil), q.pending...) {
			if t.d.Ingress != e.cfg.Node {
				e.removePendingLocked(q, t)
			}
		}
	}
	for _, j := range e.jobs {
		e.finishLocked(j, CodeNodeShutdown, "the node lost its catalog lease and stopped its work", nil)
	}
}

// ErrNotFenced is returned by Unfence when there is nothing to undo: the
// node is not fenced, or it is leaving (a drain began), which no recovery
// undoes.
var ErrNotFenced = errors.New("core: the node is not fenced, or is draining")

// Unfence returns a fenced node to service once its catalog holds a new
// lease (a new incarnation; the caller has published its node record
// under it). What the fence ended stays ended: every job this node was
// the ingress of ended node_shutdown, the jobs its workers ran were
// cancelled there and are its peers' to run again or fail, and the jobs
// other nodes had forwarded here were dropped. So the node forgets the
// credits it held, as a dispatcher, on consumers of other nodes (those
// bindings are their ingress's now, which released them when this node's
// previous incarnation died), takes jobs again (the fence's drain state
// is reset), republishes the consumer record of every worker session that
// stayed connected, under the new lease, and claims their queues as a
// consumer's node does. The records are written before the node takes
// anything: a failed write leaves it fenced, and the caller tries again.
func (e *Engine) Unfence(ctx context.Context) error {
	e.mu.Lock()
	if !e.fenced || e.drain.started || e.closed {
		e.mu.Unlock()
		return ErrNotFenced
	}
	var records []ConsumerInfo
	for _, w := range e.workers {
		if !w.gone {
			records = append(records, w.record(w.Capabilities))
		}
	}
	e.mu.Unlock()
	if e.cat != nil {
		for _, r := range records {
			if err := e.cat.PublishConsumer(ctx, r); err != nil {
				return fmt.Errorf("unfence: republish consumer %s/%s: %w", r.Queue, r.ID, err)
			}
		}
	}

	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.fenced || e.drain.started || e.closed {
		return ErrNotFenced
	}
	e.fenced = false
	e.draining = false
	select {
	case <-e.drained:
		// The fence stopped the node taking jobs, which closed drained
		// once nothing was open; a later drain needs a fresh one.
		e.drained = make(chan struct{})
	default:
	}
	for _, q := range e.queues {
		for id, t := range q.bound {
			if t.remote != nil {
				e.unbindLocked(id, q.name, t.d.Gen)
			}
		}
		for id, rc := range q.remote {
			if rc.bound == 0 {
				delete(q.remote, id)
			}
		}
		if len(q.workers) == 0 {
			continue
		}
		e.dispatchLocked(q)
		if e.cluster != nil {
			name := q.name
			e.goLocked(func(ctx context.Context) {
				if err := e.cluster.ClaimConsumer(ctx, name); err != nil {
					e.log.Warn("claim queue as consumer host after recovery", "queue", name, "err", err)
				}
			})
		}
	}
	e.log.Info("unfenced: taking jobs again", "consumers", len(records))
	return nil
}

// Fenced reports whether the node is fenced: it lost its catalog lease and
// has not recovered.
func (e *Engine) Fenced() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.fenced
}
