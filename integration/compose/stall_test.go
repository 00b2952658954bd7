//go:build compose

package compose_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/integration/stall"
)

// Issue 24's cases: one silent node never stalls a queue. A saturating
// load of small jobs (20 clients for the 16 slots of worker-1 and
// worker-2, the two model=small workers) is posted to node-3, which hosts
// neither; then node-1 (the queue's dispatcher, worker-1's host) or node-2
// (worker-2's host) is paused, killed or cut off for 10s, and brought
// back. The ledger prints the stall figures (package stall): the fault →
// the first start, on the worker that lives, of a job posted after the
// fault; and the longest stall, in which a new job waited, the live worker
// had a free slot, and nothing started. Issue 24's targets, 2 peer
// heartbeats after a worker host's fault and 4 after the dispatcher's
// node's, are printed against them, not asserted (as issue 12's are
// here): the tests share two cores with other work, and the fault suite
// holds the timing (docs/faults.md). Every invariant the other cases hold
// is held here too.

// stallHold is how long each fault lasts: the lease TTL, so that a silent
// dispatcher's lease runs out within it (the behaviour issue 24 replaces).
const stallHold = leaseTTL

// stallSlots is the slots of each demo worker.
const stallSlots = 8

// stallCase is one of issue 24's compose cases.
type stallCase struct {
	name, node, how string
	// dispatcher: node is the queue's dispatcher (node-1).
	dispatcher bool
}

var stallCases = []stallCase{
	{"pause-dispatcher", "node-1", "pause", true},
	{"kill-dispatcher", "node-1", "kill", true},
	{"disconnect-dispatcher", "node-1", "disconnect", true},
	{"pause-worker-node", "node-2", "pause", false},
	{"kill-worker-node-2", "node-2", "kill", false},
	{"disconnect-worker-node", "node-2", "disconnect", false},
}

// TestComposeStall runs issue 24's cases, one fresh cluster each, in
// parallel with each other and with the other cases, as many clusters at
// once as -parallel allows. The paused node is often the etcd leader: at
// its unpause it revokes the leases it saw expire while frozen, which the
// other nodes' lease rotation makes harmless (docs/cluster.md, "A deposed
// etcd leader's revokes").
func TestComposeStall(t *testing.T) {
	t.Parallel()
	for _, sc := range stallCases {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			testStall(t, sc)
		})
	}
}

func testStall(t *testing.T, sc stallCase) {
	c := startCluster(t, "stall-"+sc.name)
	l := startLoad(c, clientSpec{kind: "small", model: "small", clients: 20, ingresses: []string{"node-3"}})
	waitBusy(t, l, "small", 14, 2)

	// Whether the faulted node led etcd decides what its fault costs the
	// catalog (an election; for a pause, the revokes of a deposed leader).
	leader := c.etcdLeader("node-3")
	var at, back time.Time
	switch sc.how {
	case "pause":
		at = c.pause(sc.node)
		time.Sleep(time.Until(at.Add(stallHold)))
		back = c.unpause(sc.node)
	case "kill":
		at, _ = c.kill(sc.node)
		time.Sleep(time.Until(at.Add(stallHold)))
		back = c.start(sc.node)
	case "disconnect":
		at = c.disconnect(sc.node)
		time.Sleep(time.Until(at.Add(stallHold)))
		back = c.connect(sc.node)
	}
	online, onlineErr := poll(2*leaseTTL, func() error {
		if r := readyz(c, sc.node); !strings.HasPrefix(r, "200") {
			return fmt.Errorf("%s /readyz: %s", sc.node, r)
		}
		return allOnline(c)()
	})
	if onlineErr != nil {
		t.Errorf("%s is not back %v after the fault ended: %v", sc.node, 2*leaseTTL, onlineErr)
	}
	l.drain(jobTTL + 5*time.Second)

	role := "worker-2's host"
	if sc.dispatcher {
		role = "the queue's dispatcher, worker-1's host"
	}
	led := newLedger(c, "stall-"+sc.name, fmt.Sprintf("docker %s %s (%s; etcd leader %s) for %v, under 20 clients of small jobs on node-3", sc.how, sc.node, role, leader, stallHold), at, l.snapshot(), nil)
	led.note("%s back (docker %s) %v after the fault; ready, and three nodes online with three consumers in every view, %v later",
		sc.node, map[string]string{"pause": "unpause", "kill": "start", "disconnect": "network connect"}[sc.how], back.Sub(at).Round(time.Millisecond), online.Round(time.Millisecond))
	res := led.stall(at, at.Add(stallHold), "small", map[string]string{"worker-1": "node-1", "worker-2": "node-2"}, sc.node, back)
	led.note("%s", stallLine(res))
	faulted := "worker-" + strings.TrimPrefix(sc.node, "node-")
	led.mustComplete(t, "small jobs in flight with output on the worker whose host lived", func(j loadJob, rs []jobRun) bool {
		return j.OutputBy(at) && lastWorker(rs) != faulted && lastWorker(rs) != ""
	})
	// Issue 24 (and 12): nothing is refused, and no job fails, while a
	// capable worker lives — one small worker lives throughout. A job that
	// ended worker_lost after output from the faulted node's worker is the
	// right end; any other refusal or error of a job posted after the
	// fault is not.
	var turnedAway []string
	for _, j := range led.jobs {
		if j.SubmitAt.Before(at) {
			continue
		}
		switch {
		case j.Status != 0 && j.Status != 200:
			turnedAway = append(turnedAway, fmt.Sprintf("%s refused %d %s", j.Ingress, j.Status, j.Refusal))
		case j.Terminal == "error" && !(j.Code == "worker_lost" && j.OutputBy(j.EndAt) && lastWorker(led.runs[j.ID]) == faulted):
			turnedAway = append(turnedAway, fmt.Sprintf("%s failed %s: %s", j.ID, j.Code, j.Detail))
		}
	}
	led.note("jobs posted after the fault refused or failed while worker-%s lived (must be 0): %d", map[bool]string{true: "2", false: "1"}[sc.dispatcher], len(turnedAway))
	led.check(t, func(j loadJob) time.Duration {
		if j.OutputBy(at) {
			return leaseTTL + 2*peerHeartbeat + slack
		}
		return untilTTL(j, at)
	})
	if len(turnedAway) > 0 {
		t.Errorf("%d jobs posted after the fault were refused or failed while a capable worker lived; the first: %s", len(turnedAway), turnedAway[0])
	}
	bound, why := 2*peerHeartbeat, "2 peer heartbeats: a worker host"
	if sc.dispatcher {
		bound, why = 4*peerHeartbeat, "4 peer heartbeats: the dispatcher's node"
	}
	issue24(t, res, bound, why)
	if sc.dispatcher {
		// As the fault suite's "held" (docs/faults.md): once the queue is
		// taken over no new job waits on at the old dispatcher while
		// later ones run.
		verdict := "met"
		if res.Overtaken > bound+slack {
			verdict = "missed"
		}
		t.Logf("issue 24's target for a dispatcher's fault: no new job held while later ones run for more than %v + %v slack; measured %v (%s): %s",
			bound, slack, res.Overtaken.Round(time.Millisecond), res.OvertakenID, verdict)
	}
}

