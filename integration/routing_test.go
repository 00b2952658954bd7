package integration_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/worker"
)

// startCluster starts n nodes sharing the first one's embedded etcd and one
// cluster secret, and waits until every node sees every other online.
func startCluster(tb testing.TB, n int, mutate func(i int, c *switchyard.Config)) []*switchyard.Node {
	tb.Helper()
	cfg := func(i int) func(*switchyard.Config) {
		return func(c *switchyard.Config) {
			c.Name, c.ClusterSecret = fmt.Sprintf("n%d", i+1), testSecret
			c.PeerHeartbeatInterval, c.PeerFailureThreshold = 100*time.Millisecond, 5
			if mutate != nil {
				mutate(i, c)
			}
		}
	}
	nodes := []*switchyard.Node{MustStartNode(tb, cfg(0))}
	for i := 1; i < n; i++ {
		nodes = append(nodes, MustStartNode(tb, func(c *switchyard.Config) {
			cfg(i)(c)
			c.EtcdEndpoints = []string{"https://" + nodes[0].Catalog().ClientAddr()}
		}))
	}
	for _, nd := range nodes {
		waitFor(tb, 10*time.Second, "every node online in "+nd.Catalog().Name()+"'s view", func() bool {
			view := clusterNodes(tb, nd)
			for _, cn := range view {
				if cn.State != "online" {
					return false
				}
			}
			return len(view) == n
		})
	}
	return nodes
}

// peerMessages sums switchyard_peer_messages_total over the routing kinds
// (pings are liveness, not routing) on every node.
func peerMessages(tb testing.TB, nodes []*switchyard.Node) map[string]float64 {
	tb.Helper()
	out := map[string]float64{}
	for _, n := range nodes {
		for _, k := range []string{"forward", "deliver", "reply", "release", "unbind", "cancel"} {
			out[k] += metric(tb, n, "switchyard_peer_messages_total", map[string]string{"kind": k})
		}
	}
	return out
}

func total(m map[string]float64) float64 {
	s := 0.0
	for _, v := range m {
		s += v
	}
	return s
}

// A job posted to n1 runs on a worker connected to n3 and streams back: the
// consumer's node claimed the queue, so the job takes one hop there and its
// output one hop back.
func TestJobCrossesNodes(t *testing.T) {
	nodes := startCluster(t, 3, nil)
	n1, n3 := nodes[0], nodes[2]
	MustStartWorker(t, n3, worker.Config{Name: "w3"}, worker.Tokens(time.Millisecond))
	waitFor(t, 5*time.Second, "n3 dispatches demo in n1's view", func() bool {
		d, ok := n1.Catalog().Dispatch("demo")
		return ok && d.Dispatcher == "n3"
	})

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res := post(ctx, t, n1, "demo", `{"ttl_ms":5000,"input":"one two three"}`, true)
	defer res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("POST: %d", res.StatusCode)
	}
	evs := readAll(t, res.Body)
	got := strings.Join(types(evs), ",")
	if got != "accepted,output,output,output,done" {
		t.Fatalf("events %s, want accepted,output×3,done", got)
	}
	msgs := peerMessages(t, nodes)
	t.Logf("peer messages: %v", msgs)
	// forward n1→n3, reply×3 outputs + 1 end n3→n1.
	if msgs["forward"] != 1 || msgs["reply"] != 4 || total(msgs) != 5 {
		t.Errorf("peer messages %v, want forward 1 and reply 4 only", msgs)
	}
}

// oneShot answers with a result and no output: one request, one reply, the
// shape the cost model counts.
func oneShot(_ context.Context, job *worker.Job, _ *worker.Output) (any, error) {
	return "echo " + string(job.Input), nil
}

