package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/switchyard/switchyard/core/resume"

	"github.com/switchyard/switchyard"
)

func runNode(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("node", flag.ContinueOnError)
	cfg, finish := nodeFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := finish(); err != nil {
		return err
	}
	n, err := switchyard.Open(ctx, *cfg)
	if err != nil {
		return err
	}
	stop := reloadOnHangup(n)
	<-ctx.Done()
	stop()
	return closeNode(n, cfg)
}

// reloadOnHangup reloads the node's API keys on every SIGHUP until stop is
// called (a bad file keeps the keys in use: Node.ReloadAuth logs why).
func reloadOnHangup(n *switchyard.Node) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-hup:
				_ = n.ReloadAuth()
			case <-done:
				return
			}
		}
	})
	return func() {
		signal.Stop(hup)
		close(done)
		wg.Wait()
	}
}

// closeNode drains the node after a signal, bounded by its drain timeout.
func closeNode(n *switchyard.Node, cfg *switchyard.Config) error {
	cfg.Logger.Info("shutting down: draining", "timeout", cfg.DrainTimeout)
	cctx, cancel := context.WithTimeout(context.Background(), cfg.DrainTimeout+10*time.Second)
	defer cancel()
	return n.Close(cctx)
}

// nodeFlags registers the node's flags on fs; finish applies what flags
// cannot express directly, after parsing.
func nodeFlags(fs *flag.FlagSet) (*switchyard.Config, func() error) {
	cfg := switchyard.DefaultConfig()
	fs.StringVar(&cfg.Name, "name", cfg.Name, "node id, unique in the cluster")
	fs.StringVar(&cfg.HTTPAddr, "http-addr", cfg.HTTPAddr, "HTTP listen address (port 0 picks one)")
	fs.IntVar(&cfg.HTTP.WriteBuffer, "http-write-buffer", cfg.HTTP.WriteBuffer, "kernel send buffer (SO_SNDBUF) of each HTTP connection, in bytes; small, so a slow SSE client still gets its terminated event; 0: kernel autotuning")
	fs.DurationVar(&cfg.HTTP.HeaderTimeout, "http-header-timeout", cfg.HTTP.HeaderTimeout, "time a client gets to send a request's headers; a slower one is disconnected")
	fs.IntVar(&cfg.HTTP.MaxHeaderBytes, "http-max-header-bytes", cfg.HTTP.MaxHeaderBytes, "largest request header block accepted, in bytes (Go's server allows 4 KiB over it); larger gets 431")
	fs.DurationVar(&cfg.HTTP.BodyTimeout, "http-body-timeout", cfg.HTTP.BodyTimeout, "time a client gets to send a request's whole body after its headers; slower gets 408 request_timeout and changes nothing")
	fs.StringVar(&cfg.GRPCAddr, "grpc-addr", cfg.GRPCAddr, "gRPC listen address for workers (port 0 picks one)")
	fs.StringVar(&cfg.PeerAddr, "peer-addr", cfg.PeerAddr, "node-to-node gRPC listen address (port 0 picks one)")
	fs.StringVar(&cfg.AdvertiseHTTPAddr, "advertise-http-addr", "", "host:port others reach the HTTP API at, as the cluster views and the page show it (default: --http-addr as bound; bound to every interface, this host's address with the bound port: docs/cluster.md, Advertised addresses)")
	fs.StringVar(&cfg.AdvertiseGRPCAddr, "advertise-grpc-addr", "", "host:port others reach the gRPC API at (default as for --advertise-http-addr)")
	fs.StringVar(&cfg.AdvertisePeerAddr, "advertise-peer-addr", "", "host:port other nodes dial this node's peer port at (a host name is fine; default as for --advertise-http-addr)")
	fs.StringVar(&cfg.Auth.File, "auth-file", "", "API keys (YAML or JSON: subject, key or sha256, roles, queues, limits); re-read on SIGHUP; see docs/security.md")
	fs.StringVar(&cfg.Auth.Inline, "auth-keys", "", "API keys as a document in the --auth-file format; set it as SWITCHYARD_AUTH_KEYS rather than on the command line, where other users can read it")
	fs.BoolVar(&cfg.AllowAnonymous, "allow-anonymous", false, "without API keys, accept anonymous calls on a non-loopback --http-addr or --grpc-addr (refused otherwise)")
	var corsOrigins stringList
	fs.Var(&corsOrigins, "cors-origins", "origins whose web pages may call the API (comma-separated, exact: https://app.example:8443), or * on a node without keys; none by default")
	fs.StringVar(&cfg.TLSCert, "tls-cert", "", "PEM certificate (chain) of the HTTP and gRPC ports: serve them over TLS (HTTP/2 included); reloaded when the file changes")
	fs.StringVar(&cfg.TLSKey, "tls-key", "", "PEM private key of --tls-cert")
	fs.StringVar(&cfg.TLSCA, "tls-ca", "", "PEM CA of the other nodes' --tls-cert, if neither the system nor --peer-tls-ca trusts it: a node relays a retried keyed submission to the node its job lives on")
	fs.StringVar(&cfg.PeerTLSCert, "peer-tls-cert", "", "PEM certificate of this node from the cluster CA: mutual TLS on the peer port (beside --cluster-secret) and on the embedded etcd member's ports; needs --peer-tls-key and --peer-tls-ca")
	fs.StringVar(&cfg.PeerTLSKey, "peer-tls-key", "", "PEM private key of --peer-tls-cert")
	fs.StringVar(&cfg.PeerTLSCA, "peer-tls-ca", "", "PEM certificate of the cluster CA: the only issuer whose node certificates the peer port and the embedded etcd member accept")
	fs.StringVar(&cfg.EtcdTLSCA, "etcd-tls-ca", "", "external etcd (--etcd-endpoints https://...): PEM CA of its servers (default: --peer-tls-ca)")
	fs.StringVar(&cfg.EtcdTLSCert, "etcd-tls-cert", "", "external etcd: PEM client certificate (default: --peer-tls-cert)")
	fs.StringVar(&cfg.EtcdTLSKey, "etcd-tls-key", "", "external etcd: PEM private key of --etcd-tls-cert")
	fs.StringVar(&cfg.EtcdUsername, "etcd-username", "", "external etcd with authentication: user name (a role with readwrite on /nodes/, /q/ and /idem/: docs/cluster.md, An external etcd)")
	fs.StringVar(&cfg.EtcdPassword, "etcd-password", "", "external etcd with authentication: password; set it as SWITCHYARD_ETCD_PASSWORD, or use --etcd-password-file, rather than on the command line")
	etcdPasswordFile := fs.String("etcd-password-file", "", "file holding --etcd-password (a mounted secret); one of the two")
	fs.StringVar(&cfg.DebugAddr, "debug-addr", "", "serve net/http/pprof (/debug/pprof/) on this address, e.g. 127.0.0.1:6060 (off by default; loopback only unless --debug-allow-remote; with API keys, an admin key)")
	fs.BoolVar(&cfg.DebugAllowRemote, "debug-allow-remote", false, "let --debug-addr listen on a non-loopback address")
	fs.BoolVar(&cfg.HTTP.MetricsOpen, "metrics-open", false, "serve /metrics to anyone (by default it needs an admin key)")
	fs.StringVar(&cfg.ClusterSecret, "cluster-secret", "", "shared secret (at least 16 bytes) that nodes of one cluster prove to each other on every peer connection, and from which the catalog's TLS is derived without --peer-tls-*; every node of a cluster must have the same one; required with --initial-cluster; default: the one the node keeps in <data-dir>/cluster-secret, made at its first start")
	clusterSecretFile := fs.String("cluster-secret-file", "", "file holding --cluster-secret (a mounted secret, or another node's <data-dir>/cluster-secret); one of the two")
	fs.DurationVar(&cfg.PeerHeartbeatInterval, "peer-heartbeat-interval", cfg.PeerHeartbeatInterval, "how often this node pings the peers it works with (docs/cluster.md, Peer states)")
	fs.DurationVar(&cfg.PeerStreamIdle, "peer-stream-idle", cfg.PeerStreamIdle, "close a delivery stream to a peer (one per node and queue) idle this long; at least 3x --dispatch-timeout")
	fs.BoolVar(&cfg.PeerForceUnary, "peer-force-unary", cfg.PeerForceUnary, "send peer messages by unary calls only, never on delivery streams")
	fs.IntVar(&cfg.PeerFailureThreshold, "peer-failure-threshold", cfg.PeerFailureThreshold, "pings in a row a node may miss before it is spare in this node's view")
	fs.IntVar(&cfg.PeerSuspectAfter, "peer-suspect-after", cfg.PeerSuspectAfter, "pings in a row a node may miss before it is suspected in this node's view: offered nothing new, its queues taken over (at most --peer-failure-threshold)")
	fs.StringVar(&cfg.DataDir, "data-dir", "", "data directory (default data/<name>)")
	fs.StringVar(&cfg.Zone, "zone", "", "zone label of this node")
	fs.StringVar(&cfg.EtcdClientAddr, "etcd-client-addr", cfg.EtcdClientAddr, "embedded etcd client listen address")
	fs.StringVar(&cfg.EtcdPeerAddr, "etcd-peer-addr", cfg.EtcdPeerAddr, "embedded etcd peer listen address")
	var endpoints stringList
	fs.Var(&endpoints, "etcd-endpoints", "external etcd endpoints (comma-separated); embeds nothing when set")
	fs.StringVar(&cfg.EtcdInitialCluster, "initial-cluster", "", "embedded etcd cluster of several nodes: name=http://host:peerport,... (needs explicit --etcd-client-addr and --etcd-peer-addr)")
	fs.StringVar(&cfg.EtcdClusterState, "initial-cluster-state", "", "new (bootstrap together) or existing (join a running cluster)")
	fs.DurationVar(&cfg.LeaseTTL, "lease-ttl", cfg.LeaseTTL, "catalog lease TTL: how long a crashed node's registrations outlive it; at least 6s with --initial-cluster, or a leader election can fence healthy nodes")
	fs.DurationVar(&cfg.DrainTimeout, "drain-timeout", cfg.DrainTimeout, "on SIGTERM, how long the jobs this node holds (its clients' and those its workers run for any node) may finish before it exits")
	fs.IntVar(&cfg.MaxMessageBytes, "max-message-bytes", cfg.MaxMessageBytes, "gRPC max message size, sent and received")

	l := &cfg.Engine.Limits
	fs.Int64Var(&l.MaxInputBytes, "max-input-bytes", l.MaxInputBytes, "ceiling on a job's input size")
	fs.IntVar(&l.MaxQueueDepth, "max-queue-depth", l.MaxQueueDepth, "ceiling on jobs waiting in one queue")
	fs.Int64Var(&l.MaxQueueBytes, "max-queue-bytes", l.MaxQueueBytes, "ceiling on input bytes waiting in one queue")
	fs.DurationVar(&l.MaxTTL, "max-ttl", l.MaxTTL, "ceiling on a job's TTL")
	fs.DurationVar(&l.DefaultTTL, "default-ttl", l.DefaultTTL, "TTL of a job whose envelope names none")
	fs.Int64Var(&l.MaxOutputBytes, "max-output-bytes", l.MaxOutputBytes, "ceiling on a job's total output")
	fs.DurationVar(&l.MaxGrace, "max-grace", l.MaxGrace, "ceiling on an envelope's disconnect grace window")
	fs.IntVar(&l.MaxRestarts, "max-restarts", l.MaxRestarts, "ceiling on how many times a job with on_worker_lost: restart runs again after losing its worker (an envelope's max_restarts may only lower it; 0: never)")
	fs.DurationVar(&cfg.Engine.DispatchTimeoutCeiling, "dispatch-timeout", cfg.Engine.DispatchTimeoutCeiling, "ceiling on how long a worker gets to accept a job")
	fs.DurationVar(&cfg.Engine.PinStable, "pin-stable", cfg.Engine.PinStable, "how long a queue's consumers must have lived on one other node before a dispatcher hosting none hands the queue to that node")
	fs.DurationVar(&cfg.Engine.DispatcherWait, "dispatcher-wait", cfg.Engine.DispatcherWait, "how long, at most, an accepted job waits for its queue's dispatcher (one that does not answer, or none elected yet) before it fails dispatcher_unavailable; keep it above --lease-ttl, so a dead dispatcher is replaced within it")
	fs.Float64Var(&cfg.Engine.Scheduling.AffinityLoadFactor, "affinity-load-factor", cfg.Engine.Scheduling.AffinityLoadFactor, "bound of affinity routing: a job with an affinity_key skips its key's worker when that would hold more than its slots plus this factor times the queue's average per slot (at least 1; every node the same; docs/scheduling.md)")
	fs.DurationVar(&cfg.Engine.Scheduling.AffinityWait, "affinity-wait", cfg.Engine.Scheduling.AffinityWait, "how long a job with an affinity_key waits for a free slot on its key's worker while another capable worker has one (0: never; docs/scheduling.md)")
	fs.DurationVar(&cfg.Engine.Scheduling.PriorityAging, "priority-aging", cfg.Engine.Scheduling.PriorityAging, "a waiting job gains one level of priority over later jobs of its subject per this much waiting, so nothing starves (docs/scheduling.md)")
	fs.DurationVar(&cfg.Engine.QueueIdle, "queue-idle", cfg.Engine.QueueIdle, "remove a queue with no job and no worker after this long")
	fs.DurationVar(&cfg.Engine.Retention, "retention", cfg.Engine.Retention, "how long an ended job stays readable and resumable, at most (see --retain-jobs, --retain-bytes)")
	fs.IntVar(&cfg.Engine.RetainJobs, "retain-jobs", cfg.Engine.RetainJobs, "most ended jobs the node keeps for late readers; past it the oldest ended job is evicted")
	fs.Int64Var(&cfg.Engine.RetainBytes, "retain-bytes", cfg.Engine.RetainBytes, "most bytes the ended jobs kept for late readers may hold; past it the oldest ended job is evicted; at least --history-bytes")
	fs.IntVar(&cfg.Engine.HistoryEvents, "history-events", cfg.Engine.HistoryEvents, "events of each job the ingress keeps for resume (older ones leave: a resume from before them gets resync); above --stream-max-events")
	fs.Int64Var(&cfg.Engine.HistoryBytes, "history-bytes", cfg.Engine.HistoryBytes, "bytes of events each job keeps for resume; above --stream-max-bytes")
	sp := &cfg.HTTP.Stream
	fs.IntVar(&sp.MaxLagEvents, "stream-max-events", sp.MaxLagEvents, "a client stream further behind than this many events is terminated (it resumes)")
	fs.Int64Var(&sp.MaxLagBytes, "stream-max-bytes", sp.MaxLagBytes, "a client stream further behind than this many bytes is terminated (it resumes)")
	fs.DurationVar(&sp.Setup, "stream-setup-timeout", sp.Setup, "a client stream's first write must complete within this")
	fs.DurationVar(&sp.Idle, "stream-idle-timeout", sp.Idle, "end a client stream that carried no event for this long (it resumes)")
	fs.DurationVar(&sp.MaxDuration, "stream-max-duration", sp.MaxDuration, "end any client stream after this long (it resumes)")
	fs.DurationVar(&sp.Heartbeat, "stream-heartbeat", sp.Heartbeat, "send an SSE heartbeat comment after this much silence")
	fs.DurationVar(&sp.WriteTimeout, "stream-write-timeout", sp.WriteTimeout, "end a client stream whose write blocks this long")
	fs.DurationVar(&sp.Stall, "stream-stall-timeout", sp.Stall, "terminate a job's owner stream (its POST's, or a resume of it) that made no progress this long with something to send (it resumes); below --stream-write-timeout; 0: half of it")
	fs.IntVar(&cfg.Engine.OutputWindowEvents, "output-window-events", cfg.Engine.OutputWindowEvents, "how many outputs a job's worker may run ahead of what the job's reader took before it waits (its output credit); at most --stream-max-events; 0: half of it")
	fs.Int64Var(&cfg.Engine.OutputWindowBytes, "output-window-bytes", cfg.Engine.OutputWindowBytes, "how many output bytes a job's worker may run ahead of what the job's reader took before it waits; at most --stream-max-bytes; 0: half of it")
	fs.StringVar(&cfg.HTTP.OpenAIQueue, "openai-queue", cfg.HTTP.OpenAIQueue, "queue the OpenAI-compatible front door (/openai/v1) posts chat completions to; its workers' model=<name> capabilities are the models it serves")
	fs.DurationVar(&cfg.HTTP.TokenTTL, "resume-token-ttl", cfg.HTTP.TokenTTL, "how long a resume token stays valid")
	var resumeKeys stringList
	fs.Var(&resumeKeys, "resume-key", "resume token key kid:base64secret (repeatable); the first signs unless --resume-signing-key says otherwise; default: a random key per start")
	signing := fs.String("resume-signing-key", "", "key id that signs resume tokens (the others only verify)")
	fs.DurationVar(&cfg.Workers.HeartbeatInterval, "heartbeat-interval", cfg.Workers.HeartbeatInterval, "worker session heartbeat interval")
	fs.DurationVar(&cfg.Workers.IdleTimeout, "worker-idle-timeout", cfg.Workers.IdleTimeout, "end a worker session silent this long")
	fs.DurationVar(&cfg.Workers.SetupTimeout, "worker-setup-timeout", cfg.Workers.SetupTimeout, "a connecting worker must say hello within this")
	fs.StringVar(&cfg.Tracing.Endpoint, "otlp-endpoint", "", "export spans by OTLP to this collector URL (http://host:4318 for http/protobuf, http://host:4317 with OTEL_EXPORTER_OTLP_PROTOCOL=grpc); off by default, or set by the standard OTEL_EXPORTER_OTLP_* variables; sampling by OTEL_TRACES_SAMPLER (docs/tracing.md)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	logFormat := fs.String("log-format", "text", "text or json")
	finish := func() error {
		cfg.EtcdEndpoints = endpoints
		cfg.HTTP.CORSOrigins = corsOrigins
		if len(resumeKeys) > 0 {
			var keys []resume.Key
			for _, s := range resumeKeys {
				k, err := resume.ParseKey(s)
				if err != nil {
					return fmt.Errorf("--resume-key: %w", err)
				}
				keys = append(keys, k)
			}
			sign := *signing
			if sign == "" {
				sign = keys[0].ID
			}
			ring, err := resume.NewKeyring(sign, keys...)
			if err != nil {
				return fmt.Errorf("--resume-key: %w", err)
			}
			cfg.HTTP.Keyring = ring
		} else if *signing != "" {
			return errors.New("--resume-signing-key needs --resume-key")
		}
		if cfg.DataDir == "" {
			cfg.DataDir = "data/" + cfg.Name
		}
		if err := fromFile(&cfg.ClusterSecret, "cluster-secret", *clusterSecretFile); err != nil {
			return err
		}
		if err := fromFile(&cfg.EtcdPassword, "etcd-password", *etcdPasswordFile); err != nil {
			return err
		}
		log, err := newLogger(*logLevel, *logFormat)
		if err != nil {
			return err
		}
		cfg.Logger = log
		return nil
	}
	return &cfg, finish
}

// fromFile sets *value, the value of flag, to the contents of path (less
// surrounding white space) when path is set: a secret that stays out of
// the command line and the environment. Giving both is refused.
func fromFile(value *string, flag, path string) error {
	if path == "" {
		return nil
	}
	if *value != "" {
		return fmt.Errorf("--%s and --%s-file: give one of the two", flag, flag)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--%s-file: %w", flag, err)
	}
	*value = strings.TrimSpace(string(b))
	if *value == "" {
		return fmt.Errorf("--%s-file %s is empty", flag, path)
	}
	return nil
}
