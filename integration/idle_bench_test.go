package integration_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/integration/benchkit"
)

var idleStreams = flag.Int("idle.streams", 10000, "BenchmarkIdleStreams: streams held open on one node")

// bareSSEEnv makes the test binary, re-executed, serve benchkit.ServeBareSSE
// on the address it names instead of running tests (see TestMain).
const bareSSEEnv = "SWITCHYARD_BENCH_BARE_SSE"

// BenchmarkIdleStreams measures what an open, idle SSE job stream costs a
// node: the real binary runs a node, and another process (`switchyard
// worker --demo tokens --concurrency 1`) runs one job that takes a quarter
// of an hour, so the -idle.streams jobs posted after it wait in the queue,
// each with its POST's stream open from this process and silent but for
// heartbeats: an open stream with its job, as a client waiting for a
// busy worker has. The
// node's RSS, heap and stacks in use (after a collection) and goroutines
// are read before the streams open and with all of them open; the
// difference over the streams is the cost of one. A plain net/http SSE
// server (one event, then the open connection; the test binary
// re-executed) is measured alike in the same run, for scale.
//
// It needs about 2 × -idle.streams + 100 file descriptors in this process
// and in the node: raise the limit first (ulimit -n 25000; Go raises its
// soft limit to the hard one by itself, so the hard limit is what counts).
//
//	go test -run '^$' -bench BenchmarkIdleStreams -benchtime 1x ./integration/ -args -idle.streams 10000
func BenchmarkIdleStreams(b *testing.B) {
	n := *idleStreams
	dir := b.TempDir()
	bin := filepath.Join(dir, "switchyard")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/switchyard").CombinedOutput(); err != nil {
		b.Fatalf("build: %v\n%s", err, out)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}}
	b.Cleanup(client.CloseIdleConnections)

	// Switchyard: a node, and the worker in a process of its own.
	httpAddr, grpcAddr, debugAddr := freeAddr(b), freeAddr(b), freeAddr(b)
	node := exec.Command(bin, "node", "--name", "idle", "--http-addr", httpAddr, "--grpc-addr", grpcAddr,
		"--debug-addr", debugAddr, "--data-dir", filepath.Join(dir, "data"), "--log-level", "warn",
		"--max-ttl", "15m", "--max-queue-depth", strconv.Itoa(n+100))
	startProcess(b, node)
	waitFor(b, 30*time.Second, "the node to be ready", func() bool {
		res, err := client.Get("http://" + httpAddr + "/readyz")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	})
	wk := exec.Command(bin, "worker", "--server", grpcAddr, "--queue", "idle", "--demo", "tokens",
		"--concurrency", "1", "--log-level", "warn")
	startProcess(b, wk)
	target := "http://" + httpAddr + "/v1/queues/idle/jobs"
	// 90 words, 10s (the demo worker's longest delay) before each.
	body, _ := json.Marshal(map[string]any{"input": strings.Repeat("x ", 90), "ttl_ms": 15 * 60 * 1000, "options": map[string]any{"delay_ms": 10000}})
	waitFor(b, 30*time.Second, "the worker to register", func() bool {
		res, err := client.Post(target, "application/json", bytes.NewReader(body))
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode/100 == 2
	})
	sy := measureIdle(b, client, node.Process.Pid, "http://"+debugAddr+"/debug/pprof/", target, body, n)

	// The plain net/http SSE server.
	bareAddr := freeAddr(b)
	bare := exec.Command(os.Args[0], "-test.run", "^$")
	bare.Env = append(os.Environ(), bareSSEEnv+"="+bareAddr)
	startProcess(b, bare)
	waitFor(b, 10*time.Second, "the plain SSE server", func() bool {
		c, err := net.Dial("tcp", bareAddr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	plain := measureIdle(b, client, bare.Process.Pid, "http://"+bareAddr+"/debug/pprof/", "http://"+bareAddr+"/sse", []byte("{}"), n)

	per := func(v int64) float64 { return float64(v) / float64(n) / 1024 }
	fmt.Printf("\nBenchmarkIdleStreams: %d open, idle SSE streams on one process (after a GC; per stream)\n", n)
	fmt.Printf("  %-32s %10s %10s %10s %12s\n", "", "RSS KiB", "heap KiB", "stack KiB", "goroutines")
	for _, r := range []struct {
		name string
		f    benchkit.Footprint
	}{{"switchyard node (POST stream)", sy}, {"plain net/http SSE", plain}} {
		fmt.Printf("  %-32s %10.1f %10.1f %10.1f %12.2f\n", r.name, per(r.f.RSS), per(r.f.HeapInuse), per(r.f.StackInuse), float64(r.f.Goroutines)/float64(n))
	}
	fmt.Printf("  %-32s %9.2fx %9.2fx %9.2fx %11.2fx\n", "switchyard / plain", float64(sy.RSS)/float64(plain.RSS),
		float64(sy.HeapInuse)/float64(plain.HeapInuse), float64(sy.StackInuse)/float64(plain.StackInuse), float64(sy.Goroutines)/float64(plain.Goroutines))
	fmt.Printf("targets (issue 15): ≤ 32 KiB RSS and ≤ 2 goroutines per open stream\n")
	b.ReportMetric(per(sy.RSS), "rss-KiB/stream")
	b.ReportMetric(float64(sy.Goroutines)/float64(n), "goroutines/stream")
}

// measureIdle opens n streams on the process pid and returns its footprint
// with them open, less its footprint before.
func measureIdle(b *testing.B, client *http.Client, pid int, debugURL, target string, body []byte, n int) benchkit.Footprint {
	b.Helper()
	ctx := b.Context()
	before, err := benchkit.MeasureFootprint(ctx, client, pid, debugURL)
	if err != nil {
		b.Fatal(err)
	}
	// A client of its own: one connection per stream, none shared with
	// the measurements.
	streams := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}}
	closeStreams, err := benchkit.OpenStreams(ctx, streams, target, body, n, 64)
	if err != nil {
		b.Fatalf("open %d streams: %v", n, err)
	}
	defer func() { closeStreams(); streams.CloseIdleConnections() }()
	time.Sleep(2 * time.Second) // let the last writes and hand-offs settle
	after, err := benchkit.MeasureFootprint(ctx, client, pid, debugURL)
	if err != nil {
		b.Fatal(err)
	}
	return after.Sub(before)
}

// startProcess starts cmd, killed when the benchmark ends.
func startProcess(b *testing.B, cmd *exec.Cmd) {
	b.Helper()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
}
