package catalog

// A cluster of embedding nodes. Up to a handful of nodes can each embed one
// member of a single etcd cluster (Config.InitialCluster), so that the
// catalog survives the loss of a node without running etcd separately:
//
//   - Every member is named after its node and listens on explicit client and
//     peer addresses; the members find each other through InitialCluster.
//   - A node's Catalog keeps using the in-process client of its own member.
//     The member is a full member of the cluster: writes and lease grants are
//     proposed through raft (a follower forwards them to the leader), lease
//     renewals are forwarded to the leader, and reads are linearizable by
//     default (a read index from the leader). Only the watch is served from
//     the member's own copy of the store, which is what a watch is.
//   - Open returns once the member has joined: for a new cluster that is when
//     a quorum of members has started, so members must be started together
//     (each Open waits for the others, bounded by its ctx).
//   - Each node still holds its own lease and fences on it: a node whose
//     member is cut off from the quorum cannot renew and fences, and its
//     records expire for the others; Close revokes the lease (through the
//     leader) before stopping the member, so its records go at once. Closing
//     the leader's member hands leadership to another member first. Close
//     takes about a second more than with a single member: etcd waits that
//     long for its peer connections to close.
//   - With no leader, a write through the in-process client waits for one
//     until RequestTimeout (the client skips the gRPC layer that implements
//     WithRequireLeader); the caller's shorter deadline applies as usual.
//   - While the members elect a new leader after the leader's member fails
//     (1-2 election timeouts: 1.0-1.6 s measured with etcd's default
//     timing), no lease can be renewed. Each renewal attempt has a short
//     deadline of its own and a failed one is retried at once, so a node
//     fences only if no renewal gets through within 3/4 of
//     LeaseTTL-FenceMargin of one falling due: with the default
//     FenceMargin and etcd's default timing, LeaseTTL 6s or more holds
//     (Open warns when it is shorter; electionBudget has the arithmetic).
//   - Voting members should number 3 or 5: a cluster of n survives the loss
//     of (n-1)/2 members, so 2 survive none and an even count adds none over
//     the odd count below it. Further nodes are clients (Config.Endpoints set
//     to the members' client URLs) and keep no catalog state.

import (
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/switchyard/switchyard/core"
)

// The values of Config.ClusterState.
const (
	// ClusterStateNew: the members of InitialCluster bootstrap a new cluster.
	ClusterStateNew = "new"
	// ClusterStateExisting: this member joins a running cluster that has
	// already added it (etcd's MemberAdd).
	ClusterStateExisting = "existing"
)

// clusterMember is one entry of Config.InitialCluster.
type clusterMember struct {
	name   string
	scheme string // http, or https with TLS
	host   string // host:port of its peer URL
}

func (m clusterMember) String() string { return m.name + "=" + m.scheme + "://" + m.host }

// parseInitialCluster parses etcd's "name=url,name=url" list as the catalog
// accepts it: one URL of the form http://host:port (https:// with TLS) per
// member, member names that are node ids, no name or address twice. Blanks
// around entries are ignored.
func parseInitialCluster(s string) ([]clusterMember, error) {
	var ms []clusterMember
	names := map[string]bool{}
	hosts := map[string]string{}
	for i, entry := range strings.Split(s, ",") {
		entry = strings.TrimSpace(entry)
		name, raw, ok := strings.Cut(entry, "=")
		if !ok {
			return nil, fmt.Errorf("entry %d %q is not name=http://host:port (https:// with TLS)", i+1, entry)
		}
		name, raw = strings.TrimSpace(name), strings.TrimSpace(raw)
		if !core.ValidName(name) {
			return nil, fmt.Errorf("entry %d: member name %q is not a node id (1-128 of [A-Za-z0-9._-])", i+1, name)
		}
		u, err := url.Parse(raw)
		if err != nil {
			return nil, fmt.Errorf("entry %d (%s): %v", i+1, name, err)
		}
		if (u.Scheme != "http" && u.Scheme != "https") || u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
			return nil, fmt.Errorf("entry %d (%s): %q is not http://host:port (https:// with TLS)", i+1, name, raw)
		}
		if err := explicitHostPort(u.Host); err != nil {
			return nil, fmt.Errorf("entry %d (%s): %q: %v", i+1, name, raw, err)
		}
		if names[name] {
			return nil, fmt.Errorf("member %q is listed twice (each member has one peer address, its PeerAddr)", name)
		}
		host := normHostPort(u.Host)
		if other, dup := hosts[host]; dup {
			return nil, fmt.Errorf("members %q and %q have the same peer address %s", other, name, u.Host)
		}
		names[name], hosts[host] = true, name
		ms = append(ms, clusterMember{name: name, scheme: u.Scheme, host: u.Host})
	}
	return ms, nil
}

