//go:build faults

package integration_test

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/worker"
)

// The catalog's membership as an operator changes it (docs/membership.md),
// under the rolling restart's load (make test-restart runs both): the
// fault suite's cluster a, b, c of the real binary, workers wb on b and wc
// on c, 30 clients streaming jobs through a and b, and in turn:
//
//  1. replace c: SIGTERM, its data directory deleted, started again under
//     the same name: it replaces its own member (remove, add as a learner,
//     promote) by itself;
//  2. move c: SIGTERM, started again on its data at another address
//     (its peer and etcd ports on 127.0.0.2): it updates its member's
//     peer URL, and comes back online, unfenced;
//  3. grow to 5: `switchyard members add` for d, d started with the flags
//     it printed, then the same for e;
//  4. shrink to 3: SIGTERM e, `switchyard members remove e`, then d.
//
// The member list (`switchyard members list`) is logged after each step,
// and the load's ledger per step, with the rolling restart's targets: no
// job lost, failed, refused or run twice.
func TestMembership(t *testing.T) {
	// Loopback mode whatever the machine allows: the move puts c on
	// 127.0.0.2, which only nodes sharing the host's loopback reach, and
	// no step needs a partition.
	t.Setenv("FAULTS_LOOPBACK", "1")
	bin := buildSwitchyard(t)
	fnet := newFaultNet(t, []string{"a", "b", "c"})
	cl := startFaultCluster(t, bin, fnet, restartTiming)
	runs := &runLog{}
	workerNode := map[string]string{"wc": "c", "wb": "b"}
	for _, name := range []string{"wc", "wb"} {
		startProcWorker(t, cl.nodes[workerNode[name]], worker.Config{Name: name, Queue: restartQueue, Concurrency: restartSlots, MaxBackoff: 500 * time.Millisecond},
			runs.handler(name, runPlan{think: restartThink, outputs: restartOutputs, every: restartEvery}))
	}
	poll(t, 20*time.Second, "wb and wc in a's view", func() bool {
		q, err := cl.queue("a", restartQueue)
		return err == nil && q.hasConsumers("wb", "wc")
	})
	members := func(step string) string {
		t.Helper()
		out := membersCmd(t, bin, cl.nodes["a"], "list")
		t.Logf("members %s:\n%s", step, out)
		return out
	}
	members("at the start")

	load := startLoad(t, []*procNode{cl.nodes["a"], cl.nodes["b"]}, restartQueue, restartClients, restartJobTime/restartClients, restartTTL)
	loadStart := time.Now()
	time.Sleep(restartJobTime + restartSettle)
	var steps []restartStep
	var counts [][2]int
	step := func(st restartStep) {
		steps = append(steps, st)
		members("after " + st.label)
		var l struct {
			Members []struct{ Learner, Healthy bool }
		}
		if err := json.Unmarshal([]byte(membersCmd(t, bin, cl.nodes["a"], "list", "--json")), &l); err != nil {
			t.Fatal(err)
		}
		var voters, healthy int
		for _, m := range l.Members {
			if !m.Learner {
				voters++
				if m.Healthy {
					healthy++
				}
			}
		}
		counts = append(counts, [2]int{voters, healthy})
		time.Sleep(restartSettle)
	}

	// 1. Replace c: its data directory is lost.
	c := cl.nodes["c"]
	step(memberRestart(t, cl, "c", "replace c", func() {
		dir := argOf(c.spec.args, "--data-dir")
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
	}))
	if log := c.ownLog(); !strings.Contains(log, "replacing that member") || !strings.Contains(log, "promoted to a voting member") {
		t.Errorf("c did not log replacing its member:\n%s", tail(log, 30))
	}

	// 2. Move c to another address, on its data: the addresses the cluster
	// reaches it at (the node's peer port, its etcd member's ports) move
	// to 127.0.0.2; the ones its worker and clients use stay, as a name
	// behind DNS or a load balancer would.
	step(memberRestart(t, cl, "c", "move c", func() {
		oldPeer := argOf(c.spec.args, "--etcd-peer-addr")
		newPeer := freeAddrOn(t, "127.0.0.2")
		setArg(c.spec.args, "--etcd-peer-addr", newPeer)
		setArg(c.spec.args, "--etcd-client-addr", freeAddrOn(t, "127.0.0.2"))
		setArg(c.spec.args, "--peer-addr", freeAddrOn(t, "127.0.0.2"))
		setArg(c.spec.args, "--initial-cluster", strings.Replace(argOf(c.spec.args, "--initial-cluster"), "c=https://"+oldPeer, "c=https://"+newPeer, 1))
	}))
	if log := c.ownLog(); !strings.Contains(log, "member entry updated") {
		t.Errorf("c did not log updating its member entry:\n%s", tail(log, 30))
	}
	if !cl.ready("c") {
		t.Errorf("c is not ready after its move")
	}

	// 3. Grow to 5.
	for _, name := range []string{"d", "e"} {
		step(memberGrow(t, cl, bin, name))
	}
	// 4. Shrink to 3.
	for _, name := range []string{"e", "d"} {
		step(memberShrink(t, cl, bin, name))
	}

	loadStop := time.Now()
	load.Stop()
	load.Drain(restartTTL + 5*time.Second)
	settleRunLog(runs)
	rl := newRestartLedger(load.snapshot(), runs.all(), steps, loadStart, loadStop)
	var b strings.Builder
	fmt.Fprintf(&b, "membership under load: %d clients, each job %v thinking then %d outputs %v apart, %d slots on wb (b) and wc (c); %s\n",
		restartClients, restartThink, restartOutputs, restartEvery, restartSlots, restartTiming)
	for _, s := range steps {
		fmt.Fprintf(&b, "  %-9s took %v (%s)\n", s.label, s.back.Sub(s.sigterm).Round(time.Millisecond), s.drainLog)
	}
	rl.table(&b)
	t.Log(b.String())
	rl.assert(t)

	// The member lists after each step: 3, 3, 4, 5, 4, 3 voters, all
	// healthy.
	for i, want := range []int{3, 3, 4, 5, 4, 3} {
		if counts[i] != [2]int{want, want} {
			t.Errorf("after %s: %d voters, %d healthy; want %d healthy voters", steps[i].label, counts[i][0], counts[i][1], want)
		}
	}
}

