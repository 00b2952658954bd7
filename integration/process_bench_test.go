package integration_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/pprof"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/integration/benchkit"
	"github.com/switchyard/switchyard/internal/grpctest"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// BenchmarkProcesses measures what a user runs: the real binary as the
// README's 3-node cluster (a, b, c, each an embedded etcd member), its demo
// tokens worker (the Go worker SDK) in a process of its own on c, and two
// bare relay floors of three processes each (ingress A, middle B, a bare
// worker), all on loopback. The load generator is this process. Setups,
// each driven closed-loop for -procs.dur per round:
//
//   - cross: POST to a, dispatched and run on c (two peer hops, as the
//     relay's two gRPC hops); HTTP/SSE at both ends;
//   - colo: POST to c, where the worker is (no peer hop);
//   - grpc: the gRPC JobService at a (no HTTP edge), the job as in cross;
//   - grpc-batched: the same through SubmitBatched (the events ready
//     together in one message);
//   - relay: the floor every ratio is to: opaque frames end to end
//     (benchkit.FrameIngress, FrameNode, RunFrameWorker), each hop reading
//     an 11-byte header to route, the ingress writing "id: seq / data:
//     payload" SSE events, the worker answering from pre-encoded frames —
//     the shape of the reference kit's relay (../shared/bench, issue 31),
//     so the two agree on the floor. Its job is 16 events (the outputs),
//     where a Switchyard job's stream has 18 (accepted and done too), as
//     the kit's is;
//   - relay (worker protocol): the same path speaking Switchyard's
//     messages (benchkit.Relay split in two, benchkit.RunBareWorker: Job
//     and WorkerMessage protobufs, JSON SSE events of Switchyard's types),
//     shown to separate what the protocol costs from what the relaying
//     does; its ratios are to the opaque floor too.
//
// CPU comes from /proc for each process and is split between the nodes
// (a+b+c; a relay's A+B) and the worker. Ratios are to the opaque relay of
// the same shape and concurrency in the same round; rounds interleave the
// setups so the machine's load hits them alike.
//
//	go test -run '^$' -bench '^BenchmarkProcesses$' -benchtime 1x ./integration/ -args -procs.rounds 2
//
// -procs.setups runs only the setups named (the floor always runs), to
// compare two of them in less time. -procs.profile DIR (it must exist)
// writes CPU and allocation profiles of each setup's processes (nodes a
// and c, the workers; b too for cross; c alone for colo; the opaque
// relay's A, B and frame worker) at 16 × the first size, the highest
// level, in the last round (go tool pprof DIR/grpc-a.pprof,
// DIR/grpc-a.allocs.pprof).
func BenchmarkProcesses(b *testing.B) {
	dir := b.TempDir()
	bin := filepath.Join(dir, "switchyard")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/switchyard").CombinedOutput(); err != nil {
		b.Fatalf("build: %v\n%s", err, out)
	}
	client := benchkit.NewClient()
	b.Cleanup(client.CloseIdleConnections)

	// The cluster, as the README runs it.
	names := []string{"a", "b", "c"}
	type addrs struct{ http, grpc, peer, etcdClient, etcdPeer, debug string }
	ad := map[string]addrs{}
	var ic []string
	for _, n := range names {
		ad[n] = addrs{freeAddr(b), freeAddr(b), freeAddr(b), freeAddr(b), freeAddr(b), freeAddr(b)}
		ic = append(ic, n+"=https://"+ad[n].etcdPeer)
	}
	var nodePids []int
	for _, n := range names {
		cmd := exec.Command(bin, "node", "--name", n, "--http-addr", ad[n].http, "--grpc-addr", ad[n].grpc,
			"--peer-addr", ad[n].peer, "--debug-addr", ad[n].debug, "--data-dir", filepath.Join(dir, n),
			"--etcd-client-addr", ad[n].etcdClient, "--etcd-peer-addr", ad[n].etcdPeer,
			"--initial-cluster", strings.Join(ic, ","), "--cluster-secret", testSecret, "--log-level", "warn")
		startProcess(b, cmd)
		nodePids = append(nodePids, cmd.Process.Pid)
	}
	for _, n := range names {
		waitFor(b, 60*time.Second, "node "+n+" ready", func() bool { return httpOK(client, "http://"+ad[n].http+"/readyz") })
	}
	sdkDebug := freeAddr(b)
	sdk := exec.Command(bin, "worker", "--server", ad["c"].grpc, "--queue", "demo", "--demo", "tokens",
		"--delay", "0s", "--concurrency", "256", "--debug-addr", sdkDebug, "--log-level", "warn")
	startProcess(b, sdk)

	// The opaque relay floor: B, its frame worker, A.
	// A serves its gRPC edge on frameAG, the JobService setups' floor.
	frameB, frameA, frameAG, frameDebug := freeAddr(b), freeAddr(b), freeAddr(b), freeAddr(b)
	frameBDebug, frameADebug := freeAddr(b), freeAddr(b)
	fb := reexec(b, "frame-node", frameB, frameBDebug)
	fw := reexec(b, "frame-worker", frameB, frameDebug)
	fa := reexec(b, "frame-ingress", frameA, frameAG, frameB, frameADebug)
	// The worker-protocol relay: B, its bare worker, A.
	relayB, relayA, bareDebug := freeAddr(b), freeAddr(b), freeAddr(b)
	rb := reexec(b, "relay-node", relayB)
	bare := reexec(b, "bare-worker", relayB, bareDebug)
	ra := reexec(b, "relay-ingress", relayA, relayB)

	type setup struct {
		name       string
		job        func(body []byte) benchkit.JobFunc
		nodes      []int
		worker     int
		profileURL []string // name=debug URL, for -procs.profile
		bare       bool     // a relay: its bare worker reads the shape from the envelope's options
	}
	const floor = "relay" // the setup every ratio is to
	// grpcFloor is the JobService setups' floor of their own protocol: the
	// opaque relay through its gRPC edge (benchkit/frameedge.go).
	const grpcFloor = "relay (gRPC edge)"
	edge := grpctest.Dial(b, frameAG)
	jobsURL := func(addr string) string { return "http://" + addr + "/v1/queues/demo/jobs" }
	conn := grpctest.Dial(b, ad["a"].grpc)
	jobs := pb.NewJobServiceClient(conn)
	grpcJob := func(body []byte) benchkit.JobFunc { return benchkit.GRPCJob(jobs, "demo", body) }
	grpcBatchedJob := func(body []byte) benchkit.JobFunc { return benchkit.GRPCBatchedJob(jobs, "demo", body) }
	frameProfiles := []string{"A=" + frameADebug, "B=" + frameBDebug, "frame=" + frameDebug}
	setups := []setup{
		{"cross", func(body []byte) benchkit.JobFunc { return benchkit.HTTPJob(client, jobsURL(ad["a"].http), body) }, nodePids, sdk.Process.Pid,
			[]string{"a=" + ad["a"].debug, "b=" + ad["b"].debug, "c=" + ad["c"].debug, "sdk=" + sdkDebug}, false},
		{"colo", func(body []byte) benchkit.JobFunc { return benchkit.HTTPJob(client, jobsURL(ad["c"].http), body) }, nodePids, sdk.Process.Pid,
			[]string{"c=" + ad["c"].debug}, false},
		{"grpc", grpcJob, nodePids, sdk.Process.Pid, []string{"a=" + ad["a"].debug, "c=" + ad["c"].debug}, false},
		{"grpc-batched", grpcBatchedJob, nodePids, sdk.Process.Pid, []string{"a=" + ad["a"].debug, "c=" + ad["c"].debug}, false},
		{floor, func(body []byte) benchkit.JobFunc {
			return benchkit.FrameJob(client, "http://"+frameA+"/job", body, 16)
		}, []int{fb, fa}, fw, frameProfiles, true},
		{grpcFloor, func(body []byte) benchkit.JobFunc { return benchkit.FrameEdgeJob(edge, body, 16) },
			[]int{fb, fa}, fw, frameProfiles, true},
		{"relay (worker protocol)", func(body []byte) benchkit.JobFunc {
			return benchkit.HTTPJob(client, "http://"+relayA+"/"+benchkit.ModeSharedStream+"/v1/queues/demo/jobs", body)
		}, []int{rb, ra}, bare, []string{"bare=" + bareDebug}, true},
	}

	if *procsSetups != "" {
		keep := strings.Split(*procsSetups, ",")
		if !slices.Contains(keep, floor) {
			keep = append(keep, floor) // every ratio is to it
		}
		if (slices.Contains(keep, "grpc") || slices.Contains(keep, "grpc-batched")) && !slices.Contains(keep, grpcFloor) {
			keep = append(keep, grpcFloor)
		}
		setups = slices.DeleteFunc(setups, func(st setup) bool { return !slices.Contains(keep, st.name) })
	}

	type shape struct{ outputs, size int }
	var shapes []shape
	for _, s := range strings.Split(*procsSizes, ",") {
		n, err := strconv.Atoi(s)
		if err != nil {
			b.Fatalf("-procs.sizes: %v", err)
		}
		shapes = append(shapes, shape{16, n})
	}
	var levels []int
	for _, f := range strings.Split(*procsLevels, ",") {
		c, err := strconv.Atoi(f)
		if err != nil || c < 1 {
			b.Fatalf("-procs.levels: %q is not a concurrency", f)
		}
		levels = append(levels, c)
	}
	// The same envelope everywhere, but for the bare worker's shape in the
	// relays' options (the demo tokens worker takes its shape from the
	// input, which the bare workers ignore).
	bodyOf := func(s shape, relay bool) []byte {
		env := map[string]any{"ttl_ms": 30000, "input": benchkit.Input(s.outputs, s.size)}
		if relay {
			env["options"] = benchkit.BareShape{Outputs: s.outputs, Bytes: s.size}
		}
		body, _ := json.Marshal(env)
		return body
	}
	// Warm up each setup until jobs complete (the worker registered, the
	// dispatcher claimed, the connections open).
	for _, st := range setups {
		job := st.job(bodyOf(shapes[0], st.bare))
		waitFor(b, 60*time.Second, st.name+" answering", func() bool { _, _, ok := job(b.Context()); return ok })
		benchkit.RunJobs(b.Context(), job, 200, 16)
	}

	type key struct {
		setup string
		shape shape
		conc  int
	}
	type row struct {
		res           benchkit.Result
		nodes, worker time.Duration
		// first is the first node's share of nodes: a, where the cluster
		// setups' jobs come in (their edge), or the relay's B.
		first time.Duration
		// second is the second node's share: the cluster's b (for a
		// relay, its A).
		second time.Duration
		// batches and batched: what node c counted of the SDK worker's
		// batches (switchyard_worker_batches_total and
		// _batched_messages_total), for the cluster setups.
		batches, batched float64
		// mallocs and allocBytes: what the setup's ingress node allocated
		// (go_memstats_mallocs_total, _alloc_bytes_total), cluster setups.
		mallocs, allocBytes float64
		// msgs and events: the JobEventBatch messages grpc-batched's jobs
		// received, and the events in them.
		msgs, events uint64
		// sys: the system calls of the first node (as first), the other
		// nodes, the worker and the load generator (this process, the
		// client), in syscalls' order.
		sys [4]benchkit.Syscalls
		// client is the load generator's CPU: what the setup's responses
		// cost the client that reads them.
		client time.Duration
	}
	// syscalls reads the system calls of the setup's processes, in
	// row.sys's order.
	syscalls := func(st setup) [4]benchkit.Syscalls {
		var s [4]benchkit.Syscalls
		for i, pids := range [][]int{st.nodes[:1], st.nodes[1:], {st.worker}, {os.Getpid()}} {
			v, err := benchkit.ProcSyscalls(pids...)
			if err != nil {
				b.Fatal(err)
			}
			s[i] = v
		}
		return s
	}
	// batchCounts reads node c's batch counters (0 from a node without
	// them).
	cNode := &procNode{http: ad["c"].http}
	batchCounts := func(st setup) (batches, batched float64) {
		if len(st.nodes) != 3 {
			return 0, 0
		}
		batches, _ = procMetric(cNode, "switchyard_worker_batches_total")
		batched, _ = procMetric(cNode, "switchyard_worker_batched_messages_total")
		return batches, batched
	}
	// ingress is the cluster setups' ingress node (a, or c co-located);
	// allocCounts reads its allocation counters (0 for a relay).
	ingress := map[string]*procNode{"cross": {http: ad["a"].http}, "grpc": {http: ad["a"].http}, "grpc-batched": {http: ad["a"].http}, "colo": cNode}
	allocCounts := func(st setup) (mallocs, bytes float64) {
		n := ingress[st.name]
		if n == nil {
			return 0, 0
		}
		mallocs, _ = procMetric(n, "go_memstats_mallocs_total")
		bytes, _ = procMetric(n, "go_memstats_alloc_bytes_total")
		return mallocs, bytes
	}
	rows := map[key]*row{}
	for round := 1; round <= *procsRounds; round++ {
		for _, sh := range shapes {
			for _, c := range levels {
				for _, st := range setups {
					job := st.job(bodyOf(sh, st.bare))
					var prof func()
					if *procsProfile != "" && round == *procsRounds && sh == shapes[0] && c == levels[len(levels)-1] {
						prof = startProfiles(b, st.name, st.profileURL, *procsDur)
					}
					bt0, bm0 := batchCounts(st)
					m0, ab0 := allocCounts(st)
					msgs0, evs0 := benchkit.BatchedMessages.Load(), benchkit.BatchedEvents.Load()
					a0, b0 := procCPU(b, st.nodes[0]), procCPU(b, st.nodes[1])
					n0, w0, l0 := procCPU(b, st.nodes...), procCPU(b, st.worker), procCPU(b, os.Getpid())
					s0 := syscalls(st)
					res := benchkit.RunJobsFor(b.Context(), job, *procsDur, c)
					s1 := syscalls(st)
					n1, w1, l1 := procCPU(b, st.nodes...), procCPU(b, st.worker), procCPU(b, os.Getpid())
					a1, b1 := procCPU(b, st.nodes[0]), procCPU(b, st.nodes[1])
					bt1, bm1 := batchCounts(st)
					m1, ab1 := allocCounts(st)
					msgs1, evs1 := benchkit.BatchedMessages.Load(), benchkit.BatchedEvents.Load()
					if prof != nil {
						prof()
					}
					k := key{st.name, sh, c}
					if rows[k] == nil {
						rows[k] = &row{}
					}
					rows[k].res.Add(res)
					rows[k].nodes += n1 - n0
					rows[k].worker += w1 - w0
					rows[k].first += a1 - a0
					rows[k].second += b1 - b0
					rows[k].batches += bt1 - bt0
					rows[k].batched += bm1 - bm0
					rows[k].mallocs += m1 - m0
					rows[k].allocBytes += ab1 - ab0
					rows[k].msgs += msgs1 - msgs0
					rows[k].events += evs1 - evs0
					rows[k].client += l1 - l0
					for i := range rows[k].sys {
						rows[k].sys[i] = rows[k].sys[i].Add(s1[i].Sub(s0[i]))
					}
				}
			}
		}
	}

	fmt.Printf("\nBenchmarkProcesses: separate processes (3 nodes + SDK worker; each relay A + B + bare worker; ratios to the opaque relay), %d round(s) × %s per setup\n", *procsRounds, *procsDur)
	fmt.Printf("  %-38s %9s %9s %9s %10s %10s %8s %8s %8s %8s %6s\n", "setup", "jobs/s", "first p50", "last p50",
		"nodes µs", "worker µs", "jobs×", "first×", "nodes×", "worker×", "failed")
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	for _, sh := range shapes {
		for _, c := range levels {
			relay := rows[key{floor, sh, c}]
			for _, st := range setups {
				r := rows[key{st.name, sh, c}]
				jobs := float64(len(r.res.Last))
				if jobs == 0 {
					fmt.Printf("  %-38s no job completed (%d failed)\n", st.name, r.res.Failed)
					continue
				}
				nodes, worker := us(r.nodes)/jobs, us(r.worker)/jobs
				rj := float64(len(relay.res.Last))
				fmt.Printf("  %-38s %9.0f %9.0f %9.0f %10.0f %10.0f %7.2fx %7.2fx %7.2fx %7.2fx %6d\n",
					fmt.Sprintf("%s 16×%dB c=%d", st.name, sh.size, c), r.res.JobsPerSec(),
					us(benchkit.Percentile(r.res.First, 50)), us(benchkit.Percentile(r.res.Last, 50)), nodes, worker,
					r.res.JobsPerSec()/relay.res.JobsPerSec(),
					float64(benchkit.Percentile(r.res.First, 50))/float64(benchkit.Percentile(relay.res.First, 50)),
					nodes/(us(relay.nodes)/rj), worker/(us(relay.worker)/rj), r.res.Failed)
			}
		}
	}
	fmt.Printf("the nodes' CPU per job split: the cluster's a (where cross, grpc and grpc-batched jobs come in) and b+c; the relay's B and A\n")
	for _, sh := range shapes {
		for _, c := range levels {
			for _, st := range setups {
				r := rows[key{st.name, sh, c}]
				if jobs := float64(len(r.res.Last)); jobs > 0 {
					fmt.Printf("  %-38s %10.0f %10.0f", fmt.Sprintf("%s 16×%dB c=%d", st.name, sh.size, c), us(r.first)/jobs, us(r.nodes-r.first)/jobs)
					if len(st.nodes) == 3 {
						// b and c apart: b dispatches when the election gave it the queue.
						fmt.Printf("   (b %.0f, c %.0f)", us(r.second)/jobs, us(r.nodes-r.first-r.second)/jobs)
						// The worker's messages per job (16 outputs: 18), and
						// how many came in batches and how many each held.
						if r.batches > 0 {
							fmt.Printf("   batches: %.1f per job, %.1f messages each", r.batches/jobs, r.batched/r.batches)
						}
						// A batched stream's messages per job, and events in each.
						if r.msgs > 0 {
							fmt.Printf("   stream: %.1f messages per job, %.1f events each", float64(r.msgs)/jobs, float64(r.events)/float64(r.msgs))
						}
					}
					fmt.Println()
				}
			}
		}
	}
	fmt.Printf("system calls per job, writes/reads: the first node and the others (as the split above), the worker, the client (the load generator); and the client's CPU per job, µs\n")
	for _, sh := range shapes {
		for _, c := range levels {
			for _, st := range setups {
				r := rows[key{st.name, sh, c}]
				jobs := float64(len(r.res.Last))
				if jobs == 0 {
					continue
				}
				fmt.Printf("  %-38s", fmt.Sprintf("%s 16×%dB c=%d", st.name, sh.size, c))
				for _, s := range r.sys {
					fmt.Printf(" %5.1f/%-5.1f", float64(s.Writes)/jobs, float64(s.Reads)/jobs)
				}
				fmt.Printf(" %8.0f\n", us(r.client)/jobs)
			}
		}
	}
	fmt.Printf("the ingress node's allocations per job (a; c co-located): objects, bytes\n")
	for _, sh := range shapes {
		for _, c := range levels {
			for _, st := range setups {
				r := rows[key{st.name, sh, c}]
				if jobs := float64(len(r.res.Last)); jobs > 0 && r.mallocs > 0 {
					fmt.Printf("  %-38s %10.1f %10.0f\n", fmt.Sprintf("%s 16×%dB c=%d", st.name, sh.size, c), r.mallocs/jobs, r.allocBytes/jobs)
				}
			}
		}
	}
	// jobServiceAgainst prints the JobService setups' ratios to base's row
	// of the same shape and level: nodes' CPU per job, a's too when withA
	// (against cross: the edge, where they differ), and first output p50.
	jobServiceAgainst := func(base, of string, withA bool) {
		for _, sh := range shapes {
			for _, c := range levels {
				br := rows[key{base, sh, c}]
				if br == nil || len(br.res.Last) == 0 {
					continue
				}
				bj := float64(len(br.res.Last))
				for _, name := range []string{"grpc", "grpc-batched"} {
					r := rows[key{name, sh, c}]
					if r == nil || len(r.res.Last) == 0 {
						continue
					}
					jobs := float64(len(r.res.Last))
					var a string
					if withA {
						a = fmt.Sprintf(", a %.2fx", (us(r.first)/jobs)/(us(br.first)/bj))
					}
					fmt.Printf("  %-38s nodes %.2fx%s, first p50 %.2fx %s\n", fmt.Sprintf("%s 16×%dB c=%d", name, sh.size, c),
						(us(r.nodes)/jobs)/(us(br.nodes)/bj), a,
						float64(benchkit.Percentile(r.res.First, 50))/float64(benchkit.Percentile(br.res.First, 50)), of)
				}
			}
		}
	}
	fmt.Printf("the JobService against HTTP/SSE (cross), same run: nodes' and a's CPU per job, first output p50\n")
	jobServiceAgainst("cross", "HTTP's (cross)", true)
	// Against the relay through a gRPC edge: what Switchyard adds over a
	// bare relay of the same protocol. The gRPC edge's own ratios to the
	// HTTP relay, in the first table, are what the protocol costs at the
	// edge.
	fmt.Printf("the JobService against the relay's gRPC edge (%s), same run: nodes' CPU per job, first output p50\n", grpcFloor)
	jobServiceAgainst(grpcFloor, "the gRPC edge's", false)
	fmt.Printf("targets (issue 31, 16×32B c=64): cross jobs× ≥ 0.9, cross nodes× ≤ 1.15, colo nodes× ≤ 0.8, worker× ≤ 1.5, grpc nodes× < cross nodes×, grpc-batched nodes ≤ 0.9× cross's; c=1 first× ≤ 1.2 for cross and grpc\n")
}

