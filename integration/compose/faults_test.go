//go:build compose

package compose_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/switchyard/switchyard/integration/loadgen"
)

// The cases. Each runs a closed loop of streamed jobs against a fresh
// cluster, breaks one thing, lets it recover, and prints its ledger. The
// invariants every case checks (ledger.check): every stream ends with
// exactly one terminal event (unknown = 0), within its bound of the fault
// for the jobs in flight at it; no job runs more than once by the workers'
// own record; no event is repeated or out of order.
//
// The cluster: node-1 (zone z1) dispatches queue demo (startCluster makes
// sure of it); worker-1 on node-1 and worker-2 on node-2 have model=small,
// worker-3 on node-3 has model=large, 8 slots each. "large" jobs run on
// worker-3 only, "small" ones on worker-1 or worker-2.

// slack covers scheduling on a loaded 2-core machine (the tests share it
// with other builds) on top of each bound the design gives.
const slack = 2 * time.Second

// untilTTL is the bound of a job that had no output at the fault: it may
// wait for a worker, at most until its TTL.
func untilTTL(j loadJob, at time.Time) time.Duration {
	return j.SubmitAt.Add(jobTTL).Sub(at) + slack
}

// Kill the container of a busy worker mid-stream. worker-3 runs 8 large
// jobs (some with output, some about to start), 4 more wait for a slot.
// Expected: node-3 sees the worker's session end (its connection reset, or
// silence for --worker-idle-timeout); a job that had output ends
// worker_lost and never runs again; a job without output waits for a
// capable worker (there is none until worker-3 is back, 5s later) and runs
// once, or expires; new large jobs are refused no_capable_worker meanwhile,
// and complete again once the worker is back.
func TestComposeKillBusyWorker(t *testing.T) {
	t.Parallel()
	c := startCluster(t, "kill-worker")
	l := startLoad(c, clientSpec{kind: "large", model: "large", clients: 12, ingresses: []string{"node-1", "node-2"}})
	waitBusy(t, l, "large", 8, 2)

	at, died := c.kill("worker-3")
	time.Sleep(5 * time.Second)
	back := c.start("worker-3")
	again, err := poll(30*time.Second, completedAfter(l, "large", back))
	if err != nil {
		t.Errorf("no large job submitted after worker-3 came back completed within 30s")
	}
	l.drain(jobTTL + 5*time.Second)

	led := newLedger(c, "kill-worker", "docker kill worker-3 (the only model=large worker, attached to node-3)", at,
		l.snapshot(), map[string]time.Time{"worker-3": died})
	led.note("docker kill issued at %s, the container's process died at %s (Docker's record)", at.Format("15:04:05.000"), died.Format("15:04:05.000"))
	led.note("worker-3 started again %v after the kill; the first large job submitted after that completed %v later",
		back.Sub(at).Round(time.Millisecond), again.Round(time.Millisecond))
	led.check(t, func(j loadJob) time.Duration {
		if j.OutputBy(at) {
			return workerIdle + slack
		}
		return untilTTL(j, at)
	})
}

