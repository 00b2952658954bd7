package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"time"

	"github.com/switchyard/switchyard/internal/netaddr"
	"github.com/switchyard/switchyard/tracing"
	"github.com/switchyard/switchyard/worker"
)

func runWorker(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	var cfg worker.Config
	fs.StringVar(&cfg.Server, "server", "127.0.0.1:9090", "node gRPC address")
	fs.StringVar(&cfg.Queue, "queue", "demo", "queue to serve")
	fs.StringVar(&cfg.Name, "name", "", "worker name shown in logs and cluster views")
	fs.IntVar(&cfg.Concurrency, "concurrency", 4, "most jobs held at once")
	caps := stringList{}
	fs.Var(&caps, "capability", "capability key=value this worker can run (repeatable; default model=demo)")
	demo := fs.String("demo", "", "demo handler to run: tokens (streams its input's words), or chat (answers OpenAI-compatible chat completions: streams the last user message's words; serve it on the node's --openai-queue)")
	delay := fs.Duration("delay", 150*time.Millisecond, "demo: delay before each word")
	apiKey := fs.String("api-key", "", "API key (work role on the queue) for a node that checks keys; better set as SWITCHYARD_API_KEY")
	tlsCA := fs.String("tls-ca", "", "PEM file of the CA that signed the node's certificate: connect over TLS (see the node's --tls-cert)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	logFormat := fs.String("log-format", "text", "text or json")
	var tcfg tracing.Config
	fs.StringVar(&tcfg.Endpoint, "otlp-endpoint", "", "export the worker's span of each job by OTLP to this collector URL, as the node's --otlp-endpoint; off by default, or set by the standard OTEL_EXPORTER_OTLP_* variables")
	debugAddr := fs.String("debug-addr", "", "serve net/http/pprof (/debug/pprof/) on this loopback address, e.g. 127.0.0.1:6061, to profile the worker (off by default)")
	record := fs.Bool("record-runs", false, "log a line when the handler starts each job and one when it returns (job id, generation, worker name): the worker's own record of what it ran")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var h worker.Handler
	switch *demo {
	case "tokens":
		h = worker.Tokens(*delay)
	case "chat":
		h = worker.Chat(*delay)
	case "":
		return errors.New("--demo is required: this binary only ships demo handlers; write your own with the worker package (github.com/switchyard/switchyard/worker)")
	default:
		return fmt.Errorf("--demo %q: want tokens or chat", *demo)
	}
	if len(caps) == 0 {
		caps = stringList{"model=demo"}
	}
	cfg.Capabilities = caps
	opts, err := clientDialOptions(*tlsCA, *apiKey)
	if err != nil {
		return err
	}
	cfg.DialOptions = opts
	log, err := newLogger(*logLevel, *logFormat)
	if err != nil {
		return err
	}
	cfg.Logger = log
	if *record {
		name := cfg.Name
		if name == "" {
			name, _ = os.Hostname() // a container's name, in compose
		}
		h = recordRuns(h, name, log)
	}
	tcfg.ServiceName = "switchyard-worker"
	tp, err := tracing.Open(ctx, tcfg)
	if err != nil {
		return err
	}
	defer shutdownTracing(tp, log)
	cfg.TracerProvider = tp.TracerProvider()
	if *debugAddr != "" {
		stop, err := serveWorkerDebug(ctx, *debugAddr, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	log.Info("worker starting", "server", cfg.Server, "queue", cfg.Queue, "capabilities", []string(caps), "concurrency", cfg.Concurrency)
	return worker.Run(ctx, cfg, h)
}

// shutdownTracing exports the worker's last spans, within a bound.
func shutdownTracing(tp *tracing.Provider, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tp.Shutdown(ctx); err != nil {
		log.Warn("spans not exported at shutdown", "err", err)
	}
}

// serveWorkerDebug serves net/http/pprof on addr, which must be a loopback
// address (the worker has no API keys to guard it with), until stop.
func serveWorkerDebug(ctx context.Context, addr string, log *slog.Logger) (stop func(), err error) {
	if !netaddr.IsLoopback(addr) {
		return nil, fmt.Errorf("--debug-addr %q: want a loopback host:port, e.g. 127.0.0.1:6061", addr)
	}
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--debug-addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("debug server", "err", err)
		}
	}()
	log.Info("worker debug server", "addr", ln.Addr().String())
	return func() { _ = srv.Close(); <-done }, nil
}
