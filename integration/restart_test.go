//go:build faults

package integration_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/worker"
)

// The rolling restart (make test-restart, in CI): what an operator does for
// every deploy, under load, on the real binary. The fault suite's cluster
// (a, b, c, embedded etcd members), workers wb on b and wc on c recording
// every run, a closed loop of streamed jobs posted to a; then SIGTERM and a
// new process, one node at a time: c (the queue's dispatcher), b, a (the
// requesters' ingress). A node exits once it has drained; the next is
// restarted once the previous one is back and its worker registered again.
//
// The ledger is per window of submission time: before the first SIGTERM,
// each restart (from its SIGTERM to the next), after the last. Targets:
// every stream ends with one terminal event; no job runs twice by the
// workers' own record; no job fails; nothing is refused or cut while b or c
// restarts, and while a restarts only the requesters' connections to a are
// touched (draining refusals and transport errors, after which a client
// moves to b, as behind a load balancer); a refused job never reached a
// worker; every job in flight at a SIGTERM completes.

// The load. A job thinks 300ms (no output: the restart catches some jobs
// before their output), then streams 12 outputs 100ms apart: 1.4s. 30
// clients against 2 × 8 slots, so jobs always wait in the queue: a restart
// finds jobs running on its node, bound there, and waiting on its
// dispatcher.
const (
	restartQueue   = "restart"
	restartClients = 30
	restartSlots   = 8
	restartThink   = 300 * time.Millisecond
	restartOutputs = 12
	restartEvery   = 100 * time.Millisecond
	restartJobTime = restartThink + (restartOutputs-1)*restartEvery
	restartTTL     = 20 * time.Second
	// restartSettle is how long the load runs between a node being back and
	// the next SIGTERM, and before the first and after the last.
	restartSettle = 3 * time.Second
)

// restartTiming is the fault suite's, with a drain timeout well above a
// job's run: a drain that times out is a failure here, not a bound.
var restartTiming = func() faultTiming {
	ft := suiteTiming
	ft.drain = 10 * time.Second
	return ft
}()

// restartStep is one node's restart, as measured.
type restartStep struct {
	node string
	// label names the step's window ("restart <node>" when empty).
	label string
	// sigterm: the signal; exited: the process exited (code); serving: the
	// new process logged that it serves; back: its worker is registered
	// again in a's view, and the node is online in it.
	sigterm, exited, serving, back time.Time
	code                           int
	dispatcherBefore               string
	dispatcherDuring               string
	drainLog                       string
}

func TestRollingRestart(t *testing.T) {
	bin := buildSwitchyard(t)
	fnet := newFaultNet(t, []string{"a", "b", "c"})
	cl := startFaultCluster(t, bin, fnet, restartTiming)
	runs := &runLog{}
	workerNode := map[string]string{"wc": "c", "wb": "b"}
	startWorker := func(name string) {
		startProcWorker(t, cl.nodes[workerNode[name]], worker.Config{Name: name, Queue: restartQueue, Concurrency: restartSlots, MaxBackoff: 500 * time.Millisecond},
			runs.handler(name, runPlan{think: restartThink, outputs: restartOutputs, every: restartEvery}))
	}
	startWorker("wc")
	poll(t, 20*time.Second, "c dispatching "+restartQueue, func() bool {
		q, err := cl.queue("a", restartQueue)
		return err == nil && q.Dispatcher == "c" && q.hasConsumers("wc")
	})
	startWorker("wb")
	poll(t, 20*time.Second, "wb and wc in a's view", func() bool {
		q, err := cl.queue("a", restartQueue)
		return err == nil && q.hasConsumers("wb", "wc")
	})

	load := startLoad(t, []*procNode{cl.nodes["a"], cl.nodes["b"]}, restartQueue, restartClients, restartJobTime/restartClients, restartTTL, "draining")
	loadStart := time.Now()
	time.Sleep(restartJobTime + restartSettle)

	var steps []restartStep
	for _, name := range []string{"c", "b", "a"} {
		steps = append(steps, restartNode(t, cl, name))
		time.Sleep(restartSettle)
	}
	loadStop := time.Now()
	load.Stop()
	load.Drain(restartTTL + 5*time.Second)
	settleRunLog(runs)

	rl := newRestartLedger(load.snapshot(), runs.all(), steps, loadStart, loadStop)
	t.Log(rl.String())
	rl.assert(t)
}

