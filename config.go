package switchyard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"time"

	"github.com/switchyard/switchyard/auth"
	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/grpcapi"
	"github.com/switchyard/switchyard/httpapi"
	"github.com/switchyard/switchyard/internal/netaddr"
	"github.com/switchyard/switchyard/peer"
	"github.com/switchyard/switchyard/tracing"
)

// Config is everything a node needs. Start from DefaultConfig; cmd fills it
// from flags and SWITCHYARD_* variables, tests set fields directly.
type Config struct {
	// Name is the node's id in the cluster.
	Name string
	// HTTPAddr and GRPCAddr are the listen addresses; port 0 picks one.
	HTTPAddr string
	GRPCAddr string
	// DataDir holds the embedded etcd member.
	DataDir string
	Zone    string

	// EtcdClientAddr and EtcdPeerAddr are the embedded member's listeners
	// (port 0 by default: a single member is reached in-process, so several
	// nodes on one machine never clash). EtcdEndpoints, when set, embeds
	// nothing and uses that etcd cluster instead.
	EtcdClientAddr string
	EtcdPeerAddr   string
	EtcdEndpoints  []string
	// EtcdInitialCluster makes the embedded member one of a cluster of
	// nodes that each embed one ("n1=http://127.0.0.1:2380,n2=…", etcd's
	// --initial-cluster); EtcdClusterState is "new" or "existing".
	EtcdInitialCluster string
	EtcdClusterState   string
	LeaseTTL           time.Duration

	// DrainTimeout bounds how long SIGTERM lets the jobs the node holds
	// finish: its clients' and those its workers run (Node.Close).
	DrainTimeout time.Duration
	// PeerAddr is the listen address of the node-to-node PeerService
	// (port 0 picks one).
	PeerAddr string
	// AdvertiseHTTPAddr, AdvertiseGRPCAddr and AdvertisePeerAddr are the
	// addresses the node's catalog record carries for its HTTP, gRPC and
	// peer listeners: what views, the web page, relays and other nodes'
	// peer transports dial. Empty: the bound address, or for a bind on
	// every interface the host's own address with the bound port
	// (advertise.go).
	AdvertiseHTTPAddr, AdvertiseGRPCAddr, AdvertisePeerAddr string
	// ClusterSecret authenticates nodes to each other: every peer
	// connection's handshake proves it, both ways, bound to that
	// connection (peer/handshake.go); without a cluster CA (PeerTLSCert),
	// the catalog's TLS is derived from it (catalog/derive.go), so it also
	// opens the catalog. Nodes of one cluster must share it. At least 16
	// bytes. Empty: the node keeps one of its own in DataDir/cluster-secret,
	// made at its first start (secret.go), which the members of an
	// embedded cluster cannot do (EtcdInitialCluster needs it given). It
	// proves membership, not the channel: PeerTLSCert and the rest make
	// the channel mutual TLS.
	ClusterSecret string
	// PeerHeartbeatInterval is how often the node pings the peers it works
	// with (peer.Tracker); one that misses PeerSuspectAfter pings in a row
	// is suspected in this node's view (offered nothing new, its queues
	// taken over), and one that misses PeerFailureThreshold is spare
	// (silent).
	PeerHeartbeatInterval time.Duration
	PeerFailureThreshold  int
	PeerSuspectAfter      int
	// PeerStreamIdle closes a delivery stream (one per peer node and queue)
	// that carried nothing for this long; the next delivery re-opens it.
	// It must be well above the dispatch timeout ceiling.
	PeerStreamIdle time.Duration
	// PeerForceUnary sends every peer message by unary calls instead of
	// delivery streams: the fallback, as an operator switch.
	PeerForceUnary bool

	// gRPC limits, set on every server and client from here.
	MaxMessageBytes      int
	MaxConcurrentStreams uint32

	// DebugAddr, when set, serves net/http/pprof there (debug.go), so an
	// operator can profile a node under their own load. It must be a
	// loopback address unless DebugAllowRemote; on a node with API keys
	// the profiles need an admin key whatever the address.
	DebugAddr        string
	DebugAllowRemote bool

	Engine  core.Config
	HTTP    httpapi.Config
	Workers grpcapi.WorkerConfig

	// TLSCert and TLSKey serve the HTTP port (HTTP/2 included) and the
	// public gRPC port over TLS, the certificate reloaded when its files
	// change (tls.go). Empty: plaintext.
	TLSCert, TLSKey string
	// TLSCA is the CA of the other nodes' public certificates, beside the
	// system's roots and PeerTLSCA: a node relays a retried submission to
	// the node its job lives on through that node's public port.
	TLSCA string
	// PeerTLSCert, PeerTLSKey and PeerTLSCA are the cluster's mutual TLS:
	// the peer port requires a certificate PeerTLSCA signed from every
	// node (beside the cluster secret), and the embedded etcd member
	// serves its client and peer ports with the same certificate,
	// requiring the same of its clients. All three or none.
	PeerTLSCert, PeerTLSKey, PeerTLSCA string
	// EtcdTLSCert, EtcdTLSKey and EtcdTLSCA are how the node reaches an
	// external etcd over https (default: the peer TLS files, else, for
	// the members of an embedded cluster, a certificate derived from the
	// cluster secret); EtcdUsername and EtcdPassword authenticate it there
	// (etcd's users and roles: docs/cluster.md, "An external etcd").
	EtcdTLSCert, EtcdTLSKey, EtcdTLSCA string
	EtcdUsername, EtcdPassword         string

	// Auth is where the node's API keys come from (--auth-file, and
	// SWITCHYARD_AUTH_KEYS); with neither, the node has no keys and every
	// call is anonymous, which Validate allows on loopback addresses only
	// unless AllowAnonymous says otherwise.
	Auth           auth.Source
	AllowAnonymous bool

	// Tracing is how the node exports its spans (--otlp-endpoint and the
	// standard OTEL_* variables; off by default): docs/tracing.md. Its
	// Node is the node's Name.
	Tracing tracing.Config

	// FastCatalog shortens etcd's election timing and skips fsync: tests only.
	FastCatalog bool
	// PeerDialer, if set, makes the node's connections to other nodes'
	// peer ports (peer.ClientConfig.Dialer): for tests that watch them,
	// and for an embedder that routes peer traffic through something of
	// its own. It has no flag; nil: TCP.
	PeerDialer func(ctx context.Context, addr string) (net.Conn, error)
	Logger     *slog.Logger
}

