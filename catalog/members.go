package catalog

// The catalog's membership as an operation (docs/membership.md): listing,
// adding and removing the members of an embedded etcd cluster, with etcd's
// own member API (clientv3.Cluster), and the checks that keep quorum.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/core"
)

var _ core.MemberAdmin = (*Catalog)(nil)

// memberCheckTimeout bounds one member's status request: a member that
// does not answer within it counts as down.
const memberCheckTimeout = 2 * time.Second

// unhealthyWait bounds how long AddMember waits for etcd's strict
// reconfiguration check (every voting member connected for 5s) to pass.
const unhealthyWait = 8 * time.Second

// memberTLS is how this node talks to the other members' ports: the
// cluster CA's files when it has them, else a certificate derived from
// the cluster secret (derive.go). With neither (an external etcd without
// TLS) it is nil.
func (c *Config) memberTLS() (*tls.Config, error) {
	if c.TLS != nil {
		if c.TLS.Cert == "" {
			return c.clientTLS()
		}
		info := transport.TLSInfo{CertFile: c.TLS.Cert, KeyFile: c.TLS.Key, TrustedCAFile: c.TLS.CA}
		return info.ClientConfig()
	}
	if len(c.Secret) >= minSecretBytes {
		return derivedClientTLS(c.Secret, c.Name)
	}
	return nil, nil
}

// remoteClient is a client of the members at endpoints over memberTLS,
// for the calls the in-process client cannot make: another member's
// status, and member changes before this node's own member runs.
func remoteClient(cfg Config, endpoints []string) (*clientv3.Client, error) {
	tc, err := cfg.memberTLS()
	if err != nil {
		return nil, err
	}
	return clientv3.New(clientv3.Config{
		Endpoints: endpoints, DialTimeout: memberCheckTimeout, Logger: zap.NewNop(), TLS: tc,
		Username: cfg.Username, Password: cfg.Password,
	})
}

// memberList is the cluster's member list with each member's health and
// the leader. With an embedded member, a member is healthy when its peer
// port answers etcd's GET /version over the cluster's TLS: peer URLs are
// the addresses every member reaches, whereas a member's client URL may be
// its own loopback (the compose demo's); the leader is this member's
// view. With external endpoints, each member's client URL is asked for
// its status.
func (c *Catalog) memberList(ctx context.Context) ([]core.Member, error) {
	wctx, cancel := c.writeCtx(ctx)
	defer cancel()
	resp, err := c.client.MemberList(wctx, clientv3.WithSerializable())
	if err != nil {
		return nil, catalogUnavailable("list the members", err)
	}
	ms := make([]core.Member, len(resp.Members))
	for i, m := range resp.Members {
		ms[i] = toMember(m)
	}
	var (
		mu     sync.Mutex
		wg     sync.WaitGroup
		leader uint64
	)
	var check func(ctx context.Context, m *etcdserverpb.Member) bool
	if c.etcd != nil {
		if l := uint64(c.etcd.Server.Leader()); l != 0 {
			leader = l
		}
		tc, err := c.cfg.memberTLS()
		if err != nil {
			return nil, fmt.Errorf("members: %w", err)
		}
		tr := &http.Transport{TLSClientConfig: tc, DisableKeepAlives: true}
		defer tr.CloseIdleConnections()
		hc := &http.Client{Transport: tr}
		self := uint64(c.etcd.Server.MemberID())
		check = func(ctx context.Context, m *etcdserverpb.Member) bool {
			if m.ID == self {
				return true
			}
			return len(m.PeerURLs) > 0 && peerAnswers(ctx, hc, m.PeerURLs[0])
		}
	} else {
		check = func(ctx context.Context, m *etcdserverpb.Member) bool {
			if len(m.ClientURLs) == 0 {
				return false
			}
			st, err := c.client.Status(ctx, m.ClientURLs[0])
			if err == nil && st.Leader != 0 {
				mu.Lock()
				leader = st.Leader
				mu.Unlock()
			}
			return err == nil
		}
	}
	for i, m := range resp.Members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sctx, cancel := context.WithTimeout(ctx, memberCheckTimeout)
			defer cancel()
			ok := check(sctx, m)
			mu.Lock()
			ms[i].Healthy = ok
			mu.Unlock()
		}()
	}
	wg.Wait()
	for i, m := range resp.Members {
		ms[i].Leader = m.ID == leader
		if c.etcd != nil && m.ID == uint64(c.etcd.Server.MemberID()) {
			// A member publishes the client URL it was configured with;
			// on port 0 show the one it serves at.
			for j, u := range ms[i].ClientURLs {
				if pu, err := url.Parse(u); err == nil {
					bu := boundURL(*pu, c.etcd.Clients[0].Addr())
					ms[i].ClientURLs[j] = bu.String()
				}
			}
		}
	}
	return ms, nil
}

