// Package switchyard assembles a node: the core engine, the etcd catalog,
// the peer transport, the gRPC services and the HTTP API. cmd/switchyard
// and the integration tests build nodes through Open alone, so their
// wiring cannot drift apart.
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
	"sync/atomic"
	"time"

	"github.com/switchyard/switchyard/internal/chans"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/switchyard/switchyard/apierr"
	"github.com/switchyard/switchyard/auth"
	"github.com/switchyard/switchyard/catalog"
	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/resume"
	"github.com/switchyard/switchyard/core/stream"
	"github.com/switchyard/switchyard/grpcapi"
	"github.com/switchyard/switchyard/httpapi"
	"github.com/switchyard/switchyard/peer"
	"github.com/switchyard/switchyard/tracing"
)

// Node is one running Switchyard node.
type Node struct {
	// unused are the public HTTP connections with no request yet (conns.go).
	unused unusedConns
	cfg    Config
	log    *slog.Logger
	reg    *prometheus.Registry
	// trace records and exports the node's spans (no-op with export off).
	trace *tracing.Provider

	keys *auth.Store
	// secret is the cluster secret (secret.go): the peer handshake's, and
	// the catalog's TLS is derived from it when the node has no cluster
	// CA.
	secret  []byte
	cat     *catalog.Catalog
	engine  *core.Engine
	workers *grpcapi.WorkerServer
	jobs    *grpcapi.JobServer
	grpc    *grpc.Server
	http    *http.Server

	peer        *peer.Transport
	tracker     *peer.Tracker
	stopTracker context.CancelFunc
	trackerWG   sync.WaitGroup
	// peersChanged is poked (capacity 1) when the tracker's verdict on a
	// peer changes: watchCluster passes it to the engine at once.
	peersChanged chan struct{}

	httpLn, grpcLn, peerLn net.Listener
	// debug serves net/http/pprof on debugLn when Config.DebugAddr is set.
	debug   *http.Server
	debugLn net.Listener
	// streams ends at shutdown, before the servers stop: SSE handlers and
	// the node's watchers end with it (stopHTTP).
	streams  context.Context
	stopHTTP context.CancelFunc
	// record is the node's catalog record as Open published it; fenced
	// is set while the node is fenced (fence.go), closing once Close began.
	record  core.NodeInfo
	fenced  atomic.Bool
	closing atomic.Bool
	fm      *fenceMetrics
	// life ends when the node stops: it bounds waits on the catalog view.
	life    context.Context
	endLife context.CancelFunc

	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// Open starts a node: the catalog (embedded etcd unless endpoints are
// given), the peer transport and the engine, the APIs, the listeners, and
// the servers. The node's record is published in_progress once its
// listeners are bound, and online once its catalog view has loaded
// (catalog.Open waits for it) and its peer server answers an authenticated
// Ping; Open returns then, with the peer tracker running.
func Open(ctx context.Context, cfg Config) (_ *Node, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	n := newNode(cfg)
	defer func() {
		if err != nil {
			n.abort()
		}
	}()
	if err := n.openAuth(); err != nil {
		return nil, err
	}
	if n.secret, err = n.cfg.clusterSecret(n.log); err != nil {
		return nil, err
	}
	tcfg := cfg.Tracing
	tcfg.Node = cfg.Name
	if n.trace, err = tracing.Open(ctx, tcfg); err != nil {
		return nil, err
	}
	if err := n.openCatalog(ctx); err != nil {
		return nil, err
	}
	if err := n.openCluster(); err != nil {
		return nil, err
	}
	if err := n.openAPIs(); err != nil {
		return nil, err
	}
	if err := n.listen(); err != nil {
		return nil, err
	}
	adv := n.advertised()
	record := core.NodeInfo{
		ID: cfg.Name, PeerAddr: adv.peer, HTTPAddr: adv.http, GRPCAddr: adv.grpc,
		RelayHTTPAddr: adv.relayHTTP, RelayGRPCAddr: adv.relayGRPC, Zone: cfg.Zone, State: core.StateInProgress,
	}
	// Joined, not yet routable: other nodes may write to the catalog about
	// this one, but route nothing to it.
	if err := n.cat.PublishNode(ctx, record); err != nil {
		return nil, fmt.Errorf("register node: %w", err)
	}
	n.serve()
	if err := n.awaitPeerServer(ctx); err != nil {
		return nil, err
	}
	record.State = core.StateOnline
	if err := n.cat.PublishNode(ctx, record); err != nil {
		return nil, fmt.Errorf("register node: %w", err)
	}
	n.record = record
	tctx, stopTracker := context.WithCancel(context.Background())
	n.stopTracker = stopTracker
	n.trackerWG.Go(func() { n.tracker.Run(tctx) })
	n.log.Info("node serving", "http", n.HTTPAddr(), "grpc", n.GRPCAddr(), "peer", n.PeerAddr(),
		"advertise_http", adv.http, "advertise_grpc", adv.grpc, "advertise_peer", adv.peer,
		"relay_http", adv.relayHTTP, "relay_grpc", adv.relayGRPC,
		"etcd_client", n.cat.ClientAddr(), "etcd_peer", n.cat.PeerAddr(), "data_dir", cfg.DataDir)
	return n, nil
}

// newNode is a node with its logger, registry and lifetimes, and nothing
// open yet.
func newNode(cfg Config) *Node {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	// Every log line logged with a job's context carries its trace id.
	cfg.Logger = slog.New(tracing.LogHandler(cfg.Logger.Handler()))
	n := &Node{cfg: cfg, log: cfg.Logger.With("node", cfg.Name), reg: prometheus.NewRegistry(), peersChanged: make(chan struct{}, 1)}
	n.fm = newFenceMetrics(n.reg)
	n.life, n.endLife = context.WithCancel(context.Background())
	// Streams watch this context: cancelling it is how shutdown ends SSE
	// handlers, which http.Server.Shutdown alone would wait for forever.
	n.streams, n.stopHTTP = context.WithCancel(context.Background())
	n.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return n
}

// openCatalog opens the catalog: it returns once the node's view of it
// has loaded.
func (n *Node) openCatalog(ctx context.Context) (err error) {
	cfg := n.cfg
	n.cat, err = catalog.Open(ctx, catalog.Config{
		Name: cfg.Name, Dir: cfg.DataDir,
		ClientAddr: cfg.EtcdClientAddr, PeerAddr: cfg.EtcdPeerAddr, Endpoints: cfg.EtcdEndpoints,
		InitialCluster: cfg.EtcdInitialCluster, ClusterState: cfg.EtcdClusterState,
		LeaseTTL: cfg.LeaseTTL, Logger: n.log.With("system", "catalog"),
		TLS: cfg.catalogTLS(), Secret: n.secret, Username: cfg.EtcdUsername, Password: cfg.EtcdPassword,
		FastElection: cfg.FastCatalog, UnsafeNoFsync: cfg.FastCatalog,
		Metrics: catalog.NewMetrics(n.reg),
	})
	return err
}

// openCluster builds the peer transport, the tracker of its peers, and the
// engine on both, then starts routing: the one place the engine and the
// transport meet. The transport is built from its config alone, the engine
// with it, and Start hands the transport the engine; until then the
// transport refuses routing calls (Unavailable), and nothing is sent,
// since the engine is the only sender.
func (n *Node) openCluster() (err error) {
	cfg, secret := n.cfg, n.secret
	serverTLS, clientTLS, err := n.peerTLS()
	if err != nil {
		return err
	}
	pm := peer.NewMetrics(n.reg)
	book := peerBook{cat: n.cat, life: n.life}
	ec := cfg.Engine
	if n.peer, err = peer.New(peer.Config{
		Node: cfg.Name, Secret: secret, ServerTLS: serverTLS, ClientTLS: clientTLS,
		MaxMessageBytes: cfg.MaxMessageBytes, MaxConcurrentStreams: cfg.MaxConcurrentStreams,
		Dialer: cfg.PeerDialer,
		Addr:   book.addr, Zone: book.zone,
		// A job sent to a node is meant for its incarnation as the view
		// names it; one meant for a previous incarnation of this node is
		// dropped (docs/cluster.md, "Incarnations").
		Incarnation: book.incarnation, Self: n.cat.Incarnation,
		// A delivery must be acked within the time its worker would get to
		// accept it: a fraction of what is left of its TTL, so the accept
		// wait never eats the budget the work needs.
		AckTimeout: func(m core.Message) time.Duration {
			if m.Delivery != nil {
				return core.DispatchTimeout(m.Delivery.TTL, ec.DispatchTimeoutFloor, ec.DispatchTimeoutCeiling, ec.DispatchTimeoutFraction)
			}
			return ec.DispatchTimeoutCeiling
		},
		AckTimeoutCeiling: ec.DispatchTimeoutCeiling,
		StreamIdle:        cfg.PeerStreamIdle,
		Heartbeat:         cfg.PeerHeartbeatInterval,
		ForceUnary:        cfg.PeerForceUnary,
		// Read when a peer asks, once the node serves: the engine is
		// built by then.
		Figures: func() core.NodeFigures { return httpapi.ReadFigures(n.engine, n.reg) },
		// The tracker is built next, before the transport starts: no
		// evidence can come earlier.
		Suspect: func(node string) { n.tracker.Suspect(node) },
		Metrics: pm,
		Logger:  n.log.With("system", "peer"),
	}); err != nil {
		return err
	}
	if n.tracker, err = peer.NewTracker(peer.TrackerConfig{
		Self: cfg.Name, Interval: cfg.PeerHeartbeatInterval, Threshold: cfg.PeerFailureThreshold, SuspectAfter: cfg.PeerSuspectAfter,
		View: n.cat, Client: n.peer.Client(), Metrics: pm, Logger: n.log.With("system", "peers"),
		Related: func() map[string]bool { return n.cat.Related(cfg.Name) },
		OnChange: func() {
			chans.Notify(n.peersChanged)
		},
	}); err != nil {
		return err
	}
	cluster := &nodeCluster{self: cfg.Name, cat: n.cat, tracker: n.tracker}
	n.cat.SetReachable(cluster.reachable)

	ecfg := cfg.Engine
	// A live dispatcher answers a forward within milliseconds; one that
	// has not within a peer heartbeat is treated as silent by Submit: the
	// job is accepted and its forward goes on (core/reroute.go).
	ecfg.ForwardWait = min(cfg.PeerHeartbeatInterval, ecfg.DispatcherWait)
	ecfg.Catalog, ecfg.Cluster, ecfg.Transport, ecfg.Idempotency = n.cat, cluster, n.peer, n.cat
	ecfg.Registerer, ecfg.Logger = n.reg, n.log.With("system", "engine")
	if n.trace.Exporting() {
		ecfg.Tracer = n.trace.Tracer()
	}
	if n.engine, err = core.New(ecfg); err != nil {
		return err
	}
	n.peer.Start(n.engine)
	return nil
}

// openAPIs builds what serves clients and workers on the engine: the gRPC
// WorkerService and JobService, and the HTTP API.
func (n *Node) openAPIs() (err error) {
	cfg := n.cfg
	// One set of API error metrics for every transport.
	errm := apierr.NewMetrics(n.reg)
	wcfg := cfg.Workers
	wcfg.Logger, wcfg.Errors, wcfg.Registerer = n.log.With("system", "workers"), errm, n.reg
	if n.workers, err = grpcapi.NewWorkerServer(n.engine, wcfg); err != nil {
		return err
	}
	hcfg := cfg.HTTP
	hcfg.Logger, hcfg.Gatherer, hcfg.Ready = n.log.With("system", "http"), n.reg, n.ready
	if hcfg.Keyring == nil {
		// One keyring for SSE and gRPC job streams: a resume token issued
		// on one transport resumes on the other.
		if hcfg.Keyring, err = resume.NewKeyring("k0", resume.GenerateKey("k0")); err != nil {
			return err
		}
	}
	hcfg.StreamMetrics, hcfg.Errors, hcfg.Keys = stream.NewMetrics(n.reg), errm, n.keys
	hcfg.Cluster = n.views()
	hcfg.Members = n.cat
	hcfg.ClusterChanges, hcfg.PeerFigures = n.cat.Watch, n.peerFigures
	if hcfg.RelayTLS, err = n.relayTLS(); err != nil {
		return err
	}
	hcfg.Workers = wcfg
	var tp trace.TracerProvider // nil with export off: the edges then only read the caller's trace context
	if n.trace.Exporting() {
		tp = n.trace.TracerProvider()
	}
	hcfg.TracerProvider = tp
	api, err := httpapi.New(n.engine, hcfg, n.reg)
	if err != nil {
		return err
	}
	jcfg := api.JobConfig()
	jcfg.Logger = n.log.With("system", "jobs")
	// A batch well under what the server may send.
	jcfg.MaxBatchBytes = min(grpcapi.DefaultMaxBatchBytes, cfg.MaxMessageBytes/2)
	n.jobs, err = grpcapi.NewJobServer(n.engine, jcfg, n.reg)
	if err != nil {
		return err
	}
	cluster := grpcapi.NewClusterServer(n.engine, grpcapi.ClusterConfig{View: hcfg.Cluster, Errors: errm, Logger: n.log.With("system", "cluster")})
	public, err := n.publicTLS()
	if err != nil {
		return err
	}
	var creds credentials.TransportCredentials
	if public != nil {
		creds = credentials.NewTLS(public)
	}
	n.grpc = grpcapi.NewServer(grpcapi.ServerConfig{
		MaxMessageBytes: cfg.MaxMessageBytes, MaxConcurrentStreams: cfg.MaxConcurrentStreams,
		Keys: n.keys, Creds: creds, Errors: errm, Logger: n.log.With("system", "grpc"),
		TracerProvider: tp,
	}, n.workers, n.jobs, cluster)
	n.debug = newDebugServer(api, n.log)
	n.http = &http.Server{
		// With --tls-cert: HTTPS, and HTTP/2 by ALPN (ServeTLS offers h2).
		TLSConfig: public,
		Handler:   api,
		// Headers: a time and a size bound (a header trickle is cut, a huge
		// header is 431). No ReadTimeout or WriteTimeout: streams live as
		// long as their job and bound themselves (core/stream); a request
		// body has its own deadline (httpapi/body.go). Idle keep-alive
		// connections do not get to live forever.
		ReadHeaderTimeout: hcfg.HeaderTimeout,
		MaxHeaderBytes:    hcfg.MaxHeaderBytes,
		IdleTimeout:       2 * time.Minute,
		BaseContext:       func(net.Listener) context.Context { return n.streams },
		// Lets a stream judged slow reach its connection's send buffer.
		ConnContext: httpapi.ConnContext,
		ConnState:   n.unused.track,
		ErrorLog:    slog.NewLogLogger(n.log.Handler(), slog.LevelDebug),
	}
	return nil
}

// listen binds the gRPC, HTTP and peer listeners.
func (n *Node) listen() (err error) {
	cfg := n.cfg
	if n.grpcLn, err = net.Listen("tcp", cfg.GRPCAddr); err != nil {
		return &core.ConfigError{Field: "grpc-addr", Value: cfg.GRPCAddr, Err: err}
	}
	if n.httpLn, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
		return &core.ConfigError{Field: "http-addr", Value: cfg.HTTPAddr, Err: err}
	}
	if n.peerLn, err = net.Listen("tcp", cfg.PeerAddr); err != nil {
		return &core.ConfigError{Field: "peer-addr", Value: cfg.PeerAddr, Err: err}
	}
	if cfg.DebugAddr != "" {
		if n.debugLn, err = net.Listen("tcp", cfg.DebugAddr); err != nil {
			return &core.ConfigError{Field: "debug-addr", Value: cfg.DebugAddr, Err: err}
		}
	}
	return nil
}

