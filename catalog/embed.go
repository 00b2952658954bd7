package catalog

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// startEmbedded starts the embedded etcd member in cfg.Dir/etcd, a cluster of
// its own or one of cfg.InitialCluster, and waits, bounded by ctx, until it
// serves: for a member of a cluster, until it has joined, which for a new
// cluster takes a quorum of members started. (etcd's own bootstrap checks
// before that, asking the other members whether the cluster already exists,
// are bounded by etcd: about a second for a new cluster, ten seconds per
// peer for an existing one.) On any failure the member is closed.
func startEmbedded(ctx context.Context, cfg Config) (*embed.Etcd, error) {
	ec := embed.NewConfig()
	ec.Name = cfg.Name
	ec.Dir = filepath.Join(cfg.Dir, "etcd")
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	ec.LogLevel = "error"
	ec.UnsafeNoFsync = cfg.UnsafeNoFsync
	ec.TickMs, ec.ElectionMs = uint(etcdHeartbeat/time.Millisecond), uint(etcdElectionTimeout/time.Millisecond)
	if cfg.FastElection {
		ec.TickMs, ec.ElectionMs = ec.TickMs/10, ec.ElectionMs/10
	}
	curl := url.URL{Scheme: cfg.scheme(), Host: cfg.ClientAddr}
	purl := url.URL{Scheme: cfg.scheme(), Host: cfg.PeerAddr}
	var ms []clusterMember
	if cfg.InitialCluster != "" {
		var err error
		if ms, err = parseInitialCluster(cfg.InitialCluster); err != nil { // Validate passed it
			return nil, fmt.Errorf("start embedded etcd: InitialCluster: %w", err)
		}
	}
	var plan joinPlan
	if cfg.InitialCluster != "" {
		var err error
		if plan, err = prepareJoin(ctx, cfg, ms); err != nil {
			return nil, fmt.Errorf("start embedded etcd: %w", err)
		}
	}
	// Mutual TLS on both ports, always: whoever reaches them without a
	// certificate of the cluster's CA (its own, or the one derived from
	// the secret: derive.go) can neither read nor write the catalog, nor
	// talk raft to the member. The member's certificate serves both ways
	// between members.
	files, derived := cfg.TLS, false
	if files == nil {
		var err error
		if files, err = writeDerivedTLS(cfg.Dir, cfg.Secret, cfg.Name, memberHosts(cfg, ms)); err != nil {
			return nil, fmt.Errorf("start embedded etcd: %w", err)
		}
		derived = true
	}
	info := transport.TLSInfo{CertFile: files.Cert, KeyFile: files.Key, TrustedCAFile: files.CA, ClientCertAuth: true, SkipClientSANVerify: derived}
	ec.ClientTLSInfo, ec.PeerTLSInfo = info, info
	// etcd's JSON gateway is a second way in to the same API over HTTP,
	// which the catalog never uses; under TLS it dials the configured
	// listen address (port 0 by default) rather than the bound one.
	ec.EnableGRPCGateway = false
	ec.ListenClientUrls = []url.URL{curl}
	ec.AdvertiseClientUrls = []url.URL{clientURL(cfg, ms)}
	ec.ListenPeerUrls = []url.URL{purl}
	ec.AdvertisePeerUrls = []url.URL{peerURL(cfg, ms)}
	members := 1
	if cfg.InitialCluster != "" {
		members = len(ms)
		ec.InitialCluster = joinInitialCluster(ms)
		ec.ClusterState = cfg.ClusterState
		logged, lms := cfg, ms
		if plan.initialCluster != "" {
			// The running cluster's members, as prepareJoin found them.
			ec.InitialCluster, ec.ClusterState = plan.initialCluster, plan.state
			logged.ClusterState = plan.state
			if pms, err := parseInitialCluster(plan.initialCluster); err == nil {
				lms = pms
			}
		}
		logCluster(cfg.Logger, logged, lms)
	} else {
		ec.InitialCluster = ec.InitialClusterFromName(ec.Name)
	}
	ec.InitialClusterToken = cfg.ClusterToken
	// Every put of a leased record adds a revision; without compaction the
	// member's database grows for as long as the node runs. An hour of
	// history is far more than a watcher ever needs to catch up (one that
	// falls further behind reloads, see watchLoop).
	ec.AutoCompactionMode = embed.CompactorModePeriodic
	ec.AutoCompactionRetention = "1h"

	e, err := embed.StartEtcd(ec)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd in %s: %w", ec.Dir, err)
	}
	select {
	case <-e.Server.ReadyNotify():
		// A learner (just added, or added by a start that did not live
		// to promote it) votes once it has caught up.
		if e.Server.IsLearner() {
			if err := promote(ctx, cfg, e, uint64(e.Server.MemberID())); err != nil {
				e.Close()
				return nil, fmt.Errorf("start embedded etcd in %s: %w", ec.Dir, err)
			}
		}
		if err := updateOwnEntry(ctx, cfg, e, boundURL(ec.AdvertisePeerUrls[0], e.Peers[0].Addr())); err != nil {
			e.Close()
			return nil, fmt.Errorf("start embedded etcd in %s: %w", ec.Dir, err)
		}
		return e, nil
	case <-e.Server.StopNotify():
		e.Close()
		return nil, fmt.Errorf("start embedded etcd in %s: server stopped before it was ready", ec.Dir)
	case err := <-e.Err():
		closeUnready(e)
		return nil, fmt.Errorf("start embedded etcd in %s: %w", ec.Dir, err)
	case <-ctx.Done():
		closeUnready(e)
		if members > 1 {
			return nil, fmt.Errorf("start embedded etcd in %s: member %s has not joined its cluster of %d (a new cluster needs %d members started, see InitialCluster): %w",
				ec.Dir, cfg.Name, members, quorum(members), ctx.Err())
		}
		return nil, fmt.Errorf("start embedded etcd in %s: %w", ec.Dir, ctx.Err())
	}
}