// joinInitialCluster is the list in the form etcd parses.
func joinInitialCluster(ms []clusterMember) string {
	parts := make([]string, len(ms))
	for i, m := range ms {
		parts[i] = m.String()
	}
	return strings.Join(parts, ",")
}

// explicitHostPort checks that hp is host:port with a host and a port that
// is a number from 1 to 65535: an address another machine can be told.
func explicitHostPort(hp string) error {
	host, port, err := net.SplitHostPort(hp)
	if err != nil {
		return fmt.Errorf("not host:port: %v", err)
	}
	if host == "" {
		return fmt.Errorf("no host")
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("port %q is not a number from 1 to 65535", port)
	}
	return nil
}

// normHostPort lower-cases the host, for comparing addresses.
func normHostPort(hp string) string {
	host, port, err := net.SplitHostPort(hp)
	if err != nil {
		return hp
	}
	return net.JoinHostPort(strings.ToLower(host), port)
}

// validateCluster checks the cluster fields of an embedded configuration
// (with defaults applied), reporting through bad.
func (c *Config) validateCluster(bad func(field, format string, args ...any)) {
	switch c.ClusterState {
	case ClusterStateNew, ClusterStateExisting:
	default:
		bad("ClusterState", "%q is neither %q nor %q", c.ClusterState, ClusterStateNew, ClusterStateExisting)
	}
	if strings.TrimSpace(c.ClusterToken) != c.ClusterToken {
		bad("ClusterToken", "%q has leading or trailing blanks", c.ClusterToken)
	}
	if c.InitialCluster == "" {
		if c.ClusterState == ClusterStateExisting {
			bad("ClusterState", "%q needs InitialCluster: a member joins a cluster through the peers listed there", c.ClusterState)
		}
		return
	}
	// The members are told each other's addresses: an ephemeral port, the
	// default, cannot be told in advance.
	if _, _, err := net.SplitHostPort(c.ClientAddr); err == nil {
		if err := explicitHostPort(c.ClientAddr); err != nil {
			bad("ClientAddr", "%q: with InitialCluster the member's client address must be explicit, for the nodes that use the cluster through Endpoints: %v", c.ClientAddr, err)
		}
	}
	// PeerAddr on every interface (0.0.0.0:2380) is a listener only: the
	// member advertises its InitialCluster entry (peerURL), which must then
	// name the same port and a host its peers can reach.
	peerOK, peerEverywhere := false, false
	if _, _, err := net.SplitHostPort(c.PeerAddr); err == nil {
		host, _, _ := net.SplitHostPort(c.PeerAddr)
		if err := explicitHostPort(c.PeerAddr); err != nil {
			bad("PeerAddr", "%q: with InitialCluster the peer address must be explicit, since peers must know each other's addresses: %v", c.PeerAddr, err)
		} else {
			ip := net.ParseIP(host)
			peerOK, peerEverywhere = true, ip != nil && ip.IsUnspecified()
		}
	}
	ms, err := parseInitialCluster(c.InitialCluster)
	if err != nil {
		bad("InitialCluster", "%v", err)
		return
	}
	for _, m := range ms {
		if m.scheme != c.scheme() {
			bad("InitialCluster", "member %s: its URL must be %s:// (TLS is set: https; not set: http)", m.name, c.scheme())
		}
	}
	for _, m := range ms {
		if m.name != c.Name {
			continue
		}
		if peerEverywhere {
			host, port, _ := net.SplitHostPort(m.host)
			_, want, _ := net.SplitHostPort(c.PeerAddr)
			if ip := net.ParseIP(host); port != want || ip != nil && ip.IsUnspecified() {
				bad("InitialCluster", "this node's entry %s is what it advertises with PeerAddr %q on every interface: it must name port %s and a host its peers can reach", m, c.PeerAddr, want)
			}
			return
		}
		if peerOK && normHostPort(m.host) != normHostPort(c.PeerAddr) {
			bad("InitialCluster", "this node's entry %s does not match PeerAddr %q: it must be %s=%s://%s", m, c.PeerAddr, c.Name, c.scheme(), c.PeerAddr)
		}
		return
	}
	bad("InitialCluster", "does not list this node (%s=%s://%s): every member must be in it, under its Name", c.Name, c.scheme(), c.PeerAddr)
}