// Kill the container of the node a busy worker is attached to (node-3, not
// the dispatcher). Expected today (docs/cluster.md, "Bounds"): a job that
// had output ends worker_lost once node-3's lease has expired and the
// catalog says so, within the lease TTL and a few seconds; issue 12 will
// bring that down to the heartbeat bound (4 intervals). Then node-3 starts
// again, is online in every view, and large jobs complete again.
func TestComposeKillWorkerNode(t *testing.T) {
	t.Parallel()
	c := startCluster(t, "kill-node")
	l := startLoad(c, clientSpec{kind: "large", model: "large", clients: 12, ingresses: []string{"node-1", "node-2"}})
	old := consumerOn(t, c, "node-3")
	waitBusy(t, l, "large", 8, 2)

	at, _ := c.kill("node-3")
	// Start node-3 again once the jobs that were streaming from it have
	// ended (its old lease has expired by then): those waiting for a
	// worker get to run on worker-3 once it is back.
	_, _ = poll(leaseTTL+10*time.Second, func() error {
		if n := l.count(func(j *loadJob) bool { return j.SubmitAt.Before(at) && j.EndAt.IsZero() && j.OutputBy(at) }); n > 0 {
			return fmt.Errorf("%d streams with output open", n)
		}
		return nil
	})
	back := c.start("node-3")
	online, err := poll(2*leaseTTL, rejoined(c, "node-3", old))
	if err != nil {
		t.Errorf("node-3 has not rejoined %v after it started again: %v", 2*leaseTTL, err)
	}
	again, err := poll(30*time.Second, completedAfter(l, "large", back))
	if err != nil {
		t.Errorf("no large job submitted after node-3 came back completed within 30s")
	}
	l.drain(jobTTL + 5*time.Second)

	led := newLedger(c, "kill-worker-node", "docker kill node-3 (hosts worker-3's session, the only model=large worker)", at, l.snapshot(), nil)
	led.note("node-3 started %v after the kill, rejoined (ready, online in every view, worker-3 registered anew) %v later; the first large job submitted after that completed %v after the start",
		back.Sub(at).Round(time.Millisecond), online.Round(time.Millisecond), again.Round(time.Millisecond))
	last, _ := led.check(t, func(j loadJob) time.Duration {
		if j.OutputBy(at) {
			return leaseTTL + 2*peerHeartbeat + slack
		}
		return untilTTL(j, at)
	})
	issue12(t, last, 4*peerHeartbeat)
}

// Disconnect node-3 (worker-3's node, not the dispatcher) from the cluster
// network for 10s, then connect it again with its address. The seed's
// behaviour: a job streaming from node-3 ends worker_lost when its reply
// leg has been silent for three peer heartbeats (plus one to notice); small
// jobs, on worker-1 and worker-2, go on and new ones keep completing (new
// jobs route around node-3); large ones are refused no_capable_worker while
// node-3 is spare. 10s is longer than node-3's lease can last without a
// renewal, so node-3 fences itself and its lease expires: once connected
// again it must come back (a new incarnation) and be online in every view,
// and large jobs must complete again (issue 12: a fenced node recovers).
func TestComposeDisconnect(t *testing.T) {
	t.Parallel()
	c := startCluster(t, "disconnect")
	l := startLoad(c,
		clientSpec{kind: "large", model: "large", clients: 8, ingresses: []string{"node-1", "node-2"}},
		clientSpec{kind: "small", model: "small", clients: 8, ingresses: []string{"node-1", "node-2"}})
	old := consumerOn(t, c, "node-3")
	waitBusy(t, l, "large", 6, 0)
	waitBusy(t, l, "small", 6, 0)

	at := c.disconnect("node-3")
	time.Sleep(time.Until(at.Add(10 * time.Second)))
	back := c.connect("node-3")
	online, onlineErr := poll(2*leaseTTL, rejoined(c, "node-3", old))
	if onlineErr != nil {
		t.Errorf("node-3 has not rejoined %v after it was connected again: %v", 2*leaseTTL, onlineErr)
	}
	again, err := poll(15*time.Second, completedAfter(l, "large", back.Add(online)))
	if err != nil {
		t.Errorf("no large job submitted after node-3 was back completed within 15s")
	}
	l.drain(jobTTL + 5*time.Second)

	jobs := l.snapshot()
	led := newLedger(c, "disconnect", "docker network disconnect node-3 for 10s (worker-3's node; node-1 dispatches)", at, jobs, nil)
	if onlineErr == nil {
		led.note("node-3 connected again %v after the fault, rejoined (ready, online in every view, worker-3 registered anew) %v later; the first large job submitted after that completed %v later",
			back.Sub(at).Round(time.Millisecond), online.Round(time.Millisecond), again.Round(time.Millisecond))
	} else {
		led.note("node-3 connected again %v after the fault, NOT rejoined %v later: %v", back.Sub(at).Round(time.Millisecond), online.Round(time.Millisecond), onlineErr)
	}
	// New jobs route around node-3: every small job posted while it was
	// away completed.
	around := map[string]int{}
	routed, missed := 0, 0
	for _, j := range jobs {
		if j.kind == "small" && !j.SubmitAt.Before(at) && j.SubmitAt.Before(back) {
			routed++
			if j.Terminal != "done" {
				missed++
				around[fmt.Sprintf("status %d %s%s%s", j.Status, j.Refusal, j.PostErr, j.Code)]++
			}
		}
	}
	led.note("small jobs posted while node-3 was away: %d, not completed: %d %v", routed, missed, around)
	// Whether node-3 took the others down with it (it was etcd's leader:
	// issue 12, "the catalog survives its own leader election").
	led.note("after the case: node-1 /readyz %.40s; node-2 /readyz %.40s", readyz(c, "node-1"), readyz(c, "node-2"))
	led.mustComplete(t, "small jobs in flight at the fault (worker-1 and worker-2, untouched)", func(j loadJob, _ []jobRun) bool {
		return j.kind == "small"
	})
	led.check(t, func(j loadJob) time.Duration {
		if j.kind == "large" && j.OutputBy(at) {
			return 4*peerHeartbeat + slack
		}
		return untilTTL(j, at)
	})
	if missed > 0 {
		t.Errorf("%d of the %d small jobs posted while node-3 was away did not complete (routed around it): %v", missed, routed, around)
	}
}

