package catalog

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"

	"github.com/switchyard/switchyard/core"
)

// Defaults applied by Open to zero-valued Config fields.
const (
	DefaultAddr        = "127.0.0.1:0"
	DefaultLeaseTTL    = 5 * time.Second
	DefaultDialTimeout = 5 * time.Second
	// ExternalKeepAliveTime and ExternalKeepAliveTimeout: a connection
	// to an external etcd endpoint is pinged after this long without
	// traffic and dropped when a ping is not answered within the timeout.
	// 10s is gRPC's floor for a client (a shorter time is raised to it),
	// above etcd's default enforcement minimum of 5s.
	ExternalKeepAliveTime    = 10 * time.Second
	ExternalKeepAliveTimeout = 3 * time.Second
	// ExternalConnectTimeout bounds one attempt to (re)connect to an
	// external etcd endpoint.
	ExternalConnectTimeout = 2 * time.Second
	DefaultRequestTimeout  = 3 * time.Second
	DefaultClusterState    = ClusterStateNew
	DefaultClusterToken    = "switchyard"
)

// Config configures a Catalog. The zero value of every field but Name (and
// Dir, when embedding) means its default.
type Config struct {
	// Name is this node's id: the key of its node record and the name of its
	// embedded etcd member. 1-128 of [A-Za-z0-9._-].
	Name string
	// Dir is the node's data directory; the embedded member lives in
	// Dir/etcd. Required unless Endpoints is set.
	Dir string
	// ClientAddr and PeerAddr are the host:port the embedded member listens
	// on for clients and for other members. Default DefaultAddr: port 0
	// binds an ephemeral port, which works for a single member; read the
	// bound ports back with Catalog.ClientAddr and Catalog.PeerAddr.
	// With InitialCluster both must be explicit (port 0 is refused): the
	// members must know each other's addresses, and other nodes reach the
	// cluster through the members' client addresses.
	ClientAddr string
	PeerAddr   string
	// InitialCluster, if set, makes the embedded member one of a cluster of
	// nodes that each embed a member (see cluster.go): etcd's
	// --initial-cluster list, "n1=http://10.0.0.1:2380,n2=http://...", one
	// entry per member, named by the member's node Name and giving its
	// PeerAddr. This node's entry must be Name=http://PeerAddr. Keep the
	// voting members to 3 or 5: a cluster of n survives (n-1)/2 failures, so
	// 2 survive none (Open warns) and an even count adds no tolerance. Further
	// nodes join as clients, with Endpoints set to the members' client URLs.
	// Empty (the default): a single member of its own. While the cluster
	// elects a new leader, after the leader's member fails (1-2 s with etcd's
	// timing), no lease is renewed: 3/4 of LeaseTTL-FenceMargin must be
	// longer than that and one renewal attempt, or every node fences (Open
	// warns). With the default FenceMargin that means a LeaseTTL of at
	// least 6s.
	InitialCluster string
	// ClusterState is etcd's --initial-cluster-state: ClusterStateNew (the
	// default) when the members in InitialCluster bootstrap a new cluster
	// together, ClusterStateExisting for a member added to a running cluster
	// (after etcd's MemberAdd; InitialCluster then lists the current members
	// and this one). Both only matter on the first start: a member whose
	// data directory already holds the cluster restarts from it either way.
	ClusterState string
	// ClusterToken is etcd's --initial-cluster-token, from which a new
	// cluster's id is derived: every member of one InitialCluster must use
	// the same token. Default DefaultClusterToken.
	ClusterToken string
	// Endpoints, if set, are the client URLs of an external etcd cluster (or
	// of the members of an embedded one): nothing is embedded and the node
	// keeps no catalog state on disk. The embedded-only fields (Dir,
	// ClientAddr, PeerAddr, ClusterState, ClusterToken, UnsafeNoFsync,
	// FastElection) are then ignored; InitialCluster is refused.
	Endpoints []string
	// LeaseTTL is the TTL of the node's lease: how long after its last
	// renewal a dead node's records outlive it. etcd leases are granted in
	// whole seconds, so it must be a whole number of seconds, at least 1s.
	// Default DefaultLeaseTTL.
	LeaseTTL time.Duration
	// FenceMargin is how long before the lease could expire anywhere the node
	// already treats it as lost (see Catalog.LeaseLost and FenceDeadline).
	// Default LeaseTTL/3. It must be positive and smaller than LeaseTTL. The
	// lease is renewed every (LeaseTTL-FenceMargin)/4, LeaseTTL/6 by
	// default, which leaves three times as long for retries, each attempt
	// bounded by (LeaseTTL-FenceMargin)/8 (at least 200ms, at most
	// RequestTimeout), before the node fences.
	FenceMargin time.Duration
	// DialTimeout bounds connecting to external Endpoints. Default
	// DefaultDialTimeout.
	DialTimeout time.Duration
	// RequestTimeout bounds each catalog write and lease call, on top of the
	// caller's context, so that a catalog without quorum fails a write
	// instead of blocking it. Default DefaultRequestTimeout.
	RequestTimeout time.Duration
	// Logger receives the catalog's logs. Default: discard.
	Logger *slog.Logger
	// Metrics counts the node's etcd requests and watch events (NewMetrics).
	// Default: unregistered counters.
	Metrics *Metrics
	// UnsafeNoFsync turns off fsync in the embedded member. Tests only: a
	// crash can lose acknowledged writes.
	UnsafeNoFsync bool
	// TLS, when set, is the cluster's mutual TLS: an embedded member
	// serves its client and peer ports over TLS with this certificate and
	// requires client certificates its CA signed; with Endpoints, it is how
	// this node connects to the external etcd (Cert and Key may then be
	// empty: the CA alone checks the servers). The in-process client of an
	// embedded member needs none.
	TLS *TLSFiles
	// Secret is the cluster secret (at least 16 bytes). An embedded member
	// without TLS serves its ports over mutual TLS with certificates of a
	// CA derived from it (derive.go), so that only holders of the secret
	// reach the catalog: an embedded member always has TLS, and
	// InitialCluster's URLs are always https://. With Endpoints over
	// https:// and no TLS, the node presents a certificate of that CA: a
	// node using the members of an embedded cluster as a client.
	Secret []byte
	// Username and Password authenticate to an external etcd that has
	// authentication enabled (etcd's own users and roles).
	Username, Password string
	// FastElection sets the embedded member's heartbeat to 10 ms and its
	// election timeout to 100 ms (etcd's defaults are 100 ms and 1 s) so a
	// member becomes leader in tens of milliseconds. Tests only: on a busy
	// machine it causes spurious elections.
	FastElection bool
}

