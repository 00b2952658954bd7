//go:build faults

package integration_test

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The fault suite (docs/faults.md): the real binary as a 3-node cluster, a,
// b and c, each an embedded etcd member; SDK workers in this process on b
// and c, recording every run; a closed loop of streamed jobs posted to a.
// One fault per run, then a ledger of what the requesters and the workers
// saw, checked against the targets of issue 12 (faults_targets_test.go).
//
// It is behind the faults build tag: it needs root for its partitions, it
// takes minutes, and it measures behaviour that is being built. Run it with
// make faults (each case once) or make soak-faults (the partition and
// leader cases FAULT_RUNS times each).

// The load and the job shape. A job thinks for a second (no output: a run
// in that phase is a job "without output" when the fault hits), then
// streams 40 outputs 100ms apart: 4.9s in all, longer than the heartbeat
// bound, so a job that should have been stopped at silence is seen running
// on. Each worker host has 8 slots and there are 16 clients: both hosts are
// busy, and when one goes its jobs wait in the queue.
const (
	faultQueue   = "faults"
	faultClients = 16
	workerSlots  = 8
	jobThink     = time.Second
	jobOutputs   = 40
	jobEvery     = 100 * time.Millisecond
	jobRunTime   = jobThink + (jobOutputs-1)*jobEvery
	// jobTTL leaves a job in flight at the fault time to be redelivered
	// after the longest proof of death (the etcd leader's partition: lease
	// TTL + 3.1s + a heartbeat, 9.6s) and then run (4.9s), and a job
	// posted during that wait time to queue behind the returned ones on
	// the half of the slots that is left: 15s did not, so the leader case
	// failed jobs by their TTL that the rules would have completed.
	jobTTL = 20 * time.Second
)

// faultSlack is added to every timing bound before it is asserted: three
// node processes, the workers and the clients (under -race) share two cores
// with other work, so a timer can fire, and a goroutine run, hundreds of
// milliseconds late. The raw figure is always printed.
const faultSlack = 2 * time.Second

// faultHold is how long a pause or a partition lasts: longer than the
// lease, so the cluster must prove the node dead and the node must come
// back from a fence.
var faultHold = suiteTiming.leaseTTL * 3 / 2

// faultCase is one fault.
type faultCase struct {
	name, what string
	// netns: the case needs network namespaces (a partition).
	netns bool
	// silent: the faulted node falls silent to the others (killed, paused,
	// restarted, partitioned); its in-flight jobs are judged by the
	// heartbeat and proven-death bounds.
	silent bool
	// ingress: the faulted node is the requesters' ingress.
	ingress bool
	// returns: the faulted node comes back (SIGCONT, heal, restart); it
	// must be online and take work again.
	returns bool
	// noQuorum: no node can reach an etcd quorum during the fault.
	noQuorum bool
	// incarnation: the faulted node comes back under the same name before
	// its lease ends; its new process serving proves the old one dead.
	incarnation bool
	// clients is the size of the closed loop (0: faultClients). More than
	// the slots of the two worker hosts makes a saturating load: jobs wait
	// in the queue all the time, and more so once a host is gone.
	clients int
	// dispatcher: the target is the queue's dispatcher (its node).
	dispatcher bool
	// migrate: a job that opted into "on_worker_lost": "restart" streams
	// from the target's worker when the fault hits (faults_migrate_test.go).
	migrate bool
	// leaderLost: the faulted node is the etcd leader and its members lose
	// it: the survivors elect a new leader, and etcd's new leader extends
	// every lease on promotion (lessor.Promote), the faulted node's with
	// them, so its death is proven that much later (faultBounds).
	leaderLost bool
	// prepare sets roles before the load starts: where the etcd leader is.
	// A kill or pause of the leader's node also costs an etcd election,
	// during which no lease is renewed and after which every lease is
	// extended, the dead node's with them: the cases that are not about the
	// leader keep it away from their target, so they measure one thing.
	prepare func(fx *faultRun)
	// target is the node the fault is aimed at, from the roles.
	target func(fx *faultRun) string
	// inject applies the fault to fx.target (and heals it), setting
	// fx.faultAt, fx.recoverAt, fx.faulted and fx.killed.
	inject func(fx *faultRun)
}