// restartNode sends node SIGTERM, waits for it to drain and exit, starts it
// again, and waits until it is back: online in a's view (b's, when a is the
// node), and its worker, if it has one, registered again.
func restartNode(t *testing.T, cl *faultCluster, name string) restartStep {
	t.Helper()
	n := cl.nodes[name]
	view := "a"
	if name == "a" {
		view = "b"
	}
	st := restartStep{node: name}
	if q, err := cl.queue(view, restartQueue); err == nil {
		st.dispatcherBefore = q.Dispatcher
	}
	oldLog := n.ownLog
	var exited time.Time
	st.sigterm, exited, st.code = n.terminate(restartTiming.drain + 15*time.Second)
	st.exited = exited
	st.drainLog = drainLine(oldLog())
	if q, err := cl.queue(view, restartQueue); err == nil {
		st.dispatcherDuring = q.Dispatcher
	}
	n.relaunch(t)
	n.awaitServing(t, 30*time.Second)
	st.serving = time.Now()
	w := map[string]string{"b": "wb", "c": "wc"}[name]
	poll(t, 30*time.Second, name+" back in "+view+"'s view", func() bool {
		states, err := cl.states(view)
		if err != nil || states[name] != "online" {
			return false
		}
		q, err := cl.queue(view, restartQueue)
		return err == nil && (w == "" || q.hasConsumers(w) && registeredAfter(cl, view, w, name))
	})
	st.back = time.Now()
	return st
}

// registeredAfter: the consumer named w in view's queue view lives on node
// (its old record went with the old process's lease).
func registeredAfter(cl *faultCluster, view, w, node string) bool {
	q, err := cl.queue(view, restartQueue)
	if err != nil {
		return false
	}
	n := 0
	for _, c := range q.Consumers {
		if c.Name == w && c.Node == node {
			n++
		}
	}
	return n == 1
}

// drainLine is the node's "drained" log line, or what it logged instead.
func drainLine(log string) string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, `msg=drained`) || strings.Contains(l, "drain timeout") || strings.Contains(l, "undelivered") || strings.Contains(l, "resign") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n    ")
}

// settleRunLog waits a little for the handlers of ended jobs to return.
func settleRunLog(runs *runLog) {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && slices.ContainsFunc(runs.all(), func(r jobRun) bool { return r.end.IsZero() }) {
		time.Sleep(50 * time.Millisecond)
	}
}

// restartWindow is the jobs submitted in one window.
type restartWindow struct {
	name                 string
	from, to             time.Time
	node                 string // the node restarted in it ("" for before and after)
	submitted, done      int
	failed, refused      map[string]int
	postErrs, broken     map[string]int // by ingress
	noTerminal, ranTwice int
}

type restartLedger struct {
	steps   []restartStep
	windows []*restartWindow
	// inflight, per restart: jobs in flight at its SIGTERM, and how they ended.
	inflight []map[string]int
	// onWorker, per restart: the runs of its node's worker going at its
	// SIGTERM, how many completed, and when the last of them ended.
	onWorker, onWorkerDone []int
	onWorkerLast           []time.Duration
	// Examples of what must not happen.
	noTerminal, twice, refusedRan, failedJobs []string
}