// serve starts the node's goroutines: the three servers, the fence watch
// and the cluster watch. stop waits for them.
func (n *Node) serve() {
	log := n.log
	n.wg.Add(5)
	go func() {
		defer n.wg.Done()
		if err := n.peer.Serve(n.peerLn); err != nil {
			log.Error("peer server stopped", "err", err)
		}
	}()
	go func() {
		defer n.wg.Done()
		if err := n.grpc.Serve(n.grpcLn); err != nil {
			log.Error("grpc server stopped", "err", err)
		}
	}()
	go func() {
		defer n.wg.Done()
		ln := httpapi.LimitWriteBuffer(n.httpLn, n.cfg.HTTP.WriteBuffer)
		serve := n.http.Serve
		if n.http.TLSConfig != nil {
			serve = func(ln net.Listener) error { return n.http.ServeTLS(ln, "", "") }
		}
		if err := serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server stopped", "err", err)
		}
	}()
	go func() {
		defer n.wg.Done()
		n.watchFence(n.streams)
	}()
	if n.debugLn != nil {
		n.wg.Go(func() {
			if err := n.debug.Serve(n.debugLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("debug server stopped", "err", err)
			}
		})
	}
	go func() {
		defer n.wg.Done()
		n.watchCluster(n.streams)
	}()
}