// memberRestart stops a node with SIGTERM, runs change, starts it again and
// waits until it is back as restartNode does.
func memberRestart(t *testing.T, cl *faultCluster, name, label string, change func()) restartStep {
	t.Helper()
	n := cl.nodes[name]
	st := restartStep{node: name, label: label}
	var exited time.Time
	st.sigterm, exited, st.code = n.terminate(restartTiming.drain + 15*time.Second)
	st.exited = exited
	change()
	n.relaunch(t)
	n.awaitServing(t, 60*time.Second)
	st.serving = time.Now()
	w := map[string]string{"b": "wb", "c": "wc"}[name]
	poll(t, 30*time.Second, name+" back in a's view", func() bool {
		states, err := cl.states("a")
		if err != nil || states[name] != "online" {
			return false
		}
		q, err := cl.queue("a", restartQueue)
		return err == nil && (w == "" || q.hasConsumers(w) && registeredAfter(cl, "a", w, name))
	})
	st.back = time.Now()
	st.drainLog = fmt.Sprintf("SIGTERM → exit %v, → serving %v, → online with its worker %v",
		st.exited.Sub(st.sigterm).Round(time.Millisecond), st.serving.Sub(st.exited).Round(time.Millisecond), st.back.Sub(st.serving).Round(time.Millisecond))
	return st
}

// memberGrow adds name's member with `switchyard members add` and starts
// the node with the flags it printed; back: the node online in a's view.
func memberGrow(t *testing.T, cl *faultCluster, bin, name string) restartStep {
	t.Helper()
	st := restartStep{node: name, label: "grow " + name, sigterm: time.Now()}
	etcdPeer := freeAddr(t)
	var added struct {
		Flags []string `json:"flags"`
	}
	out := membersCmd(t, bin, cl.nodes["a"], "add", "--json", "--name", name, "--peer-url", "https://"+etcdPeer)
	if err := json.Unmarshal([]byte(out), &added); err != nil {
		t.Fatalf("members add: %v: %s", err, out)
	}
	st.exited = time.Now()
	args := append([]string{"node"}, added.Flags...)
	args = append(args, "--http-addr", freeAddr(t), "--grpc-addr", freeAddr(t), "--peer-addr", freeAddr(t),
		"--data-dir", filepath.Join(t.TempDir(), name), "--etcd-client-addr", freeAddr(t),
		"--cluster-secret", testSecret, "--log-level", "info", "--allow-anonymous")
	args = append(args, restartTiming.flags()...)
	n := launchProc(t, procSpec{name: name, bin: bin, args: args, log: filepath.Join(t.TempDir(), name+".log"), tailLines: 40})
	cl.nodes[name] = n
	n.awaitServing(t, 60*time.Second)
	st.serving = time.Now()
	poll(t, 30*time.Second, name+" online in a's view", func() bool {
		states, err := cl.states("a")
		return err == nil && states[name] == "online"
	})
	st.back = time.Now()
	if log := n.ownLog(); !strings.Contains(log, "promoted to a voting member") {
		t.Errorf("%s did not log its promotion:\n%s", name, tail(log, 30))
	}
	st.drainLog = fmt.Sprintf("members add %v, → serving (joined, promoted) %v, → online %v",
		st.exited.Sub(st.sigterm).Round(time.Millisecond), st.serving.Sub(st.exited).Round(time.Millisecond), st.back.Sub(st.serving).Round(time.Millisecond))
	return st
}

// memberShrink stops name with SIGTERM and removes its member with
// `switchyard members remove`.
func memberShrink(t *testing.T, cl *faultCluster, bin, name string) restartStep {
	t.Helper()
	n := cl.nodes[name]
	st := restartStep{node: name, label: "shrink " + name}
	st.sigterm, st.exited, st.code = n.terminate(restartTiming.drain + 15*time.Second)
	membersCmd(t, bin, cl.nodes["a"], "remove", "--member", name)
	st.serving = time.Now()
	st.back = st.serving
	st.drainLog = fmt.Sprintf("SIGTERM → exit %v, members remove %v", st.exited.Sub(st.sigterm).Round(time.Millisecond), st.serving.Sub(st.exited).Round(time.Millisecond))
	return st
}

// membersCmd runs `switchyard members <args>` against n and returns its
// output, failing the test on an error.
func membersCmd(t *testing.T, bin string, n *procNode, args ...string) string {
	t.Helper()
	argv := append([]string{"members", args[0], "--url", "http://" + n.http}, args[1:]...)
	out, err := exec.Command(bin, argv...).CombinedOutput()
	if err != nil {
		t.Fatalf("switchyard %s: %v\n%s", strings.Join(argv, " "), err, out)
	}
	return string(out)
}

// argOf is the value after flag in args.
func argOf(args []string, flag string) string {
	if i := slices.Index(args, flag); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	return ""
}

// setArg sets the value after flag in args.
func setArg(args []string, flag, value string) {
	if i := slices.Index(args, flag); i >= 0 && i+1 < len(args) {
		args[i+1] = value
	}
}

// freeAddrOn is host:port with a port free on host a moment ago.
func freeAddrOn(t *testing.T, host string) string {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