func newRestartLedger(jobs []loadJob, runs []jobRun, steps []restartStep, start, stop time.Time) *restartLedger {
	rl := &restartLedger{steps: steps}
	bounds := []time.Time{start}
	names := []string{"before"}
	nodes := []string{""}
	for _, s := range steps {
		bounds = append(bounds, s.sigterm)
		if s.label != "" {
			names = append(names, s.label)
		} else {
			names = append(names, "restart "+s.node)
		}
		nodes = append(nodes, s.node)
	}
	// The last restart's window ends when its node is back; after that, "after".
	last := steps[len(steps)-1]
	bounds = append(bounds, last.back, stop.Add(time.Hour))
	names = append(names, "after")
	nodes = append(nodes, "")
	for i, name := range names {
		rl.windows = append(rl.windows, &restartWindow{name: name, from: bounds[i], to: bounds[i+1], node: nodes[i],
			failed: map[string]int{}, refused: map[string]int{}, postErrs: map[string]int{}, broken: map[string]int{}})
	}
	byJob := map[string][]jobRun{}
	byInput := map[string][]jobRun{}
	for _, r := range runs {
		byJob[r.id] = append(byJob[r.id], r)
		byInput[r.input] = append(byInput[r.input], r)
	}
	rl.inflight = make([]map[string]int, len(steps))
	rl.onWorker, rl.onWorkerDone, rl.onWorkerLast = make([]int, len(steps)), make([]int, len(steps)), make([]time.Duration, len(steps))
	for i, st := range steps {
		rl.inflight[i] = map[string]int{}
		w := map[string]string{"b": "wb", "c": "wc"}[st.node]
		for _, r := range runs {
			if r.worker != w || !r.start.Before(st.sigterm) || !r.end.IsZero() && r.end.Before(st.sigterm) {
				continue
			}
			rl.onWorker[i]++
			if r.completed {
				rl.onWorkerDone[i]++
			}
			rl.onWorkerLast[i] = max(rl.onWorkerLast[i], r.end.Sub(st.sigterm))
		}
	}
	for i := range jobs {
		j := &jobs[i]
		w := rl.windowOf(j.SubmitAt)
		w.submitted++
		switch {
		case j.PostErr != "":
			w.postErrs[j.Ingress]++
		case j.Status != 200:
			w.refused[j.Refusal]++
		case j.Terminal == "done":
			w.done++
		case j.Terminal == "error":
			w.failed[j.Code]++
			rl.failedJobs = append(rl.failedJobs, fmt.Sprintf("%s %s (%s, window %s)", j.ID, j.Code, j.input, w.name))
		}
		if j.Broken != "" {
			w.broken[j.Ingress]++
		}
		if j.Status == 200 && (j.Open || j.Terminals != 1) {
			w.noTerminal++
			rl.noTerminal = append(rl.noTerminal, fmt.Sprintf("%s: %d terminal events, open %v, broken %q", j.ID, j.Terminals, j.Open, j.Broken))
		}
		if rs := byJob[j.ID]; j.ID != "" && len(rs) > 1 {
			w.ranTwice++
			rl.twice = append(rl.twice, fmt.Sprintf("%s ran %d times: %v", j.ID, len(rs), rs))
		}
		if j.Status != 200 {
			if rs := byInput[j.input]; len(rs) > 0 {
				rl.refusedRan = append(rl.refusedRan, fmt.Sprintf("%s refused (%s%s) yet ran: %v", j.input, j.Refusal, j.PostErr, rs))
			}
		}
		for k, s := range steps {
			if j.Status == 200 && j.SubmitAt.Before(s.sigterm) && !j.Ended(s.sigterm) {
				rl.inflight[k][outcomeOf(j)]++
			}
		}
	}
	return rl
}

func outcomeOf(j *loadJob) string {
	switch {
	case j.Terminal == "done":
		return "completed"
	case j.Terminal == "error":
		return j.Code
	case j.Broken != "":
		return "broken"
	}
	return "no terminal event"
}

func (rl *restartLedger) windowOf(t time.Time) *restartWindow {
	for _, w := range rl.windows {
		if t.Before(w.to) {
			return w
		}
	}
	return rl.windows[len(rl.windows)-1]
}