// awaitPeerServer returns once the peer server serves: it answers this
// node's own authenticated Ping through the same client pool its peers'
// calls take.
func (n *Node) awaitPeerServer(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := n.peer.Client().Ping(pctx, n.cfg.Name, n.PeerAddr()); err != nil {
		return fmt.Errorf("peer server not answering on %s: %w", n.PeerAddr(), err)
	}
	return nil
}

// advertised is what the node's catalog record says to dial it at
// (advertise.go), from its bound listeners.
func (n *Node) advertised() advertisedAddrs {
	cfg := n.cfg
	peer := advertiseAddr(cfg.AdvertisePeerAddr, n.peerLn.Addr(), hostAddress)
	return advertisedAddrs{
		http:      advertiseAddr(cfg.AdvertiseHTTPAddr, n.httpLn.Addr(), hostAddress),
		grpc:      advertiseAddr(cfg.AdvertiseGRPCAddr, n.grpcLn.Addr(), hostAddress),
		peer:      peer,
		relayHTTP: relayAddr(n.httpLn.Addr(), peer),
		relayGRPC: relayAddr(n.grpcLn.Addr(), peer),
	}
}

// HTTPAddr is the address the HTTP API is bound to.
func (n *Node) HTTPAddr() string { return n.httpLn.Addr().String() }