// DefaultConfig returns a node configuration that works out of the box.
func DefaultConfig() Config {
	engine := core.DefaultConfig()
	// Left at 0, the output window is half the streams' bound (outputWindow).
	engine.OutputWindowEvents, engine.OutputWindowBytes = 0, 0
	return Config{
		Name:                  "node-1",
		HTTPAddr:              "127.0.0.1:8080",
		GRPCAddr:              "127.0.0.1:9090",
		PeerAddr:              "127.0.0.1:0",
		DataDir:               "data/node-1",
		EtcdClientAddr:        "127.0.0.1:0",
		EtcdPeerAddr:          "127.0.0.1:0",
		LeaseTTL:              10 * time.Second,
		DrainTimeout:          30 * time.Second,
		MaxMessageBytes:       4 << 20,
		MaxConcurrentStreams:  10000,
		PeerHeartbeatInterval: time.Second,
		PeerFailureThreshold:  3,
		PeerSuspectAfter:      1,
		PeerStreamIdle:        30 * time.Second,
		Engine:                engine,
		HTTP:                  httpapi.DefaultConfig(),
		Workers:               grpcapi.DefaultWorkerConfig(),
	}
}

// Validate reports the first setting that cannot work, naming its flag.
func (c *Config) Validate() error {
	c.Engine.Node, c.Engine.Zone = c.Name, c.Zone
	for _, a := range []struct{ flag, addr string }{{"http-addr", c.HTTPAddr}, {"grpc-addr", c.GRPCAddr}, {"peer-addr", c.PeerAddr}} {
		if _, _, err := net.SplitHostPort(a.addr); err != nil {
			return &core.ConfigError{Field: a.flag, Value: a.addr, Err: errors.New("must be host:port (port 0 picks a free one)")}
		}
	}
	for _, a := range []struct{ flag, addr string }{{"advertise-http-addr", c.AdvertiseHTTPAddr}, {"advertise-grpc-addr", c.AdvertiseGRPCAddr}, {"advertise-peer-addr", c.AdvertisePeerAddr}} {
		if err := validateAdvertise(a.flag, a.addr); err != nil {
			return err
		}
	}
	if err := c.validateAnonymous(); err != nil {
		return err
	}
	if err := c.validateDebug(); err != nil {
		return err
	}
	if err := c.validateTLS(); err != nil {
		return err
	}
	if c.DataDir == "" && len(c.EtcdEndpoints) == 0 {
		return &core.ConfigError{Field: "data-dir", Value: c.DataDir, Err: errors.New("is required for the embedded catalog")}
	}
	if c.LeaseTTL < 2*time.Second {
		return &core.ConfigError{Field: "lease-ttl", Value: c.LeaseTTL, Err: errors.New("must be at least 2s (etcd rounds leases to seconds)")}
	}
	if c.Engine.DispatcherWait < c.LeaseTTL {
		return &core.ConfigError{Field: "dispatcher-wait", Value: c.Engine.DispatcherWait, Err: fmt.Errorf("must be at least lease-ttl (%s), or a job whose dispatcher died could fail before its record is gone and replaced", c.LeaseTTL)}
	}
	if c.DrainTimeout < 0 {
		return &core.ConfigError{Field: "drain-timeout", Value: c.DrainTimeout, Err: errors.New("must not be negative")}
	}
	if int64(c.MaxMessageBytes) < c.Engine.Limits.MaxInputBytes+64<<10 {
		return &core.ConfigError{Field: "max-message-bytes", Value: c.MaxMessageBytes, Err: errors.New("must exceed max-input-bytes by at least 64KiB, or a job that passed ingress could not be delivered")}
	}
	if c.ClusterSecret != "" && len(c.ClusterSecret) < peer.MinSecretBytes {
		return &core.ConfigError{Field: "cluster-secret", Value: "(hidden)", Err: fmt.Errorf("must be at least %d bytes (or empty for one the node keeps in its data directory)", peer.MinSecretBytes)}
	}
	if c.ClusterSecret == "" && c.EtcdInitialCluster != "" {
		return &core.ConfigError{Field: "cluster-secret", Value: "", Err: errors.New(
			"is required with --initial-cluster: the members prove it to each other, and their catalog's TLS is derived from it, so every member must be given the same one")}
	}
	if c.PeerHeartbeatInterval <= 0 {
		return &core.ConfigError{Field: "peer-heartbeat-interval", Value: c.PeerHeartbeatInterval, Err: errors.New("must be positive")}
	}
	if c.PeerFailureThreshold < 1 {
		return &core.ConfigError{Field: "peer-failure-threshold", Value: c.PeerFailureThreshold, Err: errors.New("must be at least 1")}
	}
	if c.PeerSuspectAfter < 1 || c.PeerSuspectAfter > c.PeerFailureThreshold {
		return &core.ConfigError{Field: "peer-suspect-after", Value: c.PeerSuspectAfter, Err: errors.New("must be at least 1 and at most --peer-failure-threshold")}
	}
	if c.MaxConcurrentStreams == 0 {
		return &core.ConfigError{Field: "max-concurrent-streams", Value: c.MaxConcurrentStreams, Err: errors.New("must be positive")}
	}
	if err := c.HTTP.Validate(); err != nil {
		return err
	}
	if err := c.outputWindow(); err != nil {
		return err
	}
	if err := c.Engine.Validate(); err != nil {
		return err
	}
	// A slow stream is terminated so that it can resume: when its client
	// comes back, the events after its position must still be in the job's
	// history. A stream bound at or above the history's lets the position
	// fall out first, and the client gets resync (start over) instead.
	if c.HTTP.Stream.MaxLagEvents >= c.Engine.HistoryEvents {
		return &core.ConfigError{Field: "stream-max-events", Value: c.HTTP.Stream.MaxLagEvents, Err: fmt.Errorf("must be below history-events (%d), or a slow stream's position leaves the history before it can resume", c.Engine.HistoryEvents)}
	}
	if c.HTTP.Stream.MaxLagBytes >= c.Engine.HistoryBytes {
		return &core.ConfigError{Field: "stream-max-bytes", Value: c.HTTP.Stream.MaxLagBytes, Err: fmt.Errorf("must be below history-bytes (%d), or a slow stream's position leaves the history before it can resume", c.Engine.HistoryBytes)}
	}
	return c.Workers.Validate()
}

