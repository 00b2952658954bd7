//go:build faults

package integration_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/switchyard/switchyard/worker"
)

// faultRun is one case as it runs: the cluster, its workers and requesters,
// the roles when the fault hit, and when it hit.
type faultRun struct {
	t      *testing.T
	c      faultCase
	timing faultTiming
	net    *faultNet
	cl     *faultCluster
	runs   *runLog
	// workerNode maps a worker's name to the node it is connected to.
	workerNode map[string]string
	load       *loadGen
	obs        *observer
	// clients is the size of the closed loop.
	clients int
	// mig is the job that opted into restarts, in a migrate case.
	mig *migration

	// Roles just before the fault.
	dispatcher, leader, target string
	// faultAt is when the fault was injected; recoverAt when it was healed
	// (SIGCONT, links up, restart), or faultAt for a kill.
	faultAt, recoverAt time.Time
	// servingAt: a restarted node's new process logged that it serves.
	servingAt time.Time
	// faulted: the nodes the fault hit; killed: those whose process died.
	faulted, killed []string
	timeline        []string
}

func (fx *faultRun) note(at time.Time, what string) {
	fx.timeline = append(fx.timeline, fmt.Sprintf("%v %s", at.Format("15:04:05.000"), what))
}

// startWorkers connects wc to c, waits until c dispatches the queue (a
// node hosting a consumer claims an unclaimed queue), then wb to b.
func (fx *faultRun) startWorkers() {
	start := func(name, node string) {
		fx.workerNode[name] = node
		startProcWorker(fx.t, fx.cl.nodes[node], worker.Config{Name: name, Queue: faultQueue, Concurrency: workerSlots, MaxBackoff: time.Second},
			fx.runs.handler(name, runPlan{think: jobThink, outputs: jobOutputs, every: jobEvery}))
	}
	start("wc", "c")
	poll(fx.t, 20*time.Second, "c dispatching "+faultQueue+" with wc, in a's view", func() bool {
		q, err := fx.cl.queue("a", faultQueue)
		return err == nil && q.Dispatcher == "c" && q.hasConsumers("wc")
	})
	start("wb", "b")
	poll(fx.t, 20*time.Second, "wb and wc in a's view of "+faultQueue, func() bool {
		q, err := fx.cl.queue("a", faultQueue)
		return err == nil && q.hasConsumers("wb", "wc")
	})
}

// dispatcherNode is the queue's dispatcher as a sees it (GET /v1/queues).
func (fx *faultRun) dispatcherNode() string {
	q, err := fx.cl.queue("a", faultQueue)
	if err != nil || q.Dispatcher == "" {
		fx.t.Fatalf("the dispatcher of %s in a's view: %v %+v", faultQueue, err, q)
	}
	return q.Dispatcher
}

// otherHost is the worker host that does not dispatch the queue.
func (fx *faultRun) otherHost() string {
	if fx.dispatcherNode() == "b" {
		return "c"
	}
	return "b"
}

// warmUp waits until the load is steady (every client has had a job
// running, some completed), reads the roles, and then, when the target hosts
// a worker, waits (at most a job's run) for a moment when one of its runs is
// still thinking, so the fault catches a job without output there.
func (fx *faultRun) warmUp() {
	poll(fx.t, 40*time.Second, "the load to settle (every slot busy, 4 jobs done)", func() bool {
		done, running := 0, 0
		for _, j := range fx.load.snapshot() {
			switch {
			case j.Terminal == "done":
				done++
			case j.Status == 200 && j.EndAt.IsZero():
				running++
			}
		}
		return done >= 4 && running >= min(fx.clients, 2*workerSlots)-2
	})
	fx.dispatcher = fx.dispatcherNode()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	leader, err := fx.cl.etcdLeader(ctx)
	cancel()
	if err != nil {
		leader = "unknown (" + err.Error() + ")"
	}
	fx.leader = leader
	fx.target = fx.c.target(fx)
	var hosted []string
	for w, n := range fx.workerNode {
		if n == fx.target {
			hosted = append(hosted, w)
		}
	}
	if len(hosted) == 0 {
		return
	}
	// One job's run: every slot's run goes through its thinking in that time.
	deadline := time.Now().Add(jobRunTime + time.Second)
	for time.Now().Before(deadline) {
		if slices.ContainsFunc(fx.runs.all(), func(r jobRun) bool {
			return slices.Contains(hosted, r.worker) && r.end.IsZero() && r.outputs == 0 && time.Since(r.start) < jobThink*3/4
		}) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	fx.note(time.Now(), "no run on "+fx.target+" was thinking: the fault catches no job without output there")
}

// origin is what "new jobs complete again" counts from: the fault, or its
// heal when no node could work during it.
func (fx *faultRun) origin() time.Time {
	if fx.c.noQuorum {
		return fx.recoverAt
	}
	return fx.faultAt
}

// returning are the nodes that must be back online (and taking work, if
// they host a worker) after the fault.
func (fx *faultRun) returning() []string {
	if !fx.c.returns {
		return nil
	}
	return fx.faulted
}

// observe keeps the load running after the fault until every measurement
// the targets need has happened, or until the longest bound (plus slack)
// has passed.
func (fx *faultRun) observe() {
	bounds := faultBounds(fx)
	deadline := maxTime(fx.origin().Add(bounds.newDone.d+faultSlack+time.Second), fx.stallEnd().Add(time.Second))
	if fx.c.returns {
		deadline = maxTime(deadline, fx.recoverAt.Add(bounds.back.d+faultSlack+time.Second))
	}
	for time.Now().Before(deadline) {
		time.Sleep(250 * time.Millisecond)
		if time.Since(fx.origin()) < 2*time.Second || time.Now().Before(fx.stallEnd()) {
			continue
		}
		l := newLedger(fx)
		if l.inflightEnded() && l.newDone.n > 0 && l.allBack() && fx.mig.ended() {
			return
		}
	}
}

// settleRuns waits a little for the workers' handlers of ended jobs to
// return, so the ledger knows when each run ended.
func (fx *faultRun) settleRuns() {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if !slices.ContainsFunc(fx.runs.all(), func(r jobRun) bool { return r.end.IsZero() }) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