// The cost model, asserted from switchyard_peer_messages_total: a round trip
// costs 0 peer messages when ingress, dispatcher and worker are one node, 2
// when the dispatcher sits at either end (the worker's node: forward there,
// reply back; the ingress node: deliver, reply), and 5 when it is a third
// node — whatever the cluster size.
func TestCostModel(t *testing.T) {
	const jobs = 20
	type row struct {
		n                                         int
		colocated, atWorker, atIngress, thirdNode float64
	}
	var rows []row
	for _, n := range []int{3, 5, 9} {
		// Each size in a subtest, so the previous cluster is closed first.
		t.Run(fmt.Sprintf("N=%d", n), func(t *testing.T) {
			nodes := startCluster(t, n, func(_ int, c *switchyard.Config) {
				// 2 cores and up to 9 nodes pinging each other under -race:
				// slow the heartbeat so a busy node is not judged spare.
				c.PeerHeartbeatInterval = 500 * time.Millisecond
			})
			host := nodes[n-1]
			name := func(nd *switchyard.Node) string { return nd.Catalog().Name() }
			waitDispatcher := func(queue string, want *switchyard.Node) {
				for _, nd := range nodes {
					waitFor(t, 5*time.Second, name(want)+" dispatches "+queue+" in "+name(nd)+"'s view", func() bool {
						return dispatcherOf(nd, queue) == name(want)
					})
				}
			}
			run := func(ingress *switchyard.Node, queue, body string) float64 {
				before := total(peerMessages(t, nodes))
				for i := range jobs {
					if code, out := resultOf(t, ingress, queue, body); code != 200 {
						t.Fatalf("N=%d job %d on %s: %d %s", n, i, queue, code, out)
					}
				}
				// An unbind is sent after the end: let it be counted.
				time.Sleep(100 * time.Millisecond)
				return (total(peerMessages(t, nodes)) - before) / jobs
			}

			// Queue "w": its only consumer's node dispatches it.
			MustStartWorker(t, host, worker.Config{Name: "w", Queue: "w", Concurrency: 4}, oneShot)
			waitDispatcher("w", host)
			r := row{n: n}
			r.colocated = run(host, "w", `{"ttl_ms":5000,"input":"x"}`)
			r.atWorker = run(nodes[0], "w", `{"ttl_ms":5000,"input":"x"}`)

			// Queue "i": n1 hosts a consumer that cannot run model=y jobs and
			// claimed first, so n1 keeps the dispatch (two consumers on two
			// nodes leave it where it is) and model=y jobs go to the host.
			MustStartWorker(t, nodes[0], worker.Config{Name: "x", Queue: "i", Capabilities: []string{"model=x"}}, oneShot)
			waitDispatcher("i", nodes[0])
			MustStartWorker(t, host, worker.Config{Name: "y", Queue: "i", Capabilities: []string{"model=y"}, Concurrency: 4}, oneShot)
			waitFor(t, 5*time.Second, "both consumers of i seen", func() bool { return len(nodes[0].Catalog().Consumers("i")) == 2 })
			waitDispatcher("i", nodes[0])
			r.atIngress = run(nodes[0], "i", `{"ttl_ms":5000,"capabilities":{"model":"y"},"input":"x"}`)
			r.thirdNode = run(nodes[1], "i", `{"ttl_ms":5000,"capabilities":{"model":"y"},"input":"x"}`)

			rows = append(rows, r)
			if r.colocated != 0 || r.atWorker != 2 || r.atIngress != 2 || r.thirdNode != 5 {
				t.Errorf("N=%d: peer messages per round trip: co-located %.2f (want 0), dispatcher at worker %.2f (want 2), at ingress %.2f (want 2), third node %.2f (want 5)",
					n, r.colocated, r.atWorker, r.atIngress, r.thirdNode)
			}
			t.Logf("N=%d kinds: %v", n, peerMessages(t, nodes))
		})
	}
	t.Logf("peer messages per round trip (%d jobs each):", jobs)
	t.Logf("  %-3s  %-10s  %-20s  %-20s  %-10s", "N", "co-located", "dispatcher at worker", "dispatcher at ingress", "third node")
	for _, r := range rows {
		t.Logf("  %-3d  %-10.2f  %-20.2f  %-20.2f  %-10.2f", r.n, r.colocated, r.atWorker, r.atIngress, r.thirdNode)
	}
}

// named answers with the name of the worker that ran the job.
func named(name string) worker.Handler {
	return func(context.Context, *worker.Job, *worker.Output) (any, error) { return name, nil }
}