// GRPCAddr is the address the gRPC API is bound to.
func (n *Node) GRPCAddr() string { return n.grpcLn.Addr().String() }

// DebugAddr is the address the profiling server is bound to, "" when the
// node has none (Config.DebugAddr).
func (n *Node) DebugAddr() string {
	if n.debugLn == nil {
		return ""
	}
	return n.debugLn.Addr().String()
}

// PeerAddr is the address the peer server is bound to (other nodes dial
// the advertised one in its catalog record).
func (n *Node) PeerAddr() string { return n.peerLn.Addr().String() }

// views is the catalog as this node's cluster views show it (clusterView).
func (n *Node) views() clusterView { return clusterView{Catalog: n.cat, tracker: n.tracker, self: n} }

// PeerStates returns every node in the catalog view with its state as this
// node sees it (see peer.Tracker.States).
func (n *Node) PeerStates() map[string]core.PeerState { return n.tracker.States() }

// Engine returns the node's engine.
func (n *Node) Engine() *core.Engine { return n.engine }

// Catalog returns the node's catalog.
func (n *Node) Catalog() *catalog.Catalog { return n.cat }

// Registry returns the node's metrics registry.
func (n *Node) Registry() *prometheus.Registry { return n.reg }

func (n *Node) ready() error {
	if n.fenced.Load() {
		return errors.New("catalog lease lost")
	}
	return nil
}