// Restart node-1, the queue's dispatcher, gracefully (docker restart:
// SIGTERM, which drains, then a start), with requesters on node-2 and
// node-3. Expected (docs/running.md, "Leaving gracefully": SIGTERM drains, bound jobs get
// --drain-timeout to finish): every job in flight that had output completes,
// those running on worker-1 included; the queue gets another dispatcher
// while node-1 is away; node-1 comes back online in every view, worker-1
// registers again, and no view keeps a dispatcher that is not online or
// the old process's consumer; jobs through node-1 complete.
func TestComposeRestart(t *testing.T) {
	t.Parallel()
	_ = testRestart(t, "restart", "docker restart node-1 (SIGTERM: drain, then start)",
		func(c *cluster) (time.Time, time.Time) {
			at := c.restart("node-1")
			return at, time.Now()
		},
		"jobs in flight with output (bound jobs finish while node-1 drains)",
		func(j loadJob, at time.Time, _ []jobRun) bool { return j.OutputBy(at) },
		func(j loadJob, at time.Time) time.Duration {
			if j.OutputBy(at) {
				return drainTimeout + slack
			}
			return untilTTL(j, at)
		})
}

// Kill node-1, the queue's dispatcher, and start it again at once under the
// same name, inside its old lease. Expected: jobs in flight on worker-2 and
// worker-3, whose hosts live, complete; jobs on worker-1 that had output end
// worker_lost within the crash bound (the old lease expires; once issue 12
// lands, the new incarnation proves the old one dead at once, and the
// bound is the heartbeat's); the rest as for a graceful restart.
func TestComposeRestartCrash(t *testing.T) {
	t.Parallel()
	last := testRestart(t, "restart-crash", "docker kill node-1, then docker start node-1 at once (inside its lease)",
		func(c *cluster) (time.Time, time.Time) {
			at, _ := c.kill("node-1")
			return at, c.start("node-1")
		},
		"jobs in flight with output on worker-2 and worker-3 (their hosts live)",
		func(j loadJob, at time.Time, rs []jobRun) bool { return j.OutputBy(at) && lastWorker(rs) != "worker-1" },
		func(j loadJob, at time.Time) time.Duration {
			if j.OutputBy(at) {
				return leaseTTL + 2*peerHeartbeat + slack
			}
			return untilTTL(j, at)
		})
	issue12(t, last, 4*peerHeartbeat)
}

