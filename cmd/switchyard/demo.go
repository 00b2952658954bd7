package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/tracing"
	"github.com/switchyard/switchyard/worker"
)

// runDemo is what `make run` starts: one node with its embedded catalog and
// two demo workers attached over gRPC, the same path a remote worker takes:
// tokens on queue "demo", and chat on the OpenAI-compatible front door's
// queue, so an OpenAI SDK gets answers from model "demo" with no model
// anywhere. It prints the web page's URL and curl lines for both.
func runDemo(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	cfg, finish := nodeFlags(fs)
	delay := fs.Duration("delay", 150*time.Millisecond, "demo workers: delay before each word")
	workerKey := fs.String("worker-api-key", "", "demo workers: API key (work role on demo and the --openai-queue) when the node checks keys; better set as SWITCHYARD_WORKER_API_KEY")
	workerCA := fs.String("worker-tls-ca", "", "demo workers: PEM file of the CA that signed the node's --tls-cert")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := finish(); err != nil {
		return err
	}
	if cfg.HTTP.OpenAIQueue == "demo" {
		// Both workers declare model=demo: on one queue each would be
		// offered the other's jobs.
		return errors.New(`--openai-queue "demo" is the tokens demo's queue; pick another`)
	}
	dial, err := clientDialOptions(*workerCA, *workerKey)
	if err != nil {
		return err
	}
	// The demo workers export their spans where the node does.
	wcfg := cfg.Tracing
	wcfg.ServiceName = "switchyard-demo-worker"
	wtp, err := tracing.Open(ctx, wcfg)
	if err != nil {
		return err
	}
	defer shutdownTracing(wtp, cfg.Logger)
	n, err := switchyard.Open(ctx, *cfg)
	if err != nil {
		return err
	}
	stopReload := reloadOnHangup(n)
	defer stopReload()
	wctx, stopWorker := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, w := range []struct {
		queue, name string
		h           worker.Handler
	}{
		{"demo", "demo-worker", worker.Tokens(*delay)},
		{cfg.HTTP.OpenAIQueue, "demo-chat-worker", worker.Chat(*delay)},
	} {
		wg.Go(func() {
			err := worker.Run(wctx, worker.Config{
				Server: n.GRPCAddr(), Queue: w.queue, Name: w.name, Concurrency: 16,
				Capabilities: []string{"model=demo"}, Logger: cfg.Logger.With("system", w.name), DialOptions: dial,
				TracerProvider: wtp.TracerProvider(),
			}, w.h)
			if err != nil {
				cfg.Logger.Error("demo worker stopped", "worker", w.name, "err", err)
			}
		})
	}
	scheme := "http://"
	if cfg.TLSCert != "" {
		scheme = "https://"
	}
	url := scheme + hostForURL(n.HTTPAddr())
	fmt.Fprintf(os.Stderr, `
Switchyard is running: one node, embedded catalog, a demo worker on queue "demo",
and a demo chat worker (model "demo") behind the OpenAI-compatible front door.

  Open the web page (stream, cancel and resume a job; watch the cluster):
    %[1]s/

  Stream a job (words arrive one by one; Ctrl-C cancels it on the worker):
    curl -N -H 'Content-Type: application/json' -H 'Accept: text/event-stream' \
      -d '{"input":"the quick brown fox jumps over the lazy dog"}' %[1]s/v1/queues/demo/jobs

  Submit for later, then stream or cancel it:
    curl -s -H 'Content-Type: application/json' -d '{"input":"hello there"}' %[1]s/v1/queues/demo/jobs
    curl -N %[1]s/v1/jobs/<job_id>/events
    curl -X DELETE %[1]s/v1/jobs/<job_id>

  OpenAI-compatible chat completion, streamed (an OpenAI SDK's base URL: %[1]s/openai/v1):
    curl -N -H 'Content-Type: application/json' %[1]s/openai/v1/chat/completions \
      -d '{"model":"demo","stream":true,"messages":[{"role":"user","content":"hello from an OpenAI client"}]}'

  Metrics: %[1]s/metrics    Stop: Ctrl-C

`, url)
	<-ctx.Done()
	// Drain first, with the workers still attached, so bound jobs can
	// finish; then stop the workers, and only then close the node. The other way
	// round the node ends the worker's stream under it, and the worker
	// takes that for a lost node: it warns and starts reconnecting.
	cfg.Logger.Info("shutting down: draining", "timeout", cfg.DrainTimeout)
	dctx, cancel := context.WithTimeout(context.Background(), cfg.DrainTimeout)
	if ended := n.Engine().Drain(dctx); ended > 0 {
		cfg.Logger.Warn("drain timeout; ended open jobs", "jobs", ended)
	}
	cancel()
	stopWorker()
	wg.Wait()
	// Every job has ended: Close drains nothing more and only stops.
	cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return n.Close(cctx)
}

func hostForURL(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" || host == "::" || host == "0.0.0.0" {
		return "127.0.0.1:" + port
	}
	return net.JoinHostPort(host, port)
}