// watchCluster tells the engine each time the catalog view changes (a node
// or consumer came or went: proven deaths, new routes), and every peer
// heartbeat besides, because this node's own verdict on a peer (spare or
// not) changes without any catalog write; a peer that turned spare is
// passed on at once (Engine.PeersSilent: silence ends its jobs here).
func (n *Node) watchCluster(ctx context.Context) {
	changed, unsubscribe := n.cat.Watch()
	defer unsubscribe()
	tick := time.NewTicker(n.cfg.PeerHeartbeatInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
			// Delivery streams re-apply the zone test (a node's zone label may
			// have changed), beside the engine's own test of its bindings.
			n.peer.ZonesChanged()
		case <-n.peersChanged:
		case <-tick.C:
		}
		n.engine.PeersSilent(n.tracker.SpareNodes())
		n.engine.ClusterChanged()
	}
}

// Close leaves the cluster gracefully, then stops the node: the engine
// drains (core.Engine.Drain, bounded by DrainTimeout) while every server
// keeps serving, the transport delivers what the drain sent (within
// awaitAcksTimeout), then the servers stop and the catalog revokes the
// node's lease so its records vanish at once. What the drain does, step
// by step, is docs/cluster.md, "Leaving the cluster (SIGTERM)". Close is
// safe to call more than once; every call returns the first one's error.
func (n *Node) Close(ctx context.Context) error {
	n.closeOnce.Do(func() {
		n.closing.Store(true)
		start := time.Now()
		dctx, cancel := context.WithTimeout(ctx, n.cfg.DrainTimeout)
		if ended := n.engine.Drain(dctx); ended > 0 {
			n.log.Warn("drain timeout; ended open jobs", "jobs", ended)
		}
		cancel()
		sctx, cancel := context.WithTimeout(ctx, awaitAcksTimeout)
		if err := n.peer.AwaitAcks(sctx); err != nil {
			n.log.Warn("closing with peer messages undelivered", "err", err)
		}
		cancel()
		n.log.Info("drained", "took", time.Since(start).Round(time.Millisecond))
		n.closeErr = n.stop(ctx)
	})
	return n.closeErr
}

