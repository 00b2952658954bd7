package core

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// This file is the ingress waiting for a queue's dispatcher: a job is never
// refused, nor failed, for want of a dispatcher while a capable consumer
// lives (docs/cluster.md, "Losing the dispatcher's node").
//
//   - A new job whose dispatcher does not answer within ForwardWait is
//     accepted, and its forward goes on in the background (forwardNew): the
//     requester sees the accepted event at once, as for a job that waits in
//     its queue, and its stream carries the outcome later.
//   - A job whose queue's record names no routable dispatcher (its node is
//     silent, or gone and not yet replaced) waits here, one goroutine per
//     queue electing until a dispatcher is found (routeQueue), then goes to
//     it. Its wait is bounded by its TTL and by DispatcherWait. (A new job
//     is refused no_capable_worker before any of this, at Submit.)
//   - A forward whose outcome is unknown (the dispatcher did not answer) is
//     never sent elsewhere under the same generation, and not sent
//     elsewhere at all until the dispatcher's death is proven: it may have
//     reached it and be running. Proof, or the forward failing because the
//     node is gone, releases the job like any job a dead node held: it goes
//     back to its queue under a new generation (releaseAtIngressLocked).

// awaiting is an ingress's jobs waiting for their queue's dispatcher.
type awaiting struct {
	// jobs are the waiting jobs, by job, with the generation they wait
	// under and when they began to wait (DispatcherWait counts from then).
	jobs map[*Job]awaitingJob
}

type awaitingJob struct {
	gen   uint64
	since time.Time
}

// awaitDispatcherLocked parks j until its queue has a routable dispatcher,
// and starts the queue's elector if none runs.
func (e *Engine) awaitDispatcherLocked(j *Job) {
	j.dispatcher = ""
	a := e.unrouted[j.Queue]
	if a == nil {
		a = &awaiting{jobs: map[*Job]awaitingJob{}}
		e.unrouted[j.Queue] = a
		queue := j.Queue
		e.goLocked(func(ctx context.Context) { e.routeQueue(ctx, queue, a) })
	}
	if _, ok := a.jobs[j]; !ok {
		a.jobs[j] = awaitingJob{gen: j.gen, since: time.Now()}
	}
	if j.await == nil {
		j.await = e.startSpan(j.trace, SpanAwaitDispatcher, trace.SpanKindInternal, AttrJob.String(j.ID),
			AttrQueue.String(j.Queue), AttrNode.String(e.cfg.Node), AttrGeneration.Int64(int64(j.gen)))
	}
}

// Backoff between elections of a queue whose jobs wait for a dispatcher:
// short first (a consumer's node claims the queue within milliseconds of
// the old record going), then at most electRetryMax apart.
const (
	electRetryMin = 25 * time.Millisecond
	electRetryMax = 500 * time.Millisecond
	// electAttempt bounds one election: a catalog that does not answer
	// must not hold the jobs past their own bounds.
	electAttempt = 2 * time.Second
)

// routeQueue is the elector of one queue's waiting jobs: it tries the view,
// then an election, again and again, until a dispatcher is found or no job
// waits any more. It survives any number of failed elections.
func (e *Engine) routeQueue(ctx context.Context, queue string, a *awaiting) {
	wait := electRetryMin
	for {
		e.mu.Lock()
		if e.closed || e.unrouted[queue] != a {
			e.mu.Unlock()
			return
		}
		e.pruneAwaitingLocked(a)
		node, ok := e.cluster.CachedDispatcher(queue)
		if ok || len(a.jobs) == 0 {
			e.routeAwaitingLocked(queue, a, node)
			e.mu.Unlock()
			return
		}
		e.mu.Unlock()

		actx, cancel := context.WithTimeout(ctx, electAttempt)
		node, err := e.cluster.Dispatcher(actx, queue)
		cancel()
		if err == nil {
			e.mu.Lock()
			if e.unrouted[queue] == a && !e.closed {
				e.pruneAwaitingLocked(a)
				e.routeAwaitingLocked(queue, a, node)
			}
			e.mu.Unlock()
			return
		}
		if ctx.Err() != nil {
			return
		}
		e.log.Debug("no dispatcher for queue yet; jobs wait", "queue", queue, "err", err)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wait = min(2*wait, electRetryMax)
	}
}

// pruneAwaitingLocked drops the jobs that stopped waiting (ended, or moved
// to another generation), and ends those that may wait no longer: past
// their TTL or DispatcherWait. A job that waits here was accepted, so no
// capable consumer now is no reason to end it: as in its queue, it waits
// for one that registers within its TTL.
func (e *Engine) pruneAwaitingLocked(a *awaiting) {
	now := time.Now()
	for j, w := range a.jobs {
		switch {
		case j.state.Terminal() || j.gen != w.gen:
		case !now.Before(j.deadline):
			e.finishLocked(j, CodeExpired, "the job's TTL ran out while it waited for its queue's dispatcher", nil)
		case now.Sub(w.since) >= e.cfg.DispatcherWait:
			e.finishLocked(j, CodeDispatcherUnavailable, "no dispatcher could be found for the job's queue within the node's dispatcher wait", nil)
		default:
			continue
		}
		delete(a.jobs, j)
	}
}