func (rl *restartLedger) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "rolling restart: %d clients, each job %v thinking then %d outputs %v apart (%v), ttl %v, %d slots on wb (b) and wc (c); %s\n",
		restartClients, restartThink, restartOutputs, restartEvery, restartJobTime, restartTTL, restartSlots, restartTiming)
	for i, s := range rl.steps {
		fmt.Fprintf(&b, "  %s: SIGTERM → exit %v (code %d); → serving %v; → back (online, worker registered) %v; dispatcher %s before, %s while it was down; in flight at SIGTERM: %s\n",
			s.node, s.exited.Sub(s.sigterm).Round(time.Millisecond), s.code, s.serving.Sub(s.exited).Round(time.Millisecond),
			s.back.Sub(s.serving).Round(time.Millisecond), s.dispatcherBefore, s.dispatcherDuring, fmtCounts(rl.inflight[i]))
		if rl.onWorker[i] > 0 {
			fmt.Fprintf(&b, "    its worker's runs going at SIGTERM: %d, completed %d, the last ended %v after SIGTERM\n",
				rl.onWorker[i], rl.onWorkerDone[i], rl.onWorkerLast[i].Round(time.Millisecond))
		}
		if s.drainLog != "" {
			fmt.Fprintf(&b, "    %s\n", s.drainLog)
		}
	}
	rl.table(&b)
	return b.String()
}

// table writes the ledger per window, and examples of what must not
// happen.
func (rl *restartLedger) table(b *strings.Builder) {
	fmt.Fprintf(b, "  %-10s %9s %9s %-22s %-26s %-16s %-12s %7s\n", "window", "submitted", "completed", "failed", "refused", "transport errors", "no terminal", "ran >1")
	for _, w := range rl.windows {
		errs := map[string]int{}
		for k, v := range w.postErrs {
			errs["post to "+k] += v
		}
		for k, v := range w.broken {
			errs["stream from "+k] += v
		}
		fmt.Fprintf(b, "  %-10s %9d %9d %-22s %-26s %-16s %-12d %7d\n", w.name, w.submitted, w.done,
			fmtCounts(w.failed), fmtCounts(w.refused), fmtCounts(errs), w.noTerminal, w.ranTwice)
	}
	for _, l := range [][]string{rl.noTerminal, rl.twice, rl.refusedRan, rl.failedJobs} {
		for i, e := range l {
			if i == 5 {
				fmt.Fprintf(b, "    … %d more\n", len(l)-5)
				break
			}
			fmt.Fprintf(b, "    %s\n", e)
		}
	}
}

// assert checks the targets (see the top of this file).
func (rl *restartLedger) assert(t *testing.T) {
	t.Helper()
	for _, s := range rl.steps {
		if s.code != 0 {
			t.Errorf("%s exited with code %d after SIGTERM (-1: killed after the drain timeout and 15s)", s.node, s.code)
		}
		if strings.Contains(s.drainLog, "drain timeout") {
			t.Errorf("%s's drain timed out: %s", s.node, s.drainLog)
		}
	}
	for _, w := range rl.windows {
		if w.noTerminal > 0 {
			t.Errorf("window %s: %d streams without exactly one terminal event", w.name, w.noTerminal)
		}
		if w.ranTwice > 0 {
			t.Errorf("window %s: %d jobs executed more than once", w.name, w.ranTwice)
		}
		if len(w.failed) > 0 {
			t.Errorf("window %s: failed %v", w.name, w.failed)
		}
		ingressRestart := w.node == "a"
		for code, n := range w.refused {
			if !ingressRestart || code != "draining" {
				t.Errorf("window %s: %d refused %s", w.name, n, code)
			}
		}
		for ing, n := range w.postErrs {
			if !ingressRestart || ing != "a" {
				t.Errorf("window %s: %d posts to %s failed in transport", w.name, n, ing)
			}
		}
		for ing, n := range w.broken {
			t.Errorf("window %s: %d streams from %s broke", w.name, n, ing)
		}
	}
	for i, s := range rl.steps {
		if rl.onWorkerDone[i] != rl.onWorker[i] {
			t.Errorf("%s's worker completed %d of the %d runs it had going at SIGTERM", s.node, rl.onWorkerDone[i], rl.onWorker[i])
		}
		for outcome, n := range rl.inflight[i] {
			if outcome != "completed" {
				t.Errorf("%d jobs in flight at %s's SIGTERM ended %s", n, s.node, outcome)
			}
		}
	}
	if len(rl.refusedRan) > 0 {
		t.Errorf("%d refused jobs were run by a worker: %v", len(rl.refusedRan), rl.refusedRan)
	}
}
