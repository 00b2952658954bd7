package integration_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/integration/benchkit"
	"github.com/switchyard/switchyard/worker"
)

// benchSetup is one way to run the same job: a jobs URL to post to.
type benchSetup struct {
	name, what, target string
	cluster            bool // a Switchyard setup: count its peer traffic
}

// peerTraffic is what the cluster's nodes sent each other (pings aside):
// the shape check of the cross-node figures.
type peerTraffic struct {
	kinds               map[string]float64 // routing messages by kind
	streamed, fallbacks float64            // acked on a Deliver stream; streams dropped for unary
}

func clusterTraffic(tb testing.TB, nodes []*switchyard.Node) peerTraffic {
	t := peerTraffic{kinds: peerMessages(tb, nodes)}
	for _, n := range nodes {
		t.streamed += metric(tb, n, "switchyard_peer_deliveries_streamed_total", nil)
		t.fallbacks += metric(tb, n, "switchyard_peer_unary_fallbacks_total", nil)
	}
	return t
}

func (t peerTraffic) combine(o peerTraffic, sign float64) peerTraffic {
	d := peerTraffic{kinds: map[string]float64{}, streamed: t.streamed + sign*o.streamed, fallbacks: t.fallbacks + sign*o.fallbacks}
	for k, v := range t.kinds {
		d.kinds[k] += v
	}
	for k, v := range o.kinds {
		d.kinds[k] += sign * v
	}
	return d
}

func (t peerTraffic) add(o peerTraffic) peerTraffic { return t.combine(o, 1) }
func (t peerTraffic) sub(o peerTraffic) peerTraffic { return t.combine(o, -1) }

// perJob divides the message counts (not the fallbacks) by jobs.
func (t peerTraffic) perJob(jobs int) peerTraffic {
	d := peerTraffic{kinds: map[string]float64{}, streamed: t.streamed / float64(jobs), fallbacks: t.fallbacks}
	for k, v := range t.kinds {
		if v != 0 {
			d.kinds[k] = v / float64(jobs)
		}
	}
	return d
}

func (t peerTraffic) String() string {
	var kinds []string
	for _, k := range []string{"forward", "deliver", "reply", "release", "unbind", "cancel"} {
		if v, ok := t.kinds[k]; ok {
			kinds = append(kinds, fmt.Sprintf("%s %.2f", k, v))
		}
	}
	if len(kinds) == 0 {
		kinds = append(kinds, "none")
	}
	return fmt.Sprintf("peer messages per job: %s; on a Deliver stream %.2f; streams dropped to unary %.0f",
		strings.Join(kinds, ", "), t.streamed, t.fallbacks)
}

var (
	clusterJobs   = flag.Int("cluster.jobs", 2000, "BenchmarkCluster: jobs per setup at each concurrency level")
	clusterRounds = flag.Int("cluster.rounds", 4, "BenchmarkCluster: interleaved rounds the jobs are split into")
	clusterInput  = flag.String("cluster.input", "one two three four", "BenchmarkCluster: the job's input, one output per word")
	clusterOuts   = flag.Int("cluster.outputs", 0, "BenchmarkCluster: instead of -cluster.input, a job of this many outputs of -cluster.output-bytes each")
	clusterBytes  = flag.Int("cluster.output-bytes", 32, "BenchmarkCluster: with -cluster.outputs, bytes per output")
	clusterOnly   = flag.String("cluster.setups", "", "BenchmarkCluster: comma-separated setups to run (default all), e.g. to profile one")
	clusterLevels = flag.String("cluster.levels", "1,64", "BenchmarkCluster: comma-separated client concurrency levels")
)