var (
	procsDur     = flag.Duration("procs.dur", 3*time.Second, "BenchmarkProcesses: closed-loop time per setup, shape, concurrency and round")
	procsRounds  = flag.Int("procs.rounds", 2, "BenchmarkProcesses: rounds (setups interleaved within each)")
	procsSizes   = flag.String("procs.sizes", "32,4096", "BenchmarkProcesses: output sizes in bytes (16 outputs each)")
	procsLevels  = flag.String("procs.levels", "1,64", "BenchmarkProcesses: concurrency levels")
	procsSetups  = flag.String("procs.setups", "", "BenchmarkProcesses: comma-separated setups to run (default all; relay, the floor, always runs)")
	procsProfile = flag.String("procs.profile", "", "BenchmarkProcesses: write CPU profiles of the processes here (16×first size, highest level, last round)")
)

// benchRoleEnv re-executes the test binary as one of the relay's processes
// (TestMain): the opaque floor's "frame-node ADDR DEBUG", "frame-ingress
// ADDR GRPCADDR NODE DEBUG", "frame-worker NODE DEBUG", or the
// worker-protocol relay's "relay-node ADDR", "relay-ingress ADDR NODE",
// "bare-worker NODE DEBUG".
const benchRoleEnv = "SWITCHYARD_BENCH_ROLE"