// checkReachable refuses adding a member at peerURL while a voting
// member's peer address is one the new member cannot keep reaching
// (member_address_unusable): this node's own when its port was chosen at
// start (PeerAddr with port 0, which only a node started alone can have:
// the port changes at every restart, and the new member would dial the
// old one), or any voting member's loopback address when peerURL is not
// on loopback (another host reaches no member there).
func (c *Catalog) checkReachable(ms []core.Member, peerURL string) error {
	const fix = "restart that node with an explicit --etcd-peer-addr and --etcd-client-addr on an address the new member reaches, and --initial-cluster <its name>=https://<that peer address>, then add the member (docs/membership.md, \"Growing a node that started alone\")"
	if c.etcd != nil {
		if _, port, err := net.SplitHostPort(c.cfg.PeerAddr); err == nil && port == "0" {
			self := memberID(uint64(c.etcd.Server.MemberID()))
			return &core.Error{Code: core.CodeMemberAddressUnusable, Detail: fmt.Sprintf("member %s %q listens for peers on a port chosen when its node started (%s, no --etcd-peer-addr): it changes at every restart, and the new member would lose it; %s", self, c.cfg.Name, c.peerAddr, fix)}
		}
	}
	if isLoopbackURL(peerURL) {
		return nil
	}
	for _, m := range ms {
		if m.Learner {
			continue
		}
		if i := slices.IndexFunc(m.PeerURLs, isLoopbackURL); i >= 0 {
			return &core.Error{Code: core.CodeMemberAddressUnusable, Field: "peer_url", Detail: fmt.Sprintf("member %s %q has the loopback peer URL %s, which the new member at %s cannot reach; %s", m.ID, m.Name, m.PeerURLs[i], peerURL, fix)}
		}
	}
	return nil
}

// peerAnswers reports whether the member at peerURL answers GET /version
// on its peer port.
func peerAnswers(ctx context.Context, hc *http.Client, peerURL string) bool {
	status, _, err := peerGet(ctx, hc, strings.TrimRight(peerURL, "/")+"/version")
	return err == nil && status == http.StatusOK
}

func toMember(m *etcdserverpb.Member) core.Member {
	return core.Member{
		ID: memberID(m.ID), Name: m.Name, PeerURLs: slices.Clone(m.PeerURLs), ClientURLs: slices.Clone(m.ClientURLs),
		Learner: m.IsLearner,
	}
}

func memberID(id uint64) string { return strconv.FormatUint(id, 16) }

func catalogUnavailable(what string, err error) error {
	return &core.Error{Code: core.CodeCatalogUnavailable, Detail: fmt.Sprintf("could not %s: %v", what, err), RetryAfter: time.Second}
}

// Members implements core.MemberAdmin.
func (c *Catalog) Members(ctx context.Context) ([]core.Member, error) { return c.memberList(ctx) }

// AddMember implements core.MemberAdmin: etcd's learner step. A learner
// receives the log but does not vote, so adding it never changes the
// quorum; the node that starts as it promotes it once it has caught up
// (join.go), and only then does the cluster count one more voter.
func (c *Catalog) AddMember(ctx context.Context, name, peerURL string) (core.Member, []core.Member, error) {
	if !core.ValidName(name) {
		return core.Member{}, nil, &core.Error{Code: core.CodeInvalidMember, Field: "name", Detail: fmt.Sprintf("%q is not a node id (1-128 of [A-Za-z0-9._-], not starting with '.')", name)}
	}
	if err := checkPeerURL(peerURL); err != nil {
		return core.Member{}, nil, &core.Error{Code: core.CodeInvalidMember, Field: "peer_url", Detail: err.Error()}
	}
	ms, err := c.memberList(ctx)
	if err != nil {
		return core.Member{}, nil, err
	}
	for _, m := range ms {
		if m.Name == name {
			return core.Member{}, nil, &core.Error{Code: core.CodeMemberExists, Field: "name", Detail: fmt.Sprintf("member %s (%s) already has the name %s; to replace it, start its node with an empty data directory (docs/membership.md)", m.ID, strings.Join(m.PeerURLs, ","), name)}
		}
		if slices.ContainsFunc(m.PeerURLs, func(u string) bool { return samePeerURL(u, peerURL) }) {
			return core.Member{}, nil, &core.Error{Code: core.CodeMemberExists, Field: "peer_url", Detail: fmt.Sprintf("member %s %q already has the peer URL %s", m.ID, m.Name, peerURL)}
		}
		if m.Learner {
			return core.Member{}, nil, &core.Error{Code: core.CodeMemberExists, Detail: fmt.Sprintf("member %s %q is a learner not promoted yet: etcd adds one at a time; start its node (or remove it) first", m.ID, m.Name)}
		}
	}
	if err := c.checkReachable(ms, peerURL); err != nil {
		return core.Member{}, nil, err
	}
	voters, healthy := countVoters(ms, "")
	if healthy < quorum(voters) {
		return core.Member{}, nil, &core.Error{Code: core.CodeQuorumAtRisk, Detail: fmt.Sprintf("%d of the %d voting members answer, fewer than the quorum of %d: the cluster cannot take a member change; bring members back first", healthy, voters, quorum(voters))}
	}
	// etcd takes a member change only once the leader has been connected
	// to every voting member for 5s (its strict reconfiguration check):
	// wait that out after a member came back, not longer.
	rctx, cancel := context.WithTimeout(ctx, unhealthyWait)
	defer cancel()
	resp, err := retryUnhealthy(rctx, c.cfg, func() (*clientv3.MemberAddResponse, error) {
		wctx, cancel := c.writeCtx(rctx)
		defer cancel()
		return c.client.MemberAddAsLearner(wctx, []string{peerURL})
	})
	if err != nil {
		if errors.Is(err, rpctypes.ErrUnhealthy) {
			return core.Member{}, nil, &core.Error{Code: core.CodeQuorumAtRisk, Detail: "etcd refuses the change until every voting member has been connected to the leader for 5 seconds: " + err.Error(), RetryAfter: 5 * time.Second}
		}
		if errors.Is(err, rpctypes.ErrTooManyLearners) || errors.Is(err, rpctypes.ErrPeerURLExist) || errors.Is(err, rpctypes.ErrMemberExist) {
			return core.Member{}, nil, &core.Error{Code: core.CodeMemberExists, Detail: err.Error()}
		}
		return core.Member{}, nil, catalogUnavailable("add the member", err)
	}
	added := toMember(resp.Member)
	added.Name = name
	after := make([]core.Member, 0, len(resp.Members))
	for _, m := range resp.Members {
		cm := toMember(m)
		if m.ID == resp.Member.ID {
			cm = added
		} else if j := slices.IndexFunc(ms, func(o core.Member) bool { return o.ID == cm.ID }); j >= 0 {
			cm.Healthy, cm.Leader = ms[j].Healthy, ms[j].Leader
		}
		after = append(after, cm)
	}
	c.log.Info("catalog: added a learner member; start its node with --initial-cluster-state existing", "name", name, "id", added.ID, "peer_url", peerURL, "members", len(after))
	return added, after, nil
}