// TLSFiles are the PEM files of a TLS identity and the CA it trusts.
type TLSFiles struct {
	Cert, Key, CA string
}

// scheme is the scheme of the member URLs: an embedded member always
// serves TLS (its own files, or derived from the secret).
func (c *Config) scheme() string { return "https" }

// minSecretBytes is the shortest secret the certificates are derived from
// (the peer transport's minimum too).
const minSecretBytes = 16

// clientTLS is the TLS of a client of external Endpoints: the TLS files
// when given, else, for https:// endpoints, a certificate derived from the
// secret (a client of an embedded cluster's members); nil: none.
func (c *Config) clientTLS() (*tls.Config, error) {
	if c.TLS == nil {
		if len(c.Secret) >= minSecretBytes && slices.ContainsFunc(c.Endpoints, func(ep string) bool { return strings.HasPrefix(ep, "https://") }) {
			return derivedClientTLS(c.Secret, c.Name)
		}
		return nil, nil
	}
	info := transport.TLSInfo{CertFile: c.TLS.Cert, KeyFile: c.TLS.Key, TrustedCAFile: c.TLS.CA}
	tc, err := info.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("etcd TLS: %w", err)
	}
	return tc, nil
}

// embedded reports whether the configuration runs an embedded member.
func (c *Config) embedded() bool { return len(c.Endpoints) == 0 }

