package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/switchyard/switchyard/integration/benchkit"
)

// runBench drives jobs through a running node and prints, per concurrency
// level, time to first output and to the terminal event (p50, p99), jobs
// per second and, when the nodes' /metrics answer, their CPU per job. It is
// a benchmark: it reports, it never fails on a time.
// Each level runs --jobs jobs, or for --duration; --outputs and
// --output-bytes shape the job for the demo tokens worker (which sends
// each word of its input back as one output). --grpc drives the public
// JobService instead of HTTP/SSE, to measure the path without the HTTP
// edge (--grpc-batched: its SubmitBatched).
// The client code is integration/benchkit's, shared with the cluster
// benchmark (BenchmarkCluster), so their figures are measured alike.
func runBench(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	url := fs.String("url", "http://127.0.0.1:8080", "node HTTP address")
	useGRPC := fs.Bool("grpc", false, "submit through the public gRPC JobService at --grpc-addr instead of HTTP/SSE")
	grpcAddr := fs.String("grpc-addr", "127.0.0.1:9090", "with --grpc: the node's gRPC address (plaintext)")
	grpcBatched := fs.Bool("grpc-batched", false, "with --grpc: submit through SubmitBatched (events ready together in one message)")
	metrics := fs.String("metrics", "", "comma-separated /metrics URLs of the nodes whose process_cpu_seconds_total make the cpu/job column (default: --url's /metrics; \"none\" for no column)")
	queue := fs.String("queue", "demo", "queue to post to")
	jobs := fs.Int("jobs", 500, "jobs per concurrency level")
	duration := fs.Duration("duration", 0, "run each concurrency level for this long instead of --jobs jobs")
	levels := fs.String("concurrency", "1,64", "comma-separated concurrency levels")
	input := fs.String("input", "one two three four", "job input (sent as a JSON string)")
	outputs := fs.Int("outputs", 0, "instead of --input: a job of this many outputs from the demo tokens worker")
	outputBytes := fs.Int("output-bytes", 32, "with --outputs: bytes of text in each output")
	delay := fs.Int("delay-ms", 0, "options.delay_ms for the demo worker (0: as fast as it can)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	text, err := benchInput(fs, *input, *outputs, *outputBytes)
	if err != nil {
		return err
	}
	if *duration < 0 || *duration == 0 && *jobs < 1 {
		return errors.New("--jobs must be positive, or --duration set")
	}
	client := benchkit.NewClient()
	defer client.CloseIdleConnections()
	body, _ := json.Marshal(map[string]any{"input": text, "options": map[string]any{"delay_ms": *delay}})
	job := benchkit.HTTPJob(client, strings.TrimRight(*url, "/")+"/v1/queues/"+*queue+"/jobs", body)
	if *useGRPC {
		var closeConn func() error
		if job, closeConn, err = benchkit.DialGRPCJob(*grpcAddr, *queue, body, *grpcBatched); err != nil {
			return fmt.Errorf("--grpc-addr: %w", err)
		}
		defer closeConn() //nolint:errcheck // the connection is only read from

	}
	var metricURLs []string
	switch *metrics {
	case "none":
	case "":
		metricURLs = []string{strings.TrimRight(*url, "/") + "/metrics"}
	default:
		metricURLs = strings.Split(*metrics, ",")
	}
	cpu := func() (time.Duration, bool) {
		if len(metricURLs) == 0 {
			return 0, false
		}
		d, err := benchkit.ProcessCPU(ctx, client, metricURLs)
		return d, err == nil
	}

	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "concurrency\tjobs\tfailed\tfirst p50\tfirst p99\tlast p50\tlast p99\tjobs/s\tnode cpu/job\t")
	for _, ls := range strings.Split(*levels, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(ls))
		if err != nil || c < 1 {
			return fmt.Errorf("--concurrency %q: want positive integers", *levels)
		}
		cpu0, cpuOK := cpu()
		var r benchkit.Result
		if *duration > 0 {
			r = benchkit.RunJobsFor(ctx, job, *duration, c)
		} else {
			r = benchkit.RunJobs(ctx, job, *jobs, c)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		perJob := "-"
		if cpu1, ok := cpu(); cpuOK && ok {
			r.CPU = cpu1 - cpu0
			perJob = r.CPUPerJob().Round(time.Microsecond).String()
		}
		fmt.Fprintf(tw, "%d\t%d\t%d\t%s\t%s\t%s\t%s\t%.0f\t%s\t\n", c, len(r.Last)+r.Failed, r.Failed,
			pct(r.First, 50), pct(r.First, 99), pct(r.Last, 50), pct(r.Last, 99), r.JobsPerSec(), perJob)
	}
	return tw.Flush()
}

// benchInput is the job's input text: --input as given, or with --outputs
// that many words making outputs of --output-bytes each
// (benchkit.Input).
func benchInput(fs *flag.FlagSet, input string, outputs, outputBytes int) (string, error) {
	if outputs == 0 {
		return input, nil
	}
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "input" })
	switch {
	case outputs < 0:
		return "", fmt.Errorf("--outputs %d: must be positive", outputs)
	case given:
		return "", errors.New("--input and --outputs: give one")
	case outputBytes < 2:
		return "", fmt.Errorf("--output-bytes %d: must be at least 2 (a character and its space)", outputBytes)
	}
	return benchkit.Input(outputs, outputBytes), nil
}

// pct formats the p-th percentile of d for the table.
func pct(d []time.Duration, p int) string {
	if len(d) == 0 {
		return "-"
	}
	return benchkit.Percentile(d, p).Round(10 * time.Microsecond).String()
}