// RemoveMember implements core.MemberAdmin. It refuses a member that still
// answers (member_running): removing a running member fences its node for
// good, and the leader is always a running member, so leadership never
// has to move first; the operator stops the node, then removes its
// member. And it refuses a removal after which fewer voting members
// answer than the quorum of those left (quorum_at_risk).
func (c *Catalog) RemoveMember(ctx context.Context, target string) (core.Member, error) {
	if target == "" {
		return core.Member{}, &core.Error{Code: core.CodeInvalidMember, Field: "name", Detail: "name the member: its name or its hex id"}
	}
	ms, err := c.memberList(ctx)
	if err != nil {
		return core.Member{}, err
	}
	i := slices.IndexFunc(ms, func(m core.Member) bool { return m.Name == target || m.ID == strings.ToLower(target) })
	if i < 0 {
		return core.Member{}, &core.Error{Code: core.CodeMemberNotFound, Detail: fmt.Sprintf("no member is named %q or has that id", target)}
	}
	m := ms[i]
	if m.Healthy {
		return m, &core.Error{Code: core.CodeMemberRunning, Detail: fmt.Sprintf("member %s %q still answers: stop its node first, then remove it (docs/membership.md)", m.ID, m.Name)}
	}
	voters, healthy := countVoters(ms, m.ID)
	if voters == 0 || healthy < quorum(voters) {
		return m, &core.Error{Code: core.CodeQuorumAtRisk, Detail: fmt.Sprintf("after removing %q, %d of the %d voting members left would answer, fewer than their quorum of %d", target, healthy, voters, quorum(max(voters, 1)))}
	}
	id, _ := strconv.ParseUint(m.ID, 16, 64)
	wctx, cancel := c.writeCtx(ctx)
	defer cancel()
	if _, err := c.client.MemberRemove(wctx, id); err != nil {
		if errors.Is(err, rpctypes.ErrMemberNotFound) {
			return m, &core.Error{Code: core.CodeMemberNotFound, Detail: err.Error()}
		}
		return m, catalogUnavailable("remove the member", err)
	}
	c.log.Info("catalog: removed a member", "name", m.Name, "id", m.ID, "peer_urls", m.PeerURLs, "voting_members_left", voters)
	return m, nil
}

// countVoters counts the voting members but the one with id except, and
// those of them that answered.
func countVoters(ms []core.Member, except string) (voters, healthy int) {
	for _, m := range ms {
		if m.Learner || m.ID == except {
			continue
		}
		voters++
		if m.Healthy {
			healthy++
		}
	}
	return voters, healthy
}

// checkPeerURL accepts https://host:port with an explicit host and port
// (an embedded member serves TLS only).
func checkPeerURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%q is not a URL: %v", raw, err)
	}
	if u.Scheme != "https" || u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return fmt.Errorf("%q is not https://host:port (an embedded member serves TLS only)", raw)
	}
	if err := explicitHostPort(u.Host); err != nil {
		return fmt.Errorf("%q: %v", raw, err)
	}
	return nil
}

// samePeerURL compares two peer URLs by host:port.
func samePeerURL(a, b string) bool {
	ua, err1 := url.Parse(a)
	ub, err2 := url.Parse(b)
	return err1 == nil && err2 == nil && normHostPort(ua.Host) == normHostPort(ub.Host)
}
