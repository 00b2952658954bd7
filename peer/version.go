package peer

import (
	"log/slog"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Peer protocol versions. Every call carries the caller's version in
// MetadataVersion (the client's credentials add it), and a server serves
// only callers whose version is in [MinVersion, Version]: a caller outside
// it, or naming none, is refused with FailedPrecondition, which its router
// takes as final (permanent) and its tracker as a missed ping.
const (
	// MetadataVersion is the metadata key of the caller's protocol version,
	// in decimal.
	MetadataVersion = "x-switchyard-peer-version"
	// Version is the protocol this build speaks (peer.proto).
	Version = 1
	// MinVersion is the oldest protocol version this build serves. There
	// has been no release to stay compatible with, so the range is one
	// version. A change an older node cannot read raises Version; keeping
	// MinVersion at the oldest version still spoken is how a rolling
	// upgrade will mix them.
	MinVersion = 1
)

// versionLogEvery rate-limits the refusal's log line, per calling node: a
// peer of another version retries every message it has.
const versionLogEvery = time.Minute

// versionGate refuses callers of a protocol version this node does not
// serve.
type versionGate struct {
	metrics *Metrics
	log     *slog.Logger

	mu     sync.Mutex
	logged map[string]time.Time // by caller: when its refusal was last logged
}

func newVersionGate(m *Metrics, log *slog.Logger) *versionGate {
	return &versionGate{metrics: m, log: log, logged: map[string]time.Time{}}
}

// check is nil when caller's metadata names a version this node serves,
// else the status to refuse the call with.
func (g *versionGate) check(caller string, md metadata.MD) error {
	vs := md.Get(MetadataVersion)
	if len(vs) == 1 {
		if v, err := strconv.Atoi(vs[0]); err == nil && v >= MinVersion && v <= Version {
			return nil
		}
	}
	got := "none"
	if len(vs) > 0 {
		got = vs[0][:min(len(vs[0]), 32)]
	}
	g.metrics.versionRefusals.Inc()
	if g.shouldLog(caller) {
		g.log.Warn("refused a peer call: the caller's protocol version is not one this node serves",
			"peer", caller, "peer_version", got, "min_version", MinVersion, "version", Version)
	}
	return status.Errorf(codes.FailedPrecondition, "peer protocol version %q of node %s is not served by this node (versions %d to %d)",
		got, caller, MinVersion, Version)
}

// shouldLog reports whether caller's refusal is to be logged now, at most
// once per versionLogEvery.
func (g *versionGate) shouldLog(caller string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	if last, ok := g.logged[caller]; ok && now.Sub(last) < versionLogEvery {
		return false
	}
	if len(g.logged) >= 256 {
		// Callers are authenticated members, but a member can present any
		// id: keep only the entries still muting their caller.
		for id, last := range g.logged {
			if now.Sub(last) >= versionLogEvery {
				delete(g.logged, id)
			}
		}
	}
	g.logged[caller] = now
	return true
}