// testRestart runs a restart case: fault restarts node-1 and returns when
// it happened and when node-1 was started again; the jobs in flight that
// mustFinish picks must complete, and every one must end within bound. It
// returns the time from the fault to the last terminal event of the jobs in
// flight that had output.
func testRestart(t *testing.T, name, fault string, restart func(*cluster) (time.Time, time.Time),
	mustWhat string, mustFinish func(loadJob, time.Time, []jobRun) bool, bound func(loadJob, time.Time) time.Duration,
) time.Duration {
	c := startCluster(t, name)
	old := consumerOn(t, c, "node-1")
	l := startMixedLoad(t, c, "node-2", "node-3")

	at, started := restart(c)
	back, backErr := poll(2*leaseTTL, func() error {
		if err := rejoined(c, "node-1", old)(); err != nil {
			return err
		}
		return noStaleDispatcher(c)
	})
	if backErr != nil {
		t.Errorf("%v after node-1 started again: %v", 2*leaseTTL, backErr)
	}
	probes := []loadJob{probe(c, "node-1", "small"), probe(c, "node-1", "large")}
	l.drain(jobTTL + 5*time.Second)

	led := newLedger(c, name, fault, at, l.snapshot(), nil)
	led.note("node-1 started again %v after the fault; %v later it was ready, every view had three nodes online, one online dispatcher, and worker-1 registered anew (not %s)",
		started.Sub(at).Round(time.Millisecond), back.Round(time.Millisecond), old)
	for _, p := range probes {
		led.note("a %s job posted to node-1 afterwards: %s %s %s%s", p.kind, p.Terminal, p.Code, p.Refusal, p.PostErr)
		if p.Terminal != "done" {
			t.Errorf("a %s job posted to node-1 after its restart did not complete: status %d %s%s %s %s", p.kind, p.Status, p.Refusal, p.PostErr, p.Code, p.Detail)
		}
	}
	refused := 0
	for _, j := range led.jobs {
		if j.Status != 0 && j.Status != 200 && !j.SubmitAt.Before(at) {
			refused++
		}
	}
	led.note("issue 12's target: no refusal while a capable worker lives (all three workers lived throughout): %d refused after the fault", refused)
	// Small jobs, from the fault for as long as a stall case holds its
	// fault: worker-1 is down until node-1 started again.
	res := led.stall(at, at.Add(stallHold), "small", map[string]string{"worker-1": "node-1", "worker-2": "node-2"}, "node-1", started)
	led.note("small jobs, %s", stallLine(res))
	defer issue24(t, res, 4*peerHeartbeat, "4 peer heartbeats: the dispatcher's node")
	led.mustComplete(t, mustWhat, func(j loadJob, rs []jobRun) bool { return mustFinish(j, at, rs) })
	last, _ := led.check(t, func(j loadJob) time.Duration { return bound(j, at) })
	return last
}

// waitBusy waits until at least streaming jobs of kind have open streams
// with output, and waiting more are accepted with none yet.
func waitBusy(t *testing.T, l *load, kind string, streaming, waiting int) {
	t.Helper()
	waitFor(t, 30*time.Second, fmt.Sprintf("%d %s jobs streaming and %d waiting", streaming, kind, waiting), func() error {
		s := l.count(func(j *loadJob) bool { return j.kind == kind && j.EndAt.IsZero() && j.OutputBy(time.Now()) })
		w := l.count(func(j *loadJob) bool {
			return j.kind == kind && j.Status == 200 && j.EndAt.IsZero() && !j.OutputBy(time.Now())
		})
		if s < streaming || w < waiting {
			return fmt.Errorf("%d streaming, %d waiting", s, w)
		}
		return nil
	})
}

// completedAfter is nil once a job of kind submitted after t has completed.
func completedAfter(l *load, kind string, t time.Time) func() error {
	return func() error {
		if l.count(func(j *loadJob) bool { return j.kind == kind && j.SubmitAt.After(t) && j.Terminal == "done" }) == 0 {
			return errNotYet
		}
		return nil
	}
}

// probe posts one job to a node and reads it to the end.
func probe(c *cluster, svc, model string) loadJob { return probeIn(c, svc, model, "") }

// probeIn is probe for a job kept in zone.
func probeIn(c *cluster, svc, model, zone string) loadJob {
	l := &load{c: c, Loop: loadgen.NewLoop[loadJob](1)}
	defer l.Halt()
	j := &loadJob{Job: loadgen.Job{Ingress: svc}, kind: model, model: model, zone: zone}
	l.do(j)
	return *j
}

// issue12 logs the time from the fault to the last terminal event of the
// jobs that had output against issue 12's target ("silence is silence":
// a crash ends them within the heartbeat bound), which is not yet a bound
// these tests hold the cluster to.
func issue12(t *testing.T, last, target time.Duration) {
	verdict := "met"
	if last > target {
		verdict = "missed (issue 12 has not landed)"
	}
	t.Logf("issue 12's target for jobs in flight with output: terminal within %v of the fault; measured %v: %s",
		target, last.Round(time.Millisecond), verdict)
}