// BenchmarkCluster measures, in one run and one process, the same job (the
// demo tokens worker, 4 small outputs by default, no delay) posted by the
// same HTTP client code (integration/benchkit, also behind `switchyard
// bench`) to:
//
//   - co-located: the node hosting the worker (ingress, dispatcher and
//     worker on one node: no peer message);
//   - cross-node: another node; the worker's node is the queue's
//     dispatcher, so the job takes one forward there and its outputs and
//     end one reply each back (docs/cluster.md);
//   - cross-node-unary: the same from a third node with PeerForceUnary,
//     whose peer messages all go by unary calls (its forward by a unary
//     Forward instead of its lane's Deliver stream);
//   - relay-stream and relay-shared: the bare relay of the same shape
//     (benchkit.Relay: HTTP → gRPC stream → gRPC stream → the same SDK
//     worker and back, nothing else), with a gRPC stream per job, and with
//     one long-lived stream carrying every job.
//
// For each concurrency level (1 and 64) every setup runs -cluster.jobs
// jobs, split into -cluster.rounds rounds that interleave the setups (each
// round in a rotated order), so a slow spell of a shared, noisy machine
// falls on all of them rather than on whichever ran then. The jobs run in
// the parent; each sub-benchmark c=C/SETUP only reports that setup's
// pooled figures: time from POST to the first output event and to the
// done event (p50, p99, µs), the process's CPU time per job (client, nodes,
// workers and relay all run in it, so this is the whole system's cost of a
// job; steadier than latency on a shared machine), jobs/s, and ns/op as
// wall time per job.
// -benchtime does not apply (use 1x: the sub-benchmarks do no work). At
// the end a table, printed to stdout, puts the setups side by side with
// the ratios cross-node/co-located and cross-node/relay.
//
//	go test -run '^$' -bench BenchmarkCluster -benchtime 1x ./integration/ -args -cluster.jobs 2000
//
// -cluster.setups and -cluster.levels narrow a run to some setups and
// levels, e.g. to profile one (-cpuprofile) without the others in it.
//
// It never fails on a time. The machine's cores are shared by the client,
// the nodes, the relay and the workers: compare ratios within one run.
func BenchmarkCluster(b *testing.B) {
	const (
		queue       = "bench"
		concurrency = 128 // worker slots: more than any client concurrency, so the relay never has a job rejected
		warmup      = 200
		retention   = 50 * time.Millisecond
	)
	plan := newRoundsPlan(b, "cluster", *clusterLevels, *clusterJobs, *clusterRounds)
	// n1: the cross-node ingress; n2: the worker's node and the queue's
	// dispatcher; n3: the cross-node ingress with PeerForceUnary.
	nodes := startCluster(b, 3, func(i int, c *switchyard.Config) {
		// Production-like clocks rather than the test harness's fast ones.
		c.PeerHeartbeatInterval, c.PeerFailureThreshold = time.Second, 3
		c.Workers.HeartbeatInterval, c.Workers.IdleTimeout = 2*time.Second, 6*time.Second
		// Every setup shares one heap and two cores: drop ended jobs at
		// once (the default keeps them 5 minutes), so forgetting a run's
		// jobs happens during it, or in the pause after it, and never
		// taxes another setup; nor does a heap of kept records.
		c.Engine.Retention = retention
		c.PeerForceUnary = i == 2
	})
	ingress, host := nodes[0], nodes[1]
	MustStartWorker(b, host, worker.Config{Name: "bench-worker", Queue: queue, Concurrency: concurrency}, worker.Tokens(0))
	for _, nd := range nodes {
		waitFor(b, 10*time.Second, "n2 dispatches "+queue+" in "+nd.Catalog().Name()+"'s view", func() bool {
			return dispatcherOf(nd, queue) == host.Catalog().Name()
		})
	}

	relay, err := benchkit.StartRelay(2 * time.Second)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(relay.Close)
	startRelayWorker(b, relay, worker.Config{Name: "relay-worker", Queue: queue, Concurrency: concurrency})

	client := benchkit.NewClient()
	b.Cleanup(client.CloseIdleConnections)
	input := *clusterInput
	if *clusterOuts > 0 {
		input = benchkit.Input(*clusterOuts, max(*clusterBytes, 2))
	}
	body, _ := json.Marshal(map[string]any{"input": input, "options": map[string]any{"delay_ms": 0}})
	jobsURL := func(n *switchyard.Node) string { return baseURL(n) + "/v1/queues/" + queue + "/jobs" }
	setups := []benchSetup{
		{"co-located", "POST to the worker's node", jobsURL(host), true},
		{"cross-node", "POST to another node; dispatcher at the worker's node", jobsURL(ingress), true},
		{"cross-node-unary", "as cross-node, from a node with PeerForceUnary (no Deliver streams)", jobsURL(nodes[2]), true},
		{"relay-stream", "bare relay, a gRPC stream per job A→B", relay.Target(benchkit.ModeStreamPerJob, queue), false},
		{"relay-shared", "bare relay, one gRPC stream A→B for every job", relay.Target(benchkit.ModeSharedStream, queue), false},
	}

	if *clusterOnly != "" {
		keep := map[string]bool{}
		for _, f := range strings.Split(*clusterOnly, ",") {
			keep[strings.TrimSpace(f)] = true
		}
		setups = slices.DeleteFunc(setups, func(s benchSetup) bool { return !keep[s.name] })
		if len(setups) == 0 {
			b.Fatalf("-cluster.setups %q names no setup", *clusterOnly)
		}
	}

	// Warm every path: connections, lane streams, pools.
	ctx := context.Background()
	for _, s := range setups {
		warmUp(b, client, s.name, s.target, body, warmup)
	}

	traffic := map[string]peerTraffic{}
	started := time.Now()
	results := runRounds(b, plan, setups, func(s benchSetup) string { return s.name }, func(s benchSetup, key string, count, c int) benchkit.Result {
		before := clusterTraffic(b, nodes)
		cpu := processCPU(b)
		r := benchkit.Run(ctx, client, s.target, body, count, c)
		r.CPU = processCPU(b) - cpu
		if s.cluster {
			// Let trailing messages (an unbind, a late reply) be counted
			// and the last jobs be forgotten.
			time.Sleep(retention + 150*time.Millisecond)
			traffic[key] = traffic[key].add(clusterTraffic(b, nodes).sub(before))
		}
		return r
	})
	fmt.Print(clusterTable(setups, plan.levels, results, traffic, plan.jobs, plan.rounds, jobShape(input)))
	fmt.Printf("measured in %s (cluster start and warm-up before that)\n", time.Since(started).Round(time.Millisecond))
}