// routeAwaitingLocked forwards every job still waiting on queue to node
// (none when node is ""), and ends the wait.
func (e *Engine) routeAwaitingLocked(queue string, a *awaiting, node string) {
	delete(e.unrouted, queue)
	if node == "" {
		return
	}
	// A dispatcher is found once the old one's record is gone, which may
	// be before this node's view has acted on that death: act on it now,
	// so that the jobs the dead node held go back to their queue, and to
	// the new dispatcher, before the jobs posted while it was silent.
	// (Gone nodes only: replaced incarnations are ClusterChanged's to
	// judge, once.)
	e.nodesGoneLocked(nil)
	// They leave in the order a queue would take them: jobs going back to
	// their queue (a dead node held them) before new ones, then by the TTL
	// they have left. Forwards that find free slots bind on arrival, so
	// map order here would let jobs posted during the outage take the
	// slots the oldest jobs need.
	jobs := make([]*Job, 0, len(a.jobs))
	for j := range a.jobs {
		jobs = append(jobs, j)
	}
	slices.SortFunc(jobs, func(x, y *Job) int {
		if rx, ry := x.gen > 1, y.gen > 1; rx != ry {
			if rx {
				return -1
			}
			return 1
		}
		return x.deadline.Compare(y.deadline)
	})
	now := time.Now()
	for _, j := range jobs {
		d := e.deliveryLocked(j, now)
		d.Front = true
		e.forwardToLocked(j, node, d)
	}
}

// forwardVerdictLocked applies the verdict of a new job's forward to node
// that came after Submit stopped waiting for it (the job was accepted):
//   - a refusal ends the job with the refusal's code, unless the job was
//     heard from meanwhile (its host named itself, or it ran): then the
//     refusal is not the job's outcome; a draining refusal never is (the
//     node took nothing): the job is routed again (rerouteLaterLocked);
//   - no verdict because node is gone, or the incarnation of it the forward
//     was meant for was replaced (ErrNodeReplaced): the job goes back to its
//     queue under a new generation, as for any job a dead dispatcher held (a
//     node death seen first may have done so already: the generation tells);
//   - no verdict otherwise (the forward ran out of time without proof of
//     death): the job fails dispatcher_unavailable, or expires past its TTL.
func (e *Engine) forwardVerdictLocked(j *Job, node string, gen uint64, err error) {
	if err == nil || e.closed || j.state.Terminal() || j.gen != gen {
		return
	}
	var ce *Error
	switch {
	case errors.As(err, &ce):
		if j.host != "" || j.state != StateQueued {
			return
		}
		if ce.Code == CodeDraining {
			e.rerouteLaterLocked(j, node, gen)
			return
		}
		j.settled = true
		e.finishLocked(j, ce.Code, "the queue's dispatcher refused the job: "+ce.Detail, nil)
	case e.cluster.Gone(node):
		e.dispatcherDeadLocked(j, node, gen, "the dispatcher's node "+node+" is gone")
	case errors.Is(err, ErrNodeReplaced):
		// The incarnation the forward was meant for is dead and took
		// nothing of it since: as a dispatcher gone.
		e.dispatcherDeadLocked(j, node, gen, "the dispatcher's node "+node+" was replaced by a new incarnation")
	case !time.Now().Before(j.deadline):
		e.finishLocked(j, CodeExpired, "the job's TTL ran out before its dispatcher answered", nil)
	default:
		e.logJob(j.trace, slog.LevelWarn, "forward to dispatcher got no verdict", "queue", j.Queue, "dispatcher", node, "job", j.ID, "err", err)
		e.finishLocked(j, CodeDispatcherUnavailable, "the queue's dispatcher on node "+node+" did not answer within the node's dispatcher wait", nil)
	}
}

// rerouteLaterLocked routes a job again whose dispatcher on node refused
// it as draining: the node is shutting down, or it woke from a pause
// fenced and has not yet come back. It took nothing, so routing the job
// again runs nothing twice, and a job is never refused for it while a
// capable worker lives. The job goes back one heartbeat later
// (ForwardWait), not at once: by then the node is back, or its record
// names another dispatcher, and a node that goes on refusing is asked once
// a heartbeat, within the job's TTL, not in a loop.
func (e *Engine) rerouteLaterLocked(j *Job, node string, gen uint64) {
	e.logJob(j.trace, slog.LevelInfo, "the queue's dispatcher refused the job as draining; routing it again", "job", j.ID, "queue", j.Queue, "dispatcher", node)
	stopTimer(j.rerouteTimer)
	j.rerouteTimer = time.AfterFunc(e.cfg.ForwardWait, func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.closed || j.state.Terminal() || j.gen != gen || j.host != "" {
			return
		}
		e.releaseAtIngressLocked(j.ID, gen, "", false, lostStopped, "the dispatcher on node "+node+" refused it as draining")
	})
}

// dispatcherDeadLocked releases a new job whose forward to node got no
// verdict because node (the incarnation the forward was meant for) is
// dead, unless a host named itself for the job meanwhile: the job runs
// there, and the dispatcher's death takes nothing from it
// (nodesGoneLocked judges the host).
func (e *Engine) dispatcherDeadLocked(j *Job, node string, gen uint64, reason string) {
	if j.host != "" && j.host != node {
		return
	}
	e.releaseAtIngressLocked(j.ID, gen, "", false, lostProven, reason)
}