// peerURL is the peer URL the member advertises: PeerAddr, or with
// PeerAddr on every interface (which validateCluster allows only with
// InitialCluster) this member's InitialCluster entry, which names the
// same port on a host its peers reach.
func peerURL(cfg Config, ms []clusterMember) url.URL { return advertisedURL(cfg, ms, cfg.PeerAddr) }

// clientURL is the client URL the member advertises: ClientAddr, or with
// ClientAddr on every interface the host of this member's InitialCluster
// entry with ClientAddr's port. The other members reach it there for
// member changes made before a node's own member starts (join.go).
func clientURL(cfg Config, ms []clusterMember) url.URL { return advertisedURL(cfg, ms, cfg.ClientAddr) }

// advertisedURL is the URL the member advertises for its listen address
// addr: addr, or with addr on every interface (0.0.0.0, [::]) the host of
// this member's InitialCluster entry with addr's port.
func advertisedURL(cfg Config, ms []clusterMember, addr string) url.URL {
	host, port, _ := net.SplitHostPort(addr)
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		for _, m := range ms {
			if m.name == cfg.Name {
				if h, _, err := net.SplitHostPort(m.host); err == nil {
					return url.URL{Scheme: cfg.scheme(), Host: net.JoinHostPort(h, port)}
				}
			}
		}
	}
	return url.URL{Scheme: cfg.scheme(), Host: addr}
}

// boundURL is u, advertised, with the port of bound when u's port is 0 (a
// port chosen at start: the one the listener got).
func boundURL(u url.URL, bound net.Addr) url.URL {
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil || port != "0" {
		return u
	}
	if _, bp, err := net.SplitHostPort(bound.String()); err == nil {
		u.Host = net.JoinHostPort(host, bp)
	}
	return u
}

// closeUnready closes a member that never became ready. embed.Etcd.Close
// alone hangs on one: it waits for the client servers, which only give up
// when the server stops, and it stops the server only after them. So stop
// the server first (there is no leadership to hand over: it never served).
func closeUnready(e *embed.Etcd) {
	e.Server.HardStop()
	e.Close()
}