// validateAnonymous refuses to serve anonymous calls beyond this machine:
// a node without keys whose HTTP or gRPC address is not a loopback one
// would let anyone who reaches it submit to any queue, attach a worker to
// any queue and so read other people's inputs.
func (c *Config) validateAnonymous() error {
	if c.Auth.Enabled() && slices.Contains(c.HTTP.CORSOrigins, "*") {
		return &core.ConfigError{Field: "cors-origins", Value: "*", Err: errors.New(
			"* is for a node without keys: with keys, list the origins whose pages may send them")}
	}
	if c.Auth.Enabled() || c.AllowAnonymous {
		return nil
	}
	for _, a := range []struct{ flag, addr string }{{"http-addr", c.HTTPAddr}, {"grpc-addr", c.GRPCAddr}} {
		if !netaddr.IsLoopback(a.addr) {
			return &core.ConfigError{Field: a.flag, Value: a.addr, Err: errors.New(
				"is not a loopback address and the node has no API keys: give it keys (--auth-file, or SWITCHYARD_AUTH_KEYS), or pass --allow-anonymous to accept anonymous calls from the network")}
		}
	}
	return nil
}

// validateDebug keeps the profiling port off the network unless asked:
// a profile shows the node's code paths and, in heap and goroutine dumps,
// fragments of the data it holds, and a CPU profile costs CPU while it
// runs.
func (c *Config) validateDebug() error {
	if c.DebugAddr == "" {
		return nil
	}
	if _, _, err := net.SplitHostPort(c.DebugAddr); err != nil {
		return &core.ConfigError{Field: "debug-addr", Value: c.DebugAddr, Err: errors.New("must be host:port (port 0 picks a free one)")}
	}
	if !c.DebugAllowRemote && !netaddr.IsLoopback(c.DebugAddr) {
		return &core.ConfigError{Field: "debug-addr", Value: c.DebugAddr, Err: errors.New(
			"is not a loopback address: pass --debug-allow-remote to serve profiles to the network (with API keys they need an admin key)")}
	}
	return nil
}

