// Package switchyard assembles a node: the core engine, the etcd catalog,
// the gRPC worker service and the HTTP API. cmd/switchyard and the
// integration tests build nodes through Open alone, so their wiring cannot
// drift apart.
package switchyard

import (
	"context"
	"crypto/rand"
	"encoding/hex"
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

	"github.com/switchyard/switchyard/apierr"
	"github.com/switchyard/switchyard/catalog"
	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/resume"
	"github.com/switchyard/switchyard/core/stream"
	"github.com/switchyard/switchyard/grpcapi"
	"github.com/switchyard/switchyard/httpapi"
	"github.com/switchyard/switchyard/peer"
)

// Node is one running Switchyard node.
type Node struct {
	cfg Config
	log *slog.Logger
	reg *prometheus.Registry

	cat     *catalog.Catalog
	engine  *core.Engine
	workers *grpcapi.WorkerServer
	jobs    *grpcapi.JobServer
	grpc    *grpc.Server
	http    *http.Server

	peerSrv     *peer.Server
	peers       *peer.Client
	router      *peer.Router
	tracker     *peer.Tracker
	stopTracker context.CancelFunc
	trackerWG   sync.WaitGroup

	httpLn, grpcLn, peerLn net.Listener
	stopHTTP               context.CancelFunc
	fenced                 chan struct{}
	// life ends when the node stops: it bounds waits on the catalog view.
	life    context.Context
	endLife context.CancelFunc

	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// Open starts a node: the catalog (embedded etcd unless endpoints are
// given), the listeners, and the servers. The node's record is published
// in_progress once its listeners are bound, and online once its catalog view
// has loaded (catalog.Open waits for it) and its peer server answers an
// authenticated Ping; Open returns then, with the peer tracker running.
func Open(ctx context.Context, cfg Config) (_ *Node, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	log := cfg.Logger.With("node", cfg.Name)
	n := &Node{cfg: cfg, log: log, reg: prometheus.NewRegistry(), fenced: make(chan struct{})}
	n.life, n.endLife = context.WithCancel(context.Background())
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

	secret := []byte(cfg.ClusterSecret)
	if len(secret) == 0 {
		// Fine alone; a second node could never authenticate to this one.
		secret = []byte(hex.EncodeToString(randomBytes(32)))
		log.Info("no --cluster-secret: using a random one, so no other node can join this one's peer traffic")
	}
	pm := peer.NewMetrics(n.reg)
	if n.peerSrv, err = peer.NewServer(peer.ServerConfig{
		Node: cfg.Name, Secret: secret, MaxMessageBytes: cfg.MaxMessageBytes, MaxConcurrentStreams: cfg.MaxConcurrentStreams, Metrics: pm,
	}); err != nil {
		return nil, err
	}
	n.peers = peer.NewClient(peer.ClientConfig{Node: cfg.Name, Secret: secret, MaxMessageBytes: cfg.MaxMessageBytes})
	if n.tracker, err = peer.NewTracker(peer.TrackerConfig{
		Self: cfg.Name, Interval: cfg.PeerHeartbeatInterval, Threshold: cfg.PeerFailureThreshold,
		View: n.cat, Client: n.peers, Metrics: pm, Logger: log.With("system", "peers"),
	}); err != nil {
		return nil, err
	}

	ec := cfg.Engine
	if n.router, err = peer.NewRouter(peer.RouterConfig{
		Client: n.peers, MaxMessageBytes: cfg.MaxMessageBytes, Metrics: pm, Logger: log.With("system", "router"),
		Addr: func(node string) (string, bool) {
			nd, ok := n.cat.Node(node)
			if !ok && !n.cat.NodeLeft(node) {
				// Not seen yet is not gone: a node that just published its
				// record (and sent this one a message) may reach this
				// node's view a moment later. Wait for it, boundedly.
				ctx, cancel := context.WithTimeout(n.life, viewLag)
				nd, ok = n.cat.AwaitNode(ctx, node)
				cancel()
			}
			return nd.PeerAddr, ok && nd.PeerAddr != ""
		},
		Zone: func(node string) (string, bool) {
			nd, ok := n.cat.Node(node)
			return nd.Zone, ok
		},
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
		// Cancels go back on the reply legs this node's server holds, and
		// come in on the ones this node's router sends: both go through
		// the server's handler, the engine (which also hears, as a
		// peer.LegWatcher, of legs whose host went silent).
		Server: n.peerSrv,
		// The engine is built below; the router calls this from its own
		// goroutines, never from Send.
		Undeliverable: func(node string, m core.Message, reason string) {
			if e := n.engine; e != nil {
				e.Undeliverable(node, m, reason)
			}
		},
	}); err != nil {
		return nil, err
	}

	n.cat.SetReachable(func(node string) bool {
		nd, ok := n.cat.Node(node)
		return node == cfg.Name || !ok || !n.tracker.Spare(peer.NodeAddr{ID: nd.ID, PeerAddr: nd.PeerAddr})
	})

	ecfg := cfg.Engine
	ecfg.Catalog, ecfg.Registerer, ecfg.Logger = n.cat, n.reg, log.With("system", "engine")
	ecfg.Cluster = &nodeCluster{self: cfg.Name, cat: n.cat, tracker: n.tracker, transport: n.router}
	if n.engine, err = core.New(ecfg); err != nil {
		return nil, err
	}
	n.peerSrv.SetHandler(n.engine)
	// One set of API error metrics for every transport.
	errm := apierr.NewMetrics(n.reg)
	wcfg := cfg.Workers
	wcfg.Logger, wcfg.Errors = log.With("system", "workers"), errm
	if n.workers, err = grpcapi.NewWorkerServer(n.engine, wcfg); err != nil {
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
	hcfg.StreamMetrics, hcfg.Errors = stream.NewMetrics(n.reg), errm
	hcfg.Cluster = clusterView{n.cat, n.tracker}
	hcfg.Workers = wcfg
	api, err := httpapi.New(n.engine, hcfg, n.reg)
	if err != nil {
		return nil, err
	}
	n.jobs, err = grpcapi.NewJobServer(n.engine, grpcapi.JobConfig{
		Stream: hcfg.Stream, Keyring: hcfg.Keyring, TokenTTL: hcfg.TokenTTL, StreamMetrics: hcfg.StreamMetrics,
		Errors: errm, Logger: log.With("system", "jobs"),
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
	if n.peerLn, err = net.Listen("tcp", cfg.PeerAddr); err != nil {
		return nil, &core.ConfigError{Field: "peer-addr", Value: cfg.PeerAddr, Err: err}
	}
	record := core.NodeInfo{
		ID: cfg.Name, PeerAddr: n.PeerAddr(), HTTPAddr: n.HTTPAddr(), GRPCAddr: n.GRPCAddr(), Zone: cfg.Zone, State: core.StateInProgress,
	}
	// Joined, not yet routable: other nodes may write to the catalog about
	// this one, but route nothing to it.
	if err := n.cat.PublishNode(ctx, record); err != nil {
		return nil, fmt.Errorf("register node: %w", err)
	}
	cluster := grpcapi.NewClusterServer(n.engine, grpcapi.ClusterConfig{View: hcfg.Cluster, Errors: errm, Logger: log.With("system", "cluster")})
	n.grpc = grpcapi.NewServer(grpcapi.ServerConfig{MaxMessageBytes: cfg.MaxMessageBytes, MaxConcurrentStreams: cfg.MaxConcurrentStreams}, n.workers, n.jobs, cluster)

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
		// Lets a stream judged slow reach its connection's send buffer.
		ConnContext: httpapi.ConnContext,
		ErrorLog:    slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	n.wg.Add(5)
	go func() {
		defer n.wg.Done()
		if err := n.peerSrv.Serve(n.peerLn); err != nil {
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
		if err := n.http.Serve(httpapi.LimitWriteBuffer(n.httpLn, hcfg.WriteBuffer)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server stopped", "err", err)
		}
	}()
	go func() {
		defer n.wg.Done()
		n.watchFence(httpCtx)
	}()
	go func() {
		defer n.wg.Done()
		n.watchCluster(httpCtx)
	}()

	// The peer server serves when it answers this node's own authenticated
	// Ping through the same client pool its peers' calls take.
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, err = n.peers.Ping(pctx, n.PeerAddr())
	cancel()
	if err != nil {
		return nil, fmt.Errorf("peer server not answering on %s: %w", n.PeerAddr(), err)
	}
	record.State = core.StateOnline
	if err := n.cat.PublishNode(ctx, record); err != nil {
		return nil, fmt.Errorf("register node: %w", err)
	}
	tctx, stopTracker := context.WithCancel(context.Background())
	n.stopTracker = stopTracker
	n.trackerWG.Go(func() { n.tracker.Run(tctx) })
	log.Info("node serving", "http", n.HTTPAddr(), "grpc", n.GRPCAddr(), "peer", n.PeerAddr(),
		"etcd_client", n.cat.ClientAddr(), "etcd_peer", n.cat.PeerAddr(), "data_dir", cfg.DataDir)
	return n, nil
}

// HTTPAddr is the address the HTTP API is bound to.
func (n *Node) HTTPAddr() string { return n.httpLn.Addr().String() }

// GRPCAddr is the address the gRPC API is bound to.
func (n *Node) GRPCAddr() string { return n.grpcLn.Addr().String() }

// PeerAddr is the address the peer server is bound to.
func (n *Node) PeerAddr() string { return n.peerLn.Addr().String() }

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
		n.log.Error("catalog lease lost; fencing: stopping every job on this node")
		n.engine.Fence()
	case <-ctx.Done():
	}
}

// watchCluster tells the engine each time the catalog view changes (a node
// or consumer came or went: proven deaths, new routes), and every peer
// heartbeat besides, because this node's own verdict on a peer (spare or
// not) changes without any catalog write.
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
			// Lane streams re-apply the zone test (a node's zone label may
			// have changed), beside the engine's own test of its bindings.
			n.router.ZonesChanged()
		case <-tick.C:
		}
		n.engine.ClusterChanged()
	}
}