// reexec starts the test binary as a relay process and returns its pid.
func reexec(b *testing.B, role ...string) int {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), benchRoleEnv+"="+strings.Join(role, " "))
	startProcess(b, cmd)
	return cmd.Process.Pid
}

// runBenchRole is the re-executed process: it serves its role until killed.
// An ingress or a worker retries until its node (B) listens; a worker
// dials again whenever its session ends.
func runBenchRole(role string) error {
	f := strings.Fields(role)
	ctx := context.Background()
	switch {
	case len(f) == 3 && f[0] == "frame-node":
		go servePprof(f[2])
		if _, err := benchkit.StartFrameNode(f[1]); err != nil {
			return err
		}
	case len(f) == 2 && f[0] == "relay-node":
		if _, err := benchkit.StartRelayNode(f[1], 0); err != nil {
			return err
		}
	case len(f) == 5 && f[0] == "frame-ingress":
		go servePprof(f[4])
		untilNil("frame ingress", func() error { _, err := benchkit.StartFrameIngress(f[1], f[2], f[3]); return err })
	case len(f) == 3 && f[0] == "relay-ingress":
		untilNil("relay ingress", func() error { _, err := benchkit.StartRelayIngress(f[1], f[2]); return err })
	case len(f) == 3 && f[0] == "frame-worker":
		go servePprof(f[2])
		untilNil("frame worker", func() error { return errOr(benchkit.RunFrameWorker(ctx, f[1])) })
	case len(f) == 3 && f[0] == "bare-worker":
		go servePprof(f[2])
		untilNil("bare worker", func() error { return errOr(benchkit.RunBareWorker(ctx, f[1], "demo", 256)) })
	default:
		return fmt.Errorf("%s=%q: unknown role", benchRoleEnv, role)
	}
	select {}
}