// awaitAcksTimeout bounds how long Close waits, after the drain, for the
// other nodes to acknowledge what this one sent them.
const awaitAcksTimeout = 2 * time.Second

func (n *Node) stop(ctx context.Context) error {
	var errs []error
	n.endLife()
	n.stopTracker()
	n.trackerWG.Wait()
	// Streams see their terminal events before the servers go: Drain ended
	// every job, and each SSE writer exits after writing the terminal event.
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	n.stopHTTP()
	n.closeDebug()
	n.unused.close()
	if err := n.http.Shutdown(sctx); err != nil {
		errs = append(errs, fmt.Errorf("shut down http: %w", err))
		_ = n.http.Close()
	}
	// Every job on this node's workers has ended or been released by now
	// (the drain), so worker sessions have nothing left to say: stop at
	// once rather than let GracefulStop wait on idle streams.
	n.grpc.Stop()
	_ = n.peer.Close()
	n.workers.Wait()
	n.jobs.Wait()
	n.engine.Close()
	if err := n.cat.Close(ctx); err != nil {
		errs = append(errs, err)
	}
	n.wg.Wait()
	// Last: every job's spans have ended by now (Engine.Close ended the
	// rest); what is not exported within ctx is dropped, with a warning.
	tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := n.trace.Shutdown(tctx); err != nil {
		n.log.Warn("spans not exported at shutdown", "err", err)
	}
	return errors.Join(errs...)
}

// FlushTraces exports every span of the node that has ended.
func (n *Node) FlushTraces(ctx context.Context) error { return n.trace.Flush(ctx) }

// abort undoes a partial Open.
func (n *Node) abort() {
	n.endLife()
	if n.trace != nil {
		_ = n.trace.Shutdown(context.Background())
	}
	if n.stopTracker != nil {
		n.stopTracker()
		n.trackerWG.Wait()
	}
	if n.peerLn != nil {
		_ = n.peerLn.Close()
	}
	if n.peer != nil {
		_ = n.peer.Close()
	}
	if n.httpLn != nil {
		_ = n.httpLn.Close()
	}
	if n.grpcLn != nil {
		_ = n.grpcLn.Close()
	}
	n.stopHTTP()
	if n.http != nil {
		_ = n.http.Close()
	}
	if n.debugLn != nil {
		_ = n.debugLn.Close()
	}
	n.closeDebug()
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