// outputWindow sets an output window left at 0 to half the streams'
// bound, and refuses one above it. A paced reader's stream holds at most
// the window behind the worker, within the bound a stream that is not
// paced is held to; and the window stays below the history's bound (the
// stream's is), so a paced reader that resumes finds its position.
func (c *Config) outputWindow() error {
	sp, e := c.HTTP.Stream, &c.Engine
	if e.OutputWindowEvents == 0 {
		e.OutputWindowEvents = max(sp.MaxLagEvents/2, 1)
	}
	if e.OutputWindowBytes == 0 {
		e.OutputWindowBytes = max(sp.MaxLagBytes/2, 1)
	}
	if e.OutputWindowEvents > sp.MaxLagEvents {
		return &core.ConfigError{Field: "output-window-events", Value: e.OutputWindowEvents, Err: fmt.Errorf("must not exceed stream-max-events (%d): a paced reader's stream holds up to the window", sp.MaxLagEvents)}
	}
	if e.OutputWindowBytes > sp.MaxLagBytes {
		return &core.ConfigError{Field: "output-window-bytes", Value: e.OutputWindowBytes, Err: fmt.Errorf("must not exceed stream-max-bytes (%d): a paced reader's stream holds up to the window", sp.MaxLagBytes)}
	}
	return nil
}