var faultCases = []faultCase{
	{
		name: "kill-worker-host", what: "SIGKILL of the worker host that does not dispatch the queue (the etcd leader is a)",
		silent: true, target: (*faultRun).otherHost, prepare: leaderOn("a"), inject: (*faultRun).kill,
	},
	{
		name: "kill-dispatcher", what: "SIGKILL of the queue's dispatcher (from GET /v1/queues), also a worker host (the etcd leader is a)",
		silent: true, dispatcher: true, target: (*faultRun).dispatcherNode, prepare: leaderOn("a"), inject: (*faultRun).kill,
	},
	{
		name: "kill-ingress", what: "SIGKILL of the ingress a; its clients fail over to b (the etcd leader is b)",
		silent: true, ingress: true, target: func(*faultRun) string { return "a" }, prepare: leaderOn("b"), inject: (*faultRun).kill,
	},
	{
		name: "pause-dispatcher", what: "SIGSTOP of the dispatcher's node (a worker host) for 1.5 lease TTLs, then SIGCONT (the etcd leader is a)",
		silent: true, returns: true, dispatcher: true, target: (*faultRun).dispatcherNode, prepare: leaderOn("a"), inject: (*faultRun).pause,
	},
	{
		name: "pause-leader-dispatcher", what: "SIGSTOP of the node that is both the etcd leader (moved there first) and the queue's dispatcher, for 1.5 lease TTLs, then SIGCONT: the survivors elect a new leader and renew their leases with it; at SIGCONT the old leader's lessor finds every lease expired in its own view",
		silent: true, returns: true, leaderLost: true, dispatcher: true, target: (*faultRun).dispatcherNode, prepare: leaderOnTarget, inject: (*faultRun).pause,
	},
	{
		name: "pause-worker-host", what: "SIGSTOP of the worker host that does not dispatch, for 1.5 lease TTLs, under a saturating load (20 clients for 16 slots: jobs wait in the queue all along), then SIGCONT (the etcd leader is a)",
		silent: true, returns: true, clients: 20, target: (*faultRun).otherHost, prepare: leaderOn("a"), inject: (*faultRun).pause,
	},
	{
		name: "restart-worker-host", what: "SIGKILL of the worker host that does not dispatch, and at once a new process under the same name, data directory and addresses, inside its lease (the etcd leader is a)",
		silent: true, returns: true, incarnation: true, target: (*faultRun).otherHost, prepare: leaderOn("a"), inject: (*faultRun).restart,
	},
	{
		name: "migrate-kill-worker-host", what: "SIGKILL of the worker host that does not dispatch while a job posted with \"on_worker_lost\": \"restart\" streams from it (the etcd leader is a)",
		silent: true, migrate: true, target: (*faultRun).otherHost, prepare: func(fx *faultRun) { leaderOn("a")(fx); fx.requireRestartField() },
		inject: (*faultRun).killUnderMigratingJob,
	},
	{
		name: "etcd-one", what: "loss of one etcd member, the leader (moved there first): the etcd link of the worker host that does not dispatch cut for 1.5 lease TTLs (its peer link stays up), then healed",
		netns: true, returns: true, target: (*faultRun).otherHost, prepare: leaderOnTarget,
		inject: func(fx *faultRun) { fx.partition(linkEtcd) },
	},
	{
		name: "etcd-two", what: "loss of two etcd members: b's and c's etcd links cut for 1.5 lease TTLs (no quorum anywhere; the etcd leader was c), then healed",
		netns: true, returns: true, noQuorum: true, target: func(*faultRun) string { return "b+c" }, prepare: leaderOn("c"),
		inject: (*faultRun).loseTwoMembers,
	},
	{
		name: "partition-worker-host", what: "network partition of the worker host that does not dispatch (its cluster and etcd links down) for 1.5 lease TTLs, then healed (the etcd leader is a)",
		netns: true, silent: true, returns: true, target: (*faultRun).otherHost, prepare: leaderOn("a"),
		inject: func(fx *faultRun) { fx.partition(linkCluster, linkEtcd) },
	},
	{
		name: "partition-leader-dispatcher", what: "network partition of the node that is both the etcd leader (moved there first) and the queue's dispatcher (its cluster and etcd links down) for 1.5 lease TTLs, then healed",
		netns: true, silent: true, returns: true, leaderLost: true, dispatcher: true, target: (*faultRun).dispatcherNode, prepare: leaderOnTarget,
		inject: func(fx *faultRun) { fx.partition(linkCluster, linkEtcd) },
	},
}