// roundsPlan is how an interleaving benchmark spreads its jobs: for each
// client concurrency level, every setup runs jobs jobs, split into rounds
// rounds that interleave the setups (each round in a rotated order), so a
// slow spell of a shared, noisy machine falls on all of them rather than on
// whichever ran then.
type roundsPlan struct {
	levels       []int
	jobs, rounds int
}

// newRoundsPlan reads the flags -PREFIX.levels (comma-separated
// concurrency levels), -PREFIX.jobs and -PREFIX.rounds.
func newRoundsPlan(b *testing.B, prefix, levels string, jobs, rounds int) roundsPlan {
	p := roundsPlan{jobs: max(jobs, 1), rounds: min(max(rounds, 1), max(jobs, 1))}
	for _, f := range strings.Split(levels, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || c < 1 {
			b.Fatalf("-%s.levels: %q is not a concurrency", prefix, f)
		}
		p.levels = append(p.levels, c)
	}
	return p
}

// runRounds runs plan over setups (named by name): runOne runs count jobs
// of a setup at concurrency c (its figures pooled under key, "c=C/NAME")
// from a collected heap. After each level, a sub-benchmark c=C/NAME per
// setup reports that setup's pooled figures. It returns the pooled figures
// by key.
func runRounds[S any](b *testing.B, p roundsPlan, setups []S, name func(S) string, runOne func(s S, key string, count, c int) benchkit.Result) map[string]*benchkit.Result {
	results := map[string]*benchkit.Result{}
	for _, c := range p.levels {
		for round := range p.rounds {
			count := p.jobs / p.rounds
			if round == 0 {
				count += p.jobs % p.rounds
			}
			for k := range setups {
				s := setups[(round+k)%len(setups)]
				key := fmt.Sprintf("c=%d/%s", c, name(s))
				if results[key] == nil {
					results[key] = &benchkit.Result{}
				}
				runtime.GC() // each run starts from a collected heap
				results[key].Add(runOne(s, key, count, c))
			}
		}
		for _, s := range setups {
			key := fmt.Sprintf("c=%d/%s", c, name(s))
			b.Run(strings.ReplaceAll(key, " ", "_"), func(b *testing.B) { reportLoad(b, *results[key]) })
		}
	}
	return results
}

