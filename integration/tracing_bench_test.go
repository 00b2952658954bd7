package integration_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/integration/benchkit"
	"github.com/switchyard/switchyard/tracing"
	"github.com/switchyard/switchyard/worker"
)

var (
	tracingJobs   = flag.Int("tracing.jobs", 1000, "BenchmarkTracing: jobs per setup at each concurrency level")
	tracingRounds = flag.Int("tracing.rounds", 4, "BenchmarkTracing: interleaved rounds the jobs are split into")
	tracingLevels = flag.String("tracing.levels", "1,64", "BenchmarkTracing: comma-separated client concurrency levels")
)

// BenchmarkTracing measures what tracing costs a job, in one run and one
// process: three 2-node clusters alike but for their tracing, each with
// the demo tokens worker (4 small outputs, no delay) on its second node:
//
//   - off: export off (the default): no span is recorded; jobs still
//     carry their W3C trace context through every hop;
//   - 1%: OTLP export on, sampler parentbased_traceidratio 0.01
//     (OTEL_TRACES_SAMPLER=parentbased_traceidratio,
//     OTEL_TRACES_SAMPLER_ARG=0.01);
//   - 100%: OTLP export on, sampler parentbased_always_on (the SDK's
//     default).
//
// Both exporting clusters send their spans over gRPC to one OTLP receiver
// in the process, which counts and drops them. The client's POSTs carry no
// traceparent, so every trace starts at the ingress and the sampler
// decides. Each mode runs co-located jobs (posted to the worker's node)
// and cross-node jobs (posted to the other node: one forward, the replies
// back); for each concurrency level every setup runs -tracing.jobs jobs in
// -tracing.rounds rounds that interleave the setups, so a slow spell of a
// shared machine falls on all of them. A table prints each setup's
// latencies (POST to first output and to done, µs), the process's CPU per
// job (the whole system's: client, nodes, workers and receiver), jobs/s
// and the spans the receiver got per job, and each mode's ratios to off.
//
//	go test -run '^$' -bench BenchmarkTracing -benchtime 1x ./integration/ -args -tracing.jobs 1000
//
// It never fails on a time: compare ratios within one run.
func BenchmarkTracing(b *testing.B) {
	const (
		queue     = "bench"
		warmup    = 200
		retention = 50 * time.Millisecond
	)
	plan := newRoundsPlan(b, "tracing", *tracingLevels, *tracingJobs, *tracingRounds)
	recv := startOTLPReceiver(b, true)
	type mode struct {
		name, what string
		sampler    sdktrace.Sampler // nil: export off
	}
	modes := []mode{
		{"off", "export off (the default): nothing recorded, the trace context carried", nil},
		{"1%", "OTLP export, parentbased_traceidratio 0.01", sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.01))},
		{"100%", "OTLP export, parentbased_always_on", sdktrace.ParentBased(sdktrace.AlwaysSample())},
	}
	type cluster struct{ ingress, host *switchyard.Node }
	clusters := map[string]cluster{}
	for mi, m := range modes {
		nodes := startCluster(b, 2, func(i int, c *switchyard.Config) {
			c.Name = fmt.Sprintf("m%d-n%d", mi, i+1)
			c.PeerHeartbeatInterval, c.PeerFailureThreshold = time.Second, 3
			c.Workers.HeartbeatInterval, c.Workers.IdleTimeout = 2*time.Second, 6*time.Second
			c.Engine.Retention = retention
			if m.sampler != nil {
				c.Tracing = tracing.Config{Endpoint: recv.endpoint(), Protocol: tracing.ProtocolGRPC, Sampler: m.sampler}
			}
		})
		clusters[m.name] = cluster{ingress: nodes[0], host: nodes[1]}
		MustStartWorker(b, nodes[1], worker.Config{Name: "bench-worker", Queue: queue, Concurrency: 128}, worker.Tokens(0))
		for _, nd := range nodes {
			waitFor(b, 10*time.Second, queue+"'s dispatcher in "+nd.Catalog().Name()+"'s view", func() bool {
				return dispatcherOf(nd, queue) == nodes[1].Catalog().Name()
			})
		}
	}

	client := benchkit.NewClient()
	b.Cleanup(client.CloseIdleConnections)
	body, _ := json.Marshal(map[string]any{"input": "one two three four", "options": map[string]any{"delay_ms": 0}})
	type setup struct {
		name, mode string
		target     string
		nodes      []string
	}
	var setups []setup
	for _, path := range []string{"co-located", "cross-node"} {
		for _, m := range modes {
			c := clusters[m.name]
			n := c.host
			if path == "cross-node" {
				n = c.ingress
			}
			setups = append(setups, setup{m.name + " " + path, m.name, baseURL(n) + "/v1/queues/" + queue + "/jobs",
				[]string{c.ingress.Catalog().Name(), c.host.Catalog().Name()}})
		}
	}
	ctx := context.Background()
	for _, s := range setups {
		warmUp(b, client, s.name, s.target, body, warmup)
	}
	flushAll := func() {
		for _, c := range clusters {
			_ = c.ingress.FlushTraces(ctx)
			_ = c.host.FlushTraces(ctx)
		}
	}
	spansOf := func(s setup) int {
		n := 0
		for _, node := range s.nodes {
			n += recv.receivedFrom(node)
		}
		return n
	}

	spans := map[string]int{}
	started := time.Now()
	results := runRounds(b, plan, setups, func(s setup) string { return s.name }, func(s setup, key string, count, c int) benchkit.Result {
		// The spans of the jobs before are exported first, so what the
		// receiver counts during the run is this run's.
		flushAll()
		before := spansOf(s)
		cpu := processCPU(b)
		r := benchkit.Run(ctx, client, s.target, body, count, c)
		// The export is part of a traced job's cost.
		flushAll()
		r.CPU = processCPU(b) - cpu
		spans[key] += spansOf(s) - before
		return r
	})

	var sb strings.Builder
	fmt.Fprintf(&sb, "\nBenchmarkTracing: the demo tokens job (4 outputs, no delay) on three 2-node clusters;\n"+
		"%d jobs per setup and level, in %d interleaved rounds; POSTs carry no traceparent\n", plan.jobs, plan.rounds)
	for _, m := range modes {
		fmt.Fprintf(&sb, "  %-5s %s\n", m.name, m.what)
	}
	for _, c := range plan.levels {
		fmt.Fprintf(&sb, "\nconcurrency %d (µs; cpu/job: the whole process's CPU µs per job; jobs/s; spans exported per job)\n", c)
		writeLoadHeader(&sb, 24)
		fmt.Fprintf(&sb, " %10s %6s\n", "spans/job", "failed")
		for _, s := range setups {
			r := results[fmt.Sprintf("c=%d/%s", c, s.name)]
			writeLoadRow(&sb, 24, s.name, *r)
			n := len(r.Last) + r.Failed
			fmt.Fprintf(&sb, " %10.2f %6d\n", float64(spans[fmt.Sprintf("c=%d/%s", c, s.name)])/float64(max(n, 1)), r.Failed)
		}
		for _, s := range setups {
			if s.mode == "off" {
				continue
			}
			path := strings.TrimPrefix(s.name, s.mode+" ")
			a, off := results[fmt.Sprintf("c=%d/%s", c, s.name)], results[fmt.Sprintf("c=%d/off %s", c, path)]
			writeRatioRow(&sb, 24, s.name+" / off", *a, *off)
		}
	}
	fmt.Print(sb.String())
	fmt.Printf("measured in %s (cluster start and warm-up before that)\n", time.Since(started).Round(time.Millisecond))
}