// leaderOn is a prepare that moves the etcd leadership to node.
func leaderOn(node string) func(*faultRun) {
	return func(fx *faultRun) { fx.cl.moveEtcdLeader(fx.t, node) }
}

// leaderOnTarget is a prepare that moves the etcd leadership to the
// case's target.
func leaderOnTarget(fx *faultRun) { fx.cl.moveEtcdLeader(fx.t, fx.c.target(fx)) }

// soakCases are repeated by TestFaultsSoak: the partitions, the loss of the
// etcd leader and its pause, whose outcome depends on timing.
var soakCases = []string{"partition-worker-host", "partition-leader-dispatcher", "etcd-one", "pause-leader-dispatcher"}

// TestFaults runs each case once, one after the other (make faults).
// FAULT_CASES, a regular expression, picks cases by name.
func TestFaults(t *testing.T) {
	bin := buildSwitchyard(t)
	t.Logf("fault suite: %s", suiteSettings())
	pick := regexp.MustCompile(os.Getenv("FAULT_CASES"))
	var summary []string
	for _, c := range faultCases {
		if pick.MatchString(c.name) {
			r := runCase(t, c.name, bin, c)
			summary = append(summary, fmt.Sprintf("  %-28s %s", c.name, r))
		}
	}
	t.Logf("fault suite summary:\n%s", strings.Join(summary, "\n"))
}

// TestFaultsSoak repeats the soak cases FAULT_RUNS times each and prints how
// many runs passed (make soak-faults).
func TestFaultsSoak(t *testing.T) {
	runs, err := strconv.Atoi(os.Getenv("FAULT_RUNS"))
	if err != nil || runs < 1 {
		t.Skip("set FAULT_RUNS (make soak-faults sets it) to repeat the partition and leader cases")
	}
	bin := buildSwitchyard(t)
	t.Logf("fault soak: %d runs of each of %v; %s", runs, soakCases, suiteSettings())
	var summary []string
	for _, name := range soakCases {
		c := faultCases[slices.IndexFunc(faultCases, func(c faultCase) bool { return c.name == name })]
		ran, passed := 0, 0
		missed := map[string]int{}
		for i := range runs {
			r := runCase(t, fmt.Sprintf("%s/run-%d", name, i+1), bin, c)
			if r.skipped {
				break
			}
			ran++
			if r.ok && len(r.failed) == 0 {
				passed++
			}
			for _, f := range r.failed {
				missed[f]++
			}
			if !r.ok && len(r.failed) == 0 {
				missed["no ledger (see its log)"]++
			}
		}
		if ran == 0 {
			summary = append(summary, fmt.Sprintf("  %-28s skipped (see its log)", name))
			continue
		}
		summary = append(summary, fmt.Sprintf("  %-28s %d of %d runs passed; missed targets, in how many runs: %s", name, passed, ran, fmtCounts(missed)))
	}
	t.Logf("fault soak summary:\n%s", strings.Join(summary, "\n"))
}

// caseResult is how one run of a case went.
type caseResult struct {
	// ran: the subtest ran (-run may leave it out).
	ran, ok, skipped bool
	failed           []string // the targets it missed
}

func (r caseResult) String() string {
	switch {
	case !r.ran:
		return "not run (-run)"
	case r.skipped:
		return "skipped (see its log)"
	case r.ok && len(r.failed) > 0:
		return "passed; missed, reported only: " + strings.Join(r.failed, ", ")
	case r.ok:
		return "passed"
	case len(r.failed) == 0:
		return "FAILED before its ledger (see its log)"
	}
	return "FAILED: " + strings.Join(r.failed, ", ")
}

// runCase runs c as the subtest name.
func runCase(t *testing.T, name, bin string, c faultCase) caseResult {
	var r caseResult
	r.ok = t.Run(name, func(t *testing.T) {
		r.ran = true
		defer func() { r.skipped = t.Skipped() }()
		r.failed = runFault(t, bin, c)
	})
	return r
}

func suiteSettings() string {
	return fmt.Sprintf("%s; %d clients (unless a case says otherwise), each job %v of thought then %d outputs %v apart (%v), ttl %v; %d slots per worker host; faults held %v; timing slack %v",
		suiteTiming, faultClients, jobThink, jobOutputs, jobEvery, jobRunTime, jobTTL, workerSlots, faultHold, faultSlack)
}