// withDefaults returns c with every zero-valued field set to its default.
func (c Config) withDefaults() Config {
	if c.Metrics == nil {
		c.Metrics = NewMetrics(nil)
	}
	if c.embedded() {
		c.ClientAddr = cmp.Or(c.ClientAddr, DefaultAddr)
		c.PeerAddr = cmp.Or(c.PeerAddr, DefaultAddr)
		c.ClusterState = cmp.Or(c.ClusterState, DefaultClusterState)
		c.ClusterToken = cmp.Or(c.ClusterToken, DefaultClusterToken)
	}
	c.LeaseTTL = cmp.Or(c.LeaseTTL, DefaultLeaseTTL)
	c.FenceMargin = cmp.Or(c.FenceMargin, c.LeaseTTL/3)
	c.DialTimeout = cmp.Or(c.DialTimeout, DefaultDialTimeout)
	c.RequestTimeout = cmp.Or(c.RequestTimeout, DefaultRequestTimeout)
	c.Logger = cmp.Or(c.Logger, slog.New(slog.DiscardHandler))
	return c
}

// Validate reports every field that cannot be used, each error naming its
// field. Zero values stand for their defaults and are valid. Validate does
// not modify c.
func (c *Config) Validate() error {
	d := c.withDefaults()
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("catalog config: %s: %s", field, fmt.Sprintf(format, args...)))
	}
	if !core.ValidName(d.Name) {
		bad("Name", "%q is not a node id (1-128 of [A-Za-z0-9._-], not starting with '.')", d.Name)
	}
	if d.embedded() {
		if d.Dir == "" {
			bad("Dir", "required for the embedded catalog (or set Endpoints)")
		}
		if _, _, err := net.SplitHostPort(d.ClientAddr); err != nil {
			bad("ClientAddr", "%q is not host:port: %v", d.ClientAddr, err)
		}
		if _, _, err := net.SplitHostPort(d.PeerAddr); err != nil {
			bad("PeerAddr", "%q is not host:port: %v", d.PeerAddr, err)
		}
		d.validateCluster(bad)
	} else {
		if d.InitialCluster != "" {
			bad("InitialCluster", "set together with Endpoints: a node either embeds a member of the cluster (InitialCluster) or is a client of it (Endpoints)")
		}
		for i, ep := range d.Endpoints {
			if ep == "" {
				bad("Endpoints", "entry %d is empty", i)
			}
		}
		// ClientAddr, PeerAddr, Dir, UnsafeNoFsync and FastElection only
		// shape an embedded member and are ignored here rather than
		// refused: a node's flags carry defaults for them whichever mode
		// it runs in. Open logs them at debug level.
	}
	if t := d.TLS; t != nil {
		if t.CA == "" {
			bad("TLS", "CA is required: the CA that signs the members' and the clients' certificates")
		}
		if (t.Cert == "") != (t.Key == "") || (d.embedded() && t.Cert == "") {
			bad("TLS", "Cert and Key go together, and an embedded member needs both")
		}
	}
	if d.embedded() && d.TLS == nil && len(d.Secret) < minSecretBytes {
		bad("Secret", "an embedded member serves TLS only: give it TLS files, or the cluster secret (at least %d bytes) to derive its certificates from", minSecretBytes)
	}
	if d.embedded() && (d.Username != "" || d.Password != "") {
		bad("Username", "is for an external etcd (Endpoints); an embedded member has no users")
	}
	if d.LeaseTTL < time.Second || d.LeaseTTL%time.Second != 0 {
		bad("LeaseTTL", "must be a whole number of seconds, at least 1s, got %v", d.LeaseTTL)
	}
	if d.FenceMargin <= 0 || d.FenceMargin >= d.LeaseTTL {
		bad("FenceMargin", "must be in (0, LeaseTTL=%v), got %v", d.LeaseTTL, d.FenceMargin)
	}
	if d.DialTimeout < 0 {
		bad("DialTimeout", "must not be negative, got %v", d.DialTimeout)
	}
	if d.RequestTimeout < 0 {
		bad("RequestTimeout", "must not be negative, got %v", d.RequestTimeout)
	}
	return errors.Join(errs...)
}