// logCluster logs, at Open, which cluster the member is part of, and warns
// about a membership that tolerates no more failures than a smaller one and
// about a lease too short to outlast the election of a new leader.
func logCluster(log *slog.Logger, cfg Config, ms []clusterMember) {
	n := len(ms)
	log.Info("catalog: embedded etcd member of a cluster", "members", n, "initial_cluster", joinInitialCluster(ms),
		"cluster_state", clusterState(cfg), "client_addr", cfg.ClientAddr, "peer_addr", cfg.PeerAddr)
	switch {
	case n == 2:
		log.Warn("catalog: a 2-member etcd cluster survives no failure: losing either member stops every catalog write; use 3 or 5 voting members and make further nodes clients (Endpoints)",
			"members", n)
	case n > 2 && n%2 == 0:
		log.Warn(fmt.Sprintf("catalog: a %d-member etcd cluster survives no more failures than %d members do, with a larger quorum; use 3 or 5 voting members and make further nodes clients (Endpoints)", n, n-1),
			"members", n, "tolerates", (n-1)/2)
	case n > 7:
		log.Warn("catalog: more than 7 voting etcd members slow every write; use 3 or 5 and make further nodes clients (Endpoints)", "members", n)
	}
	if have, need := electionBudget(cfg); have < need {
		log.Warn("catalog: LeaseTTL is short for a cluster: when the etcd leader fails, leases are not renewed until a new leader is elected (up to 2 election timeouts and a heartbeat), and this node fences if that, plus one renewal attempt, takes longer than 3/4 of LeaseTTL-FenceMargin; raise LeaseTTL",
			"lease_ttl", cfg.LeaseTTL, "fence_margin", cfg.FenceMargin, "retry_budget", have, "election_outage_and_attempt", need,
			"election_timeout", electionTimeout(cfg), "min_lease_ttl_with_default_margin", minClusterLeaseTTL(cfg))
	}
}

// clusterState is the state the member starts in, as its log says it:
// etcd reads InitialCluster and ClusterState only to bootstrap, and a
// member whose data directory holds a write-ahead log restarts on it
// whatever they say.
func clusterState(cfg Config) string {
	if es, err := os.ReadDir(filepath.Join(cfg.Dir, "etcd", "member", "wal")); err == nil && len(es) > 0 {
		return "existing (restarted on existing data)"
	}
	return cfg.ClusterState
}

// The embedded members' raft timing: etcd's defaults, a heartbeat every
// 100ms and an election timeout of 1s, kept because they hold on a loaded
// machine (a member that misses 10 heartbeats calls an election; shorter
// timeouts elect spuriously when a process is starved of CPU for a few
// hundred milliseconds, and every election is an outage of the catalog).
// The lease arithmetic that goes with them is in docs/cluster.md, "The
// catalog's own leader election". FastElection (tests) divides both by 10.
const (
	etcdHeartbeat       = 100 * time.Millisecond
	etcdElectionTimeout = time.Second
)

func electionTimeout(cfg Config) time.Duration {
	if cfg.FastElection {
		return etcdElectionTimeout / 10
	}
	return etcdElectionTimeout
}

// electionBudget compares, for cfg, the time a node has to renew its lease
// once the catalog stops answering (have: the worst case, when it stops
// just as a renewal falls due, is TTL-FenceMargin less one renewal
// interval) with the time an election of a new etcd leader can take plus
// one renewal attempt that hung on the old leader (need). A follower calls
// an election a randomized 1-2 election timeouts after the leader's last
// heartbeat, and learns the winner with its first heartbeat.
func electionBudget(cfg Config) (have, need time.Duration) {
	e := electionTimeout(cfg)
	have = cfg.LeaseTTL - cfg.FenceMargin - renewInterval(cfg.LeaseTTL, cfg.FenceMargin)
	need = 2*e + e/10 + renewAttemptTimeout(cfg.LeaseTTL, cfg.FenceMargin, cfg.RequestTimeout)
	return have, need
}

// minClusterLeaseTTL is the smallest whole-second LeaseTTL, with the
// default margin, whose electionBudget holds.
func minClusterLeaseTTL(cfg Config) time.Duration {
	for ttl := time.Second; ; ttl += time.Second {
		c := cfg
		c.LeaseTTL, c.FenceMargin = ttl, ttl/3
		if have, need := electionBudget(c); have >= need {
			return ttl
		}
	}
}

// quorum is the number of members a cluster of n needs to work.
func quorum(n int) int { return n/2 + 1 }