// runFault runs one case and returns the targets it missed.
func runFault(t *testing.T, bin string, c faultCase) []string {
	if why := netnsUnavailable(); c.netns && why != "" {
		t.Skipf("%s needs network namespaces: %s (root and iproute2 are needed; CI has both)", c.name, why)
	}
	fnet := newFaultNet(t, []string{"a", "b", "c"})
	fx := &faultRun{t: t, c: c, timing: suiteTiming, net: fnet, runs: &runLog{}, workerNode: map[string]string{}, clients: c.clients}
	if fx.clients == 0 {
		fx.clients = faultClients
	}
	fx.cl = startFaultCluster(t, bin, fnet, suiteTiming)
	fx.startWorkers()
	if c.prepare != nil {
		c.prepare(fx)
	}
	fx.obs = startObserver(t, fx.cl, "a", "b", "c")
	fx.load = startLoad(t, []*procNode{fx.cl.nodes["a"], fx.cl.nodes["b"]}, faultQueue, fx.clients, jobRunTime/time.Duration(fx.clients), jobTTL)
	fx.warmUp()
	c.inject(fx)
	fx.observe()
	fx.load.Stop()
	fx.load.Drain(jobTTL + 5*time.Second)
	if fx.mig != nil {
		fx.mig.g.Stop()
		fx.mig.g.Drain(jobTTL + 5*time.Second)
	}
	fx.settleRuns()
	l := newLedger(fx)
	t.Log(l.String())
	return l.assert(t)
}

// --- faults ---

func (fx *faultRun) kill() {
	target := fx.target
	fx.faultAt = fx.cl.nodes[target].kill9()
	fx.recoverAt = fx.faultAt
	fx.faulted, fx.killed = []string{target}, []string{target}
	fx.note(fx.faultAt, "SIGKILL "+target)
}

func (fx *faultRun) pause() {
	target := fx.target
	n := fx.cl.nodes[target]
	fx.faultAt = n.signal(syscall.SIGSTOP)
	fx.faulted = []string{target}
	fx.note(fx.faultAt, "SIGSTOP "+target)
	time.Sleep(faultHold)
	fx.recoverAt = n.signal(syscall.SIGCONT)
	fx.note(fx.recoverAt, "SIGCONT "+target)
}

func (fx *faultRun) restart() {
	target := fx.target
	n := fx.cl.nodes[target]
	fx.faultAt = n.restart(fx.t)
	fx.recoverAt = fx.faultAt
	fx.faulted, fx.killed = []string{target}, []string{target}
	fx.note(fx.faultAt, "SIGKILL "+target+" and start it again")
	n.awaitServing(fx.t, 30*time.Second)
	fx.servingAt = time.Now()
	fx.note(fx.servingAt, target+" serving again (its log says so)")
}

// partition cuts the target's links, holds, and heals them.
func (fx *faultRun) partition(links ...netLink) {
	target := fx.target
	fx.faulted = []string{target}
	fx.faultAt = time.Now()
	if err := fx.net.cut(target, links...); err != nil {
		fx.t.Fatal(err)
	}
	fx.note(fx.faultAt, fmt.Sprintf("%s: links %v down", target, links))
	time.Sleep(faultHold)
	fx.recoverAt = time.Now()
	if err := fx.net.heal(target, links...); err != nil {
		fx.t.Fatal(err)
	}
	fx.note(fx.recoverAt, fmt.Sprintf("%s: links %v up", target, links))
}

func (fx *faultRun) loseTwoMembers() {
	fx.faulted = []string{"a", "b", "c"}
	fx.faultAt = time.Now()
	for _, n := range []string{"b", "c"} {
		if err := fx.net.cut(n, linkEtcd); err != nil {
			fx.t.Fatal(err)
		}
	}
	fx.note(fx.faultAt, "b and c: etcd links down")
	time.Sleep(faultHold)
	fx.recoverAt = time.Now()
	for _, n := range []string{"b", "c"} {
		if err := fx.net.heal(n, linkEtcd); err != nil {
			fx.t.Fatal(err)
		}
	}
	fx.note(fx.recoverAt, "b and c: etcd links up")
}