// viewLag bounds how long an address lookup waits for a node this node's
// catalog view has not seen yet (nor seen leave) to appear in it.
const viewLag = 2 * time.Second

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
	n.endLife()
	n.stopTracker()
	n.trackerWG.Wait()
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
	n.peerSrv.Stop()
	_ = n.router.Close()
	_ = n.peers.Close()
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
	n.endLife()
	if n.stopTracker != nil {
		n.stopTracker()
		n.trackerWG.Wait()
	}
	if n.peerLn != nil {
		_ = n.peerLn.Close()
	}
	if n.peerSrv != nil {
		n.peerSrv.Stop()
	}
	if n.router != nil {
		_ = n.router.Close()
	}
	if n.peers != nil {
		_ = n.peers.Close()
	}
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

// clusterView is the catalog as the cluster views (HTTP and gRPC) show it, with this
// node's verdict on each peer overlaid: a node the tracker found silent is
// spare here whatever its record says.
type clusterView struct {
	*catalog.Catalog
	tracker *peer.Tracker
}

func (v clusterView) Nodes() []core.NodeInfo {
	nodes := v.Catalog.Nodes()
	states := v.tracker.States()
	for i, nd := range nodes {
		if st, ok := states[nd.ID]; ok {
			nodes[i].State = st
		}
	}
	return nodes
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return b
}
