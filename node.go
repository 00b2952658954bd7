// Package switchyard assembles a node: the core engine, the etcd catalog,
// the gRPC worker service and the HTTP API. cmd/switchyard and the
// integration tests build nodes through Open alone, so their wiring cannot
// drift apart.
package switchyard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/resume"
	"github.com/switchyard/switchyard/core/stream"
	"github.com/switchyard/switchyard/httpapi"
	"github.com/switchyard/switchyard/peer/catalog"
	"github.com/switchyard/switchyard/peer/jobapi"
	"github.com/switchyard/switchyard/peer/workerapi"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// Node is one running Switchyard node.
type Node struct {
	cfg Config
	log *slog.Logger
	reg *prometheus.Registry

	cat     *catalog.Catalog
	engine  *core.Engine
	workers *workerapi.Server
	jobs    *jobapi.Server
	grpc    *grpc.Server
	http    *http.Server

	httpLn, grpcLn net.Listener
	stopHTTP       context.CancelFunc
	fenced         chan struct{}

	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// Open starts a node: the catalog (embedded etcd unless endpoints are
// given), the listeners, and the servers. It returns once the node is
// serving and registered in the catalog as online.
func Open(ctx context.Context, cfg Config) (_ *Node, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	log := cfg.Logger.With("node", cfg.Name)
	n := &Node{cfg: cfg, log: log, reg: prometheus.NewRegistry(), fenced: make(chan struct{})}
	defer func() {
		if err != nil {
			n.abort()
		}
	}()
	n.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	n.cat, err = catalog.Open(ctx, catalog.Config{
		Name: cfg.Name, Dir: cfg.DataDir,
		ClientAddr: cfg.EtcdClientAddr, PeerAddr: cfg.EtcdPeerAddr, Endpoints: cfg.EtcdEndpoints,
		InitialCluster: cfg.EtcdInitialCluster, ClusterState: cfg.EtcdClusterState,
		LeaseTTL: cfg.LeaseTTL, Logger: log.With("system", "catalog"),
		FastElection: cfg.FastCatalog, UnsafeNoFsync: cfg.FastCatalog,
	})
	if err != nil {
		return nil, err
	}

	ecfg := cfg.Engine
	ecfg.Catalog, ecfg.Registerer, ecfg.Logger = n.cat, n.reg, log.With("system", "engine")
	if n.engine, err = core.New(ecfg); err != nil {
		return nil, err
	}
	wcfg := cfg.Workers
	wcfg.Logger = log.With("system", "workers")
	if n.workers, err = workerapi.New(n.engine, wcfg); err != nil {
		return nil, err
	}
	hcfg := cfg.HTTP
	hcfg.Logger, hcfg.Gatherer, hcfg.Ready = log.With("system", "http"), n.reg, n.ready
	if hcfg.Keyring == nil {
		// One keyring for SSE and gRPC job streams: a resume token issued
		// on one transport resumes on the other.
		if hcfg.Keyring, err = resume.NewKeyring("k0", resume.GenerateKey("k0")); err != nil {
			return nil, err
		}
	}
	hcfg.StreamMetrics = stream.NewMetrics(n.reg)
	hcfg.Cluster = n.cat
	api, err := httpapi.New(n.engine, hcfg, n.reg)
	if err != nil {
		return nil, err
	}
	n.jobs, err = jobapi.New(n.engine, jobapi.Config{
		Stream: hcfg.Stream, Keyring: hcfg.Keyring, TokenTTL: hcfg.TokenTTL, StreamMetrics: hcfg.StreamMetrics,
		Logger: log.With("system", "jobs"),
	}, n.reg)
	if err != nil {
		return nil, err
	}

	if n.grpcLn, err = net.Listen("tcp", cfg.GRPCAddr); err != nil {
		return nil, &core.ConfigError{Field: "grpc-addr", Value: cfg.GRPCAddr, Err: err}
	}
	if n.httpLn, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
		return nil, &core.ConfigError{Field: "http-addr", Value: cfg.HTTPAddr, Err: err}
	}
	n.grpc = grpc.NewServer(
		grpc.MaxRecvMsgSize(cfg.MaxMessageBytes),
		grpc.MaxSendMsgSize(cfg.MaxMessageBytes),
		grpc.MaxConcurrentStreams(cfg.MaxConcurrentStreams),
		// Application heartbeats detect a silent worker in seconds; gRPC
		// keepalive is the transport's backstop. Accept client pings as
		// often as every 5s so a worker's keepalive is never punished.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
	)
	pb.RegisterWorkerServiceServer(n.grpc, n.workers)
	pb.RegisterJobServiceServer(n.grpc, n.jobs)

	// Streams watch this context: cancelling it is how shutdown ends SSE
	// handlers, which http.Server.Shutdown alone would wait for forever.
	httpCtx, stopHTTP := context.WithCancel(context.Background())
	n.stopHTTP = stopHTTP
	n.http = &http.Server{
		Handler:           api,
		ReadHeaderTimeout: 10 * time.Second,
		// No ReadTimeout or WriteTimeout: streams live as long as their job
		// and bound themselves (core/stream). Idle keep-alive connections do
		// not get to live forever.
		IdleTimeout: 2 * time.Minute,
		BaseContext: func(net.Listener) context.Context { return httpCtx },
		ErrorLog:    slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	n.wg.Add(3)
	go func() {
		defer n.wg.Done()
		if err := n.grpc.Serve(n.grpcLn); err != nil {
			log.Error("grpc server stopped", "err", err)
		}
	}()
	go func() {
		defer n.wg.Done()
		if err := n.http.Serve(n.httpLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server stopped", "err", err)
		}
	}()
	go func() {
		defer n.wg.Done()
		n.watchFence(httpCtx)
	}()

	if err := n.cat.PublishNode(ctx, core.NodeInfo{
		ID: cfg.Name, HTTPAddr: n.HTTPAddr(), GRPCAddr: n.GRPCAddr(), Zone: cfg.Zone, State: core.StateOnline,
	}); err != nil {
		return nil, fmt.Errorf("register node: %w", err)
	}
	log.Info("node serving", "http", n.HTTPAddr(), "grpc", n.GRPCAddr(),
		"etcd_client", n.cat.ClientAddr(), "etcd_peer", n.cat.PeerAddr(), "data_dir", cfg.DataDir)
	return n, nil
}

// HTTPAddr is the address the HTTP API is bound to.
func (n *Node) HTTPAddr() string { return n.httpLn.Addr().String() }

// GRPCAddr is the address the gRPC API is bound to.
func (n *Node) GRPCAddr() string { return n.grpcLn.Addr().String() }

// Engine returns the node's engine.
func (n *Node) Engine() *core.Engine { return n.engine }

// Catalog returns the node's catalog.
func (n *Node) Catalog() *catalog.Catalog { return n.cat }

// Registry returns the node's metrics registry.
func (n *Node) Registry() *prometheus.Registry { return n.reg }

func (n *Node) ready() error {
	select {
	case <-n.fenced:
		return errors.New("catalog lease lost")
	default:
		return nil
	}
}

// watchFence reacts to the catalog declaring the node's lease lost: from
// then on the node's registrations may be gone elsewhere, so it must not
// keep running work the cluster believes is free.
func (n *Node) watchFence(ctx context.Context) {
	select {
	case <-n.cat.LeaseLost():
		close(n.fenced)
		n.log.Error("catalog lease lost; fencing: ending every job on this node")
		n.engine.Drain(canceledContext())
	case <-ctx.Done():
	}
}

// Close drains and stops the node: new jobs are refused, bound jobs get up
// to DrainTimeout to finish, the rest end with node_shutdown; then the
// servers stop, streams end, and the catalog revokes the node's lease so its
// records vanish at once.
func (n *Node) Close(ctx context.Context) error {
	n.closeOnce.Do(func() {
		dctx, cancel := context.WithTimeout(ctx, n.cfg.DrainTimeout)
		if ended := n.engine.Drain(dctx); ended > 0 {
			n.log.Warn("drain timeout; ended open jobs", "jobs", ended)
		}
		cancel()
		n.closeErr = n.stop(ctx)
	})
	return n.closeErr
}

func (n *Node) stop(ctx context.Context) error {
	var errs []error
	// Streams see their terminal events before the servers go: Drain ended
	// every job, and each SSE writer exits after writing the terminal event.
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	n.stopHTTP()
	if err := n.http.Shutdown(sctx); err != nil {
		errs = append(errs, fmt.Errorf("shut down http: %w", err))
		_ = n.http.Close()
	}
	// Every job has ended by now, so worker sessions have nothing left to
	// say: stop at once rather than let GracefulStop wait on idle streams.
	n.grpc.Stop()
	n.workers.Wait()
	n.jobs.Wait()
	n.engine.Close()
	if err := n.cat.Close(ctx); err != nil {
		errs = append(errs, err)
	}
	n.wg.Wait()
	return errors.Join(errs...)
}

// abort undoes a partial Open.
func (n *Node) abort() {
	if n.httpLn != nil {
		_ = n.httpLn.Close()
	}
	if n.grpcLn != nil {
		_ = n.grpcLn.Close()
	}
	if n.http != nil {
		n.stopHTTP()
		_ = n.http.Close()
	}
	if n.grpc != nil {
		n.grpc.Stop()
	}
	if n.engine != nil {
		n.engine.Close()
	}
	if n.cat != nil {
		_ = n.cat.Close(context.Background())
	}
	n.wg.Wait()
}

func canceledContext() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}