// untilNil calls try until it returns nil, a tenth of a second apart,
// printing each error under what.
func untilNil(what string, try func() error) {
	for err := try(); err != nil; err = try() {
		fmt.Fprintln(os.Stderr, what+":", err)
		time.Sleep(100 * time.Millisecond)
	}
}

// errOr is err, or an error saying the session ended when there was none:
// a bench worker serves until killed, so its session ending is always
// worth a retry.
func errOr(err error) error {
	if err == nil {
		return errors.New("session ended")
	}
	return err
}

func servePprof(addr string) {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintln(os.Stderr, "pprof:", srv.ListenAndServe())
}

// startProfiles asks each name=addr for a CPU profile of d and for the
// allocations made in d; the returned func waits for them and writes
// DIR/<setup>-<name>.pprof and DIR/<setup>-<name>.allocs.pprof.
func startProfiles(b *testing.B, setup string, urls []string, d time.Duration) func() {
	kinds := map[string]string{"profile": ".pprof", "allocs": ".allocs.pprof"}
	done := make(chan struct{}, len(urls)*len(kinds))
	for _, u := range urls {
		name, addr, _ := strings.Cut(u, "=")
		for kind, ext := range kinds {
			go func() {
				defer func() { done <- struct{}{} }()
				secs := max(1, int(d/time.Second))
				res, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/%s?seconds=%d", addr, kind, secs))
				if err != nil {
					fmt.Fprintln(os.Stderr, "profile", setup, name, err)
					return
				}
				defer res.Body.Close()
				file := strings.Join(strings.FieldsFunc(setup, func(r rune) bool { return r == ' ' || r == '(' || r == ')' }), "-")
				f, err := os.Create(filepath.Join(*procsProfile, file+"-"+name+ext))
				if err != nil {
					fmt.Fprintln(os.Stderr, "profile", err)
					return
				}
				defer f.Close()
				_, _ = io.Copy(f, res.Body)
			}()
		}
	}
	return func() {
		for range len(urls) * len(kinds) {
			<-done
		}
	}
}

func procCPU(b *testing.B, pids ...int) time.Duration {
	d, err := benchkit.ProcCPU(pids...)
	if err != nil {
		b.Fatal(err)
	}
	return d
}

func httpOK(client *http.Client, url string) bool {
	res, err := client.Get(url)
	if err != nil {
		return false
	}
	res.Body.Close()
	return res.StatusCode == http.StatusOK
}