// warmUp runs n jobs at concurrency 64 against target, and fails the
// benchmark if any fails.
func warmUp(b *testing.B, client *http.Client, name, target string, body []byte, n int) {
	if r := benchkit.Run(context.Background(), client, target, body, n, 64); r.Failed > 0 {
		b.Fatalf("%s: warm-up: %d of %d jobs failed", name, r.Failed, n)
	}
}

// startRelayWorker runs a real SDK worker against the relay's B until the
// benchmark ends, and waits until it has registered.
func startRelayWorker(tb testing.TB, r *benchkit.Relay, cfg worker.Config) {
	tb.Helper()
	cfg.Server = r.WorkerAddr()
	cfg.Capabilities = []string{"model=demo"}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = worker.Run(ctx, cfg, worker.Tokens(0))
	}()
	tb.Cleanup(func() { cancel(); <-done })
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	defer wcancel()
	if err := r.WaitWorker(wctx); err != nil {
		tb.Fatalf("relay worker: %v", err)
	}
}

// processCPU is the CPU time (user and system) this process has used: in
// BenchmarkCluster every part of every setup runs in it, so the CPU spent
// while a setup ran is that setup's cost per job, a figure far steadier
// than latency on a shared two-core machine.
func processCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// jobShape describes the job input makes: its outputs and, when they are
// all one size (benchkit.Input), that size.
func jobShape(input string) string {
	words := strings.Fields(input)
	for i, w := range words[:max(len(words)-1, 0)] {
		// Every output but the last is its word and a space; benchkit.Input
		// makes the last word one byte longer instead.
		if len(w) != len(words[0]) || i == len(words)-2 && len(words[len(words)-1]) != len(w)+1 {
			return fmt.Sprintf("%d outputs", len(words))
		}
	}
	if len(words) < 2 {
		return fmt.Sprintf("%d outputs", len(words))
	}
	return fmt.Sprintf("%d outputs of %d B", len(words), len(words[0])+1)
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// reportLoad reports r as the sub-benchmark's result; the sub-benchmark
// itself ran nothing, so ns/op is r's wall time per job.
func reportLoad(b *testing.B, r benchkit.Result) {
	if n := len(r.Last) + r.Failed; n > 0 {
		b.ReportMetric(float64(r.Wall.Nanoseconds())/float64(n), "ns/op")
	}
	b.ReportMetric(us(benchkit.Percentile(r.First, 50)), "first-p50-µs")
	b.ReportMetric(us(benchkit.Percentile(r.First, 99)), "first-p99-µs")
	b.ReportMetric(us(benchkit.Percentile(r.Last, 50)), "last-p50-µs")
	b.ReportMetric(us(benchkit.Percentile(r.Last, 99)), "last-p99-µs")
	b.ReportMetric(r.JobsPerSec(), "jobs/s")
	b.ReportMetric(us(r.CPUPerJob()), "cpu-µs/job")
	if r.Failed > 0 {
		b.ReportMetric(float64(r.Failed), "failed")
	}
}

// loadColumns are the columns of the interleaving benchmarks' tables: a
// setup's pooled latencies (µs), the process's CPU per job (µs), and, last,
// its jobs/s.
var loadColumns = []struct {
	name string
	of   func(benchkit.Result) float64
}{
	{"first p50", func(r benchkit.Result) float64 { return us(benchkit.Percentile(r.First, 50)) }},
	{"first p99", func(r benchkit.Result) float64 { return us(benchkit.Percentile(r.First, 99)) }},
	{"last p50", func(r benchkit.Result) float64 { return us(benchkit.Percentile(r.Last, 50)) }},
	{"last p99", func(r benchkit.Result) float64 { return us(benchkit.Percentile(r.Last, 99)) }},
	{"cpu/job", func(r benchkit.Result) float64 { return us(r.CPUPerJob()) }},
	{"jobs/s", benchkit.Result.JobsPerSec},
}

// writeLoadHeader writes the table's first column, width wide, and the
// loadColumns' names; the caller ends the line.
func writeLoadHeader(sb *strings.Builder, width int) {
	fmt.Fprintf(sb, "  %-*s", width, "setup")
	for _, m := range loadColumns {
		fmt.Fprintf(sb, " %10s", m.name)
	}
}

// writeLoadRow writes label, width wide, and r's figures in the
// loadColumns; the caller ends the line.
func writeLoadRow(sb *strings.Builder, width int, label string, r benchkit.Result) {
	fmt.Fprintf(sb, "  %-*s", width, label)
	for _, m := range loadColumns {
		fmt.Fprintf(sb, " %10.0f", m.of(r))
	}
}

// writeRatioRow writes a line: label, width wide, and per loadColumn a's
// figure over b's ("-" where b's is 0). The jobs/s ratio is inverted (b's
// over a's), so every ratio reads "a costs this many times b".
func writeRatioRow(sb *strings.Builder, width int, label string, a, b benchkit.Result) {
	fmt.Fprintf(sb, "  %-*s", width, label)
	for i, m := range loadColumns {
		x, y := m.of(a), m.of(b)
		if i == len(loadColumns)-1 {
			x, y = y, x // jobs/s: inverted, a time ratio
		}
		if y == 0 {
			fmt.Fprintf(sb, " %10s", "-")
			continue
		}
		fmt.Fprintf(sb, " %9.2fx", x/y)
	}
	sb.WriteString("\n")
}

// clusterTable lays the results out per concurrency level, with the
// ratios the issue asks for. Latency ratios are a/b of the times; the
// jobs/s ratio is inverted (b's jobs/s over a's), so every ratio reads
// "a costs this many times b" and the 1.25 target applies alike.
func clusterTable(setups []benchSetup, levels []int, results map[string]*benchkit.Result, traffic map[string]peerTraffic, jobs, rounds int, shape string) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "\nBenchmarkCluster: the demo tokens job (%s, no delay), same client for every setup;\n"+
		"%d jobs per setup and level, in %d interleaved rounds\n", shape, jobs, rounds)
	for _, s := range setups {
		fmt.Fprintf(&sb, "  %-17s %s\n", s.name, s.what)
	}
	ratios := [][2]string{
		{"cross-node", "co-located"}, {"cross-node", "relay-stream"}, {"cross-node", "relay-shared"},
		{"co-located", "relay-stream"}, {"cross-node", "cross-node-unary"},
	}
	for _, c := range levels {
		key := func(setup string) string { return fmt.Sprintf("c=%d/%s", c, setup) }
		fmt.Fprintf(&sb, "\nconcurrency %d (µs; cpu/job: the whole process's CPU µs per job; jobs/s)\n", c)
		writeLoadHeader(&sb, 30)
		fmt.Fprintf(&sb, " %7s %7s\n", "jobs", "failed")
		for _, s := range setups {
			r, ok := results[key(s.name)]
			if !ok {
				continue
			}
			writeLoadRow(&sb, 30, s.name, *r)
			fmt.Fprintf(&sb, " %7d %7d\n", len(r.Last)+r.Failed, r.Failed)
		}
		for _, rt := range ratios {
			a, okA := results[key(rt[0])]
			bb, okB := results[key(rt[1])]
			if !okA || !okB {
				continue
			}
			writeRatioRow(&sb, 30, rt[0]+" / "+rt[1], *a, *bb)
		}
		for _, s := range setups {
			if t, ok := traffic[key(s.name)]; ok {
				r := results[key(s.name)]
				fmt.Fprintf(&sb, "  %-30s %s\n", s.name, t.perJob(len(r.Last)+r.Failed))
			}
		}
	}
	sb.WriteString("\ntargets (issue 15, against relay-stream; jobs/s inverted, so ≤ reads as 'no slower'): cross-node cpu/job and jobs/s ≤ 1.0x,\n" +
		"co-located cpu/job ≤ 0.8x, cross-node first p50 at c=1 ≤ 1.3x, first p99 at c=64 ≤ 1.5x\n")
	return sb.String()
}