// etcdLeader names the node whose etcd member leads, as svc's catalog
// says (GET /v1/cluster/members), or why it cannot tell.
func (c *cluster) etcdLeader(svc string) string {
	var l struct {
		Members []struct {
			Name   string `json:"name"`
			Leader bool   `json:"leader"`
		} `json:"members"`
	}
	if err := c.getJSON(svc, "/v1/cluster/members", &l); err != nil {
		return "unknown (" + err.Error() + ")"
	}
	for _, m := range l.Members {
		if m.Leader {
			return m.Name
		}
	}
	return "none"
}

// pause freezes a container (docker pause: the cgroup freezer, as SIGSTOP
// does to a process): its sockets stay open and nothing answers.
func (c *cluster) pause(svc string) time.Time {
	at := time.Now()
	c.docker("pause", c.id(svc))
	return at
}

func (c *cluster) unpause(svc string) time.Time {
	at := time.Now()
	c.docker("unpause", c.id(svc))
	return at
}

// stall measures issue 24's figures over [from, to) for the jobs of kind,
// whose workers are the keys of hosts (worker → its node); the worker of
// faulted is down from from until back.
func (l *ledger) stall(from, to time.Time, kind string, hosts map[string]string, faulted string, back time.Time) stall.Result {
	var jobs []stall.Job
	for _, j := range l.jobs {
		if j.kind != kind {
			continue
		}
		sj := stall.Job{ID: j.ID, Posted: j.SubmitAt, Ended: j.EndAt}
		if j.ID != "" {
			for _, r := range l.runs[j.ID] {
				sj.Runs = append(sj.Runs, r.record())
			}
		}
		jobs = append(jobs, sj)
	}
	var runs []stall.Run
	for _, rs := range l.runs {
		for _, r := range rs {
			if _, ok := hosts[r.worker]; ok {
				runs = append(runs, r.record())
			}
		}
	}
	var workers []stall.Worker
	for w, node := range hosts {
		sw := stall.Worker{Name: w, Slots: stallSlots}
		if node == faulted {
			sw.DownFrom, sw.DownTo = from, back
		}
		workers = append(workers, sw)
	}
	return stall.Measure(from, to, jobs, runs, workers)
}

// stallLine is the ledger's note of the stall figures.
func stallLine(r stall.Result) string {
	first := "no job posted after the fault started on a live worker"
	if r.FirstStart >= 0 {
		first = fmt.Sprintf("%v (on %s)", r.FirstStart.Round(time.Millisecond), r.FirstWorker)
	}
	return fmt.Sprintf("stall over the hold: first start of a new job on a live worker %s; longest stall %v (%d new jobs waiting, %d live slots free); longest wait of new jobs with no start, slots busy or not, %v; the new job that waited longest for its first run %v (%s); the longest a new job waited after a later one had started on a live worker %v (%s)",
		first, r.Longest.Round(time.Millisecond), r.LongestWaiting, r.LongestFree, r.LongestGap.Round(time.Millisecond), r.LongestWait.Round(time.Millisecond), r.LongestWaitID,
		r.Overtaken.Round(time.Millisecond), r.OvertakenID)
}

// issue24 logs the longest stall against issue 24's target, which these
// tests print and do not hold the cluster to (see the top of this file).
// The first start of a new job is printed without a verdict: under a
// saturating load a new job queues behind those posted before the fault,
// whatever the cluster does.
func issue24(t *testing.T, r stall.Result, bound time.Duration, why string) {
	verdict := "met"
	if r.Longest > bound+slack {
		verdict = "missed"
	}
	t.Logf("issue 24's target: longest stall ≤ %v (%s) + %v slack; measured %v: %s (first start of a new job on a live worker: %v)",
		bound, why, slack, r.Longest.Round(time.Millisecond), verdict, r.FirstStart.Round(time.Millisecond))
}