// resultOf posts a one-shot job and returns the status and, on 200, the
// done event's result.
func resultOf(tb testing.TB, n *switchyard.Node, queue, body string) (int, string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res := post(ctx, tb, n, queue, body, true)
	defer res.Body.Close()
	if res.StatusCode != 200 {
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	evs := readAll(tb, res.Body)
	last := evs[len(evs)-1]
	if last.Type != "done" {
		tb.Fatalf("job on %s ended %s: %s", queue, last.Type, last.Data)
	}
	return 200, field[string](tb, last, "result")
}

// A zone-scoped job runs only on a node labelled with its zone, never on
// another zone's or an unlabelled node; with no capable worker in the zone
// it is refused at ingress.
func TestZoneScopedRouting(t *testing.T) {
	zones := []string{"eu", "us", ""}
	nodes := startCluster(t, 3, func(i int, c *switchyard.Config) { c.Zone = zones[i] })
	MustStartWorker(t, nodes[1], worker.Config{Name: "w-us", Queue: "z"}, named("w-us"))
	MustStartWorker(t, nodes[2], worker.Config{Name: "w-none", Queue: "z"}, named("w-none"))
	for _, nd := range nodes {
		waitFor(t, 5*time.Second, "both consumers in "+nd.Catalog().Name()+"'s view", func() bool {
			return len(nd.Catalog().Consumers("z")) == 2
		})
	}
	for i := range 10 {
		if code, who := resultOf(t, nodes[i%3], "z", `{"ttl_ms":5000,"zone":"us","input":"x"}`); code != 200 || who != "w-us" {
			t.Fatalf("zone us job from n%d: %d %q, want it run by w-us", i%3+1, code, who)
		}
	}
	for _, nd := range nodes {
		code, body := resultOf(t, nd, "z", `{"ttl_ms":5000,"zone":"eu","input":"x"}`)
		if code != 503 || !strings.Contains(body, "no_capable_worker") {
			t.Fatalf("zone eu job (no worker there) from %s: %d %s, want 503 no_capable_worker", nd.Catalog().Name(), code, body)
		}
	}
	// Unscoped jobs may run anywhere: both workers get some.
	seen := map[string]bool{}
	for range 20 {
		_, who := resultOf(t, nodes[0], "z", `{"ttl_ms":5000,"input":"x"}`)
		seen[who] = true
	}
	if !seen["w-us"] && !seen["w-none"] {
		t.Fatalf("unscoped jobs ran on %v", seen)
	}
}

// A node that is not online is not routed to: an in_progress node's (or a
// spare node's) consumers do not make a job acceptable, and no job goes to
// them; once the node is online again, they do.
func TestPeerStatesGateRouting(t *testing.T) {
	nodes := startCluster(t, 2, nil)
	n1, n2 := nodes[0], nodes[1]
	MustStartWorker(t, n2, worker.Config{Name: "w2", Queue: "ps"}, named("w2"))
	waitFor(t, 5*time.Second, "n1 sees w2", func() bool { return len(n1.Catalog().Consumers("ps")) == 1 })
	if code, who := resultOf(t, n1, "ps", `{"ttl_ms":5000,"input":"x"}`); code != 200 || who != "w2" {
		t.Fatalf("job with n2 online: %d %q", code, who)
	}

	// n2 says it is in_progress (as while it syncs after a start): n1 must
	// not route to it.
	rec, _ := n1.Catalog().Node("n2")
	rec.State = "in_progress"
	if err := n2.Catalog().PublishNode(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "n1 sees n2 in_progress", func() bool { return clusterNodes(t, n1)["n2"].State == "in_progress" })
	if code, body := resultOf(t, n1, "ps", `{"ttl_ms":5000,"input":"x"}`); code != 503 {
		t.Fatalf("job with n2 in_progress: %d %s, want 503", code, body)
	}

	rec.State = "online"
	if err := n2.Catalog().PublishNode(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "n1 sees n2 online", func() bool { return clusterNodes(t, n1)["n2"].State == "online" })
	if code, who := resultOf(t, n1, "ps", `{"ttl_ms":5000,"input":"x"}`); code != 200 || who != "w2" {
		t.Fatalf("job with n2 online again: %d %q", code, who)
	}
}

func dispatcherOf(n *switchyard.Node, queue string) string {
	d, _ := n.Catalog().Dispatch(queue)
	return d.Dispatcher
}

// Relocation with hysteresis: a dispatcher left hosting none of its queue's
// consumers hands the queue to the node that hosts them all only after they
// have been there for PinStable, and never while a job is bound.
func TestRelocationHysteresis(t *testing.T) {
	const pin = time.Second
	nodes := startCluster(t, 2, func(_ int, c *switchyard.Config) {
		c.Engine.PinStable = pin
		// The bound job's worker must stay connected through the test's
		// sleeps: the harness's 1s session timeout can end it on a loaded
		// machine, which releases the job (and lets the queue move).
		c.Workers.HeartbeatInterval, c.Workers.IdleTimeout = time.Second, 10*time.Second
		// Likewise the peers: startCluster's 500ms to declare a peer
		// silent can pass on a loaded machine, which stops the bound job
		// on its host, rebinds it, and lets the queue move while it is
		// unbound. This test is about the pin, not failure detection.
		c.PeerHeartbeatInterval, c.PeerFailureThreshold = 250*time.Millisecond, 12
	})
	n1, n2 := nodes[0], nodes[1]
	stopW1 := MustStartWorker(t, n1, worker.Config{Name: "w1", Queue: "rl"}, named("w1"))
	waitFor(t, 5*time.Second, "n1 dispatches rl", func() bool { return dispatcherOf(n2, "rl") == "n1" })
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	MustStartWorker(t, n2, worker.Config{Name: "w2", Queue: "rl"}, func(ctx context.Context, _ *worker.Job, _ *worker.Output) (any, error) {
		select {
		case started <- struct{}{}:
		default: // a rebound run; the test fails on its dispatcher check
		}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return "w2", nil
	})
	waitFor(t, 5*time.Second, "both consumers in n1's view", func() bool { return len(n1.Catalog().Consumers("rl")) == 2 })
	if d := dispatcherOf(n1, "rl"); d != "n1" {
		t.Fatalf("two consumers on two nodes moved the dispatcher to %s", d)
	}

	// Leave w1 only busy: the next job must go to w2 through n1.
	stopW1()
	waitFor(t, 5*time.Second, "w1 gone from n1's view", func() bool { return len(n1.Catalog().Consumers("rl")) == 1 })
	left := time.Now()
	done := make(chan string, 1)
	go func() { _, who := resultOf(t, n1, "rl", `{"ttl_ms":20000,"input":"x"}`); done <- who }()
	<-started
	time.Sleep(2 * pin)
	if d := dispatcherOf(n2, "rl"); d != "n1" {
		t.Fatalf("dispatcher moved to %s while a job was bound", d)
	}
	close(release)
	if who := <-done; who != "w2" {
		t.Fatalf("job ran on %q", who)
	}
	waitFor(t, 10*time.Second, "dispatch relocated to n2", func() bool { return dispatcherOf(n1, "rl") == "n2" })
	if since := time.Since(left); since < pin {
		t.Fatalf("relocated %v after the consumers settled, before PinStable %v", since, pin)
	}
	if got := metric(t, n1, "switchyard_dispatch_relocations_total", nil); got != 1 {
		t.Errorf("relocations on n1 = %v, want 1", got)
	}
	// Jobs now cost one hop to the dispatcher at the consumer's end.
	if code, who := resultOf(t, n1, "rl", `{"ttl_ms":5000,"input":"x"}`); code != 200 || who != "w2" {
		t.Fatalf("job after relocation: %d %q", code, who)
	}
}

// The reaper removes a queue with no job and no consumer after QueueIdle,
// from memory and from the catalog.
func TestQueueReaperReleasesRecord(t *testing.T) {
	nodes := startCluster(t, 2, func(_ int, c *switchyard.Config) { c.Engine.QueueIdle = 300 * time.Millisecond })
	n1, n2 := nodes[0], nodes[1]
	stop := MustStartWorker(t, n2, worker.Config{Name: "w", Queue: "rp"}, named("w"))
	waitFor(t, 5*time.Second, "n2 dispatches rp", func() bool { return dispatcherOf(n1, "rp") == "n2" })
	if code, _ := resultOf(t, n1, "rp", `{"ttl_ms":5000,"input":"x"}`); code != 200 {
		t.Fatalf("job: %d", code)
	}
	stop()
	waitFor(t, 10*time.Second, "rp's dispatch record gone", func() bool {
		_, ok := n1.Catalog().Dispatch("rp")
		return !ok
	})
	if metric(t, n2, "switchyard_dispatch_queues_reaped_total", nil) < 1 {
		t.Error("n2 reaped no queue")
	}
}

// Cluster formation with three nodes that each embed an etcd member
// (--initial-cluster): a job posted to n1 runs on a worker connected to n3.
func TestJobCrossesEmbeddedMembers(t *testing.T) {
	nodes, _ := startEmbeddedCluster(t, "n1", "n2", "n3")
	MustStartWorker(t, nodes[2], worker.Config{Name: "w3", Queue: "em"}, named("w3"))
	waitFor(t, 10*time.Second, "n1 sees n3 dispatching em", func() bool { return dispatcherOf(nodes[0], "em") == "n3" })
	// The TTL bounds a job that went astray, not how fast it runs.
	if code, who := resultOf(t, nodes[0], "em", `{"ttl_ms":25000,"input":"x"}`); code != 200 || who != "w3" {
		t.Fatalf("job from n1: %d %q, want run by w3", code, who)
	}
}

// A spare node is skipped: a node that cannot authenticate to the others
// (wrong cluster secret) fails their pings and is spare in their view, so
// its consumers do not make a job acceptable there.
func TestSpareNodeSkipped(t *testing.T) {
	nodes := startCluster(t, 2, nil)
	n1 := nodes[0]
	files := catalogClientTLS(t, "n3", "a-different-cluster-secret")
	bad := MustStartNode(t, func(c *switchyard.Config) {
		c.Name, c.ClusterSecret = "n3", "a-different-cluster-secret"
		c.EtcdEndpoints = []string{"https://" + n1.Catalog().ClientAddr()}
		c.EtcdTLSCert, c.EtcdTLSKey, c.EtcdTLSCA = files.Cert, files.Key, files.CA
		c.PeerHeartbeatInterval, c.PeerFailureThreshold = 100*time.Millisecond, 3
	})
	MustStartWorker(t, bad, worker.Config{Name: "w3", Queue: "sp"}, named("w3"))
	waitFor(t, 10*time.Second, "n3 spare in n1's view", func() bool { return clusterNodes(t, n1)["n3"].State == "spare" })
	waitFor(t, 5*time.Second, "n1 sees w3's record", func() bool { return len(n1.Catalog().Consumers("sp")) == 1 })
	if code, body := resultOf(t, n1, "sp", `{"ttl_ms":5000,"input":"x"}`); code != 503 {
		t.Fatalf("job with the only consumer on a spare node: %d %s, want 503", code, body)
	}
	// A healthy node's worker takes the queue's jobs meanwhile.
	MustStartWorker(t, nodes[1], worker.Config{Name: "w2", Queue: "sp"}, named("w2"))
	for range 5 {
		if code, who := resultOf(t, n1, "sp", `{"ttl_ms":5000,"input":"x"}`); code != 200 || who != "w2" {
			t.Fatalf("job: %d %q, want run by w2", code, who)
		}
	}
}

// A consumer that moves to another node while the delivery stream to its
// old node is open: its job that had produced no output runs again, once,
// on the new node (after the old run was stopped), and nothing is lost.
func TestConsumerMovesUnderOpenStream(t *testing.T) {
	nodes := startCluster(t, 3, nil)
	n1, n2, n3 := nodes[0], nodes[1], nodes[2]
	type run struct {
		where         string
		gen           uint64
		start, finish time.Time
	}
	var mu sync.Mutex
	var runs []run
	handler := func(where string, block bool) worker.Handler {
		return func(ctx context.Context, job *worker.Job, out *worker.Output) (any, error) {
			mu.Lock()
			i := len(runs)
			runs = append(runs, run{where: where, gen: job.Generation, start: time.Now()})
			mu.Unlock()
			defer func() { mu.Lock(); runs[i].finish = time.Now(); mu.Unlock() }()
			if block {
				<-ctx.Done()
				return nil, ctx.Err()
			}
			_ = out.Send(ctx, where)
			return where, nil
		}
	}
	stopOld := MustStartWorker(t, n2, worker.Config{Name: "mover", Queue: "mv"}, handler("n2", true))
	waitFor(t, 5*time.Second, "n2 dispatches mv", func() bool { return dispatcherOf(n1, "mv") == "n2" })

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res := post(ctx, t, n1, "mv", `{"ttl_ms":15000,"input":"x"}`, true)
	defer res.Body.Close()
	waitFor(t, 5*time.Second, "the job running on n2", func() bool { mu.Lock(); defer mu.Unlock(); return len(runs) == 1 })

	// The consumer leaves n2 and comes back on n3.
	stopOld()
	MustStartWorker(t, n3, worker.Config{Name: "mover", Queue: "mv"}, handler("n3", false))
	evs := readAll(t, res.Body)
	if got := strings.Join(types(evs), ","); got != "accepted,output,done" {
		t.Fatalf("events %s, want accepted,output,done", got)
	}
	if who := field[string](t, evs[2], "result"); who != "n3" {
		t.Fatalf("completed by %q, want n3", who)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(runs) != 2 || runs[0].where != "n2" || runs[1].where != "n3" || runs[1].gen <= runs[0].gen {
		t.Fatalf("runs %+v, want n2 then n3 with a newer generation", runs)
	}
	if runs[1].start.Before(runs[0].finish) {
		t.Fatalf("the new run started %v before the old one stopped", runs[0].finish.Sub(runs[1].start))
	}
}

// Zones are tested again when a node's zone changes in the catalog: a
// zone-scoped job running on a node that leaves its zone is stopped there
// and runs again on a node still in the zone (it had produced no output).
func TestZoneChangeReroutes(t *testing.T) {
	zones := []string{"a", "b", "b"}
	nodes := startCluster(t, 3, func(i int, c *switchyard.Config) { c.Zone = zones[i] })
	started := make(chan string, 4)
	// w2, on the node that will move, runs until it is stopped; w3 answers.
	MustStartWorker(t, nodes[1], worker.Config{Name: "w2", Queue: "zc"}, func(ctx context.Context, _ *worker.Job, _ *worker.Output) (any, error) {
		started <- "w2"
		<-ctx.Done()
		return nil, ctx.Err()
	})
	waitFor(t, 5*time.Second, "n2 dispatches zc", func() bool { return dispatcherOf(nodes[0], "zc") == "n2" })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res := post(ctx, t, nodes[0], "zc", `{"ttl_ms":15000,"zone":"b","input":"x"}`, true)
	defer res.Body.Close()
	if first := <-started; first != "w2" {
		t.Fatalf("first run on %s", first)
	}
	MustStartWorker(t, nodes[2], worker.Config{Name: "w3", Queue: "zc"}, func(context.Context, *worker.Job, *worker.Output) (any, error) {
		started <- "w3"
		return "w3", nil
	})
	waitFor(t, 5*time.Second, "n1 sees both consumers", func() bool { return len(nodes[0].Catalog().Consumers("zc")) == 2 })

	// n2's record now says zone c.
	rec, _ := nodes[0].Catalog().Node("n2")
	rec.Zone = "c"
	if err := nodes[1].Catalog().PublishNode(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	evs := readAll(t, res.Body)
	last := evs[len(evs)-1]
	if last.Type != "done" || field[string](t, last, "result") != "w3" {
		t.Fatalf("the job ended %s %s, want done by w3", last.Type, last.Data)
	}
	if n := len(started); n != 1 {
		t.Fatalf("%d more runs after the first, want exactly one (w3)", n)
	}
	if second := <-started; second != "w3" {
		t.Fatalf("second run on %s", second)
	}
	// n1's Deliver stream to n2 (the job's forward went on it) was opened
	// under n2's old zone label: the zone test closed it.
	waitFor(t, 5*time.Second, "n1 closing its stream to n2 for the zone change", func() bool {
		return metric(t, nodes[0], "switchyard_peer_stream_zone_closes_total", nil) == 1
	})
}
