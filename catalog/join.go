package catalog

// How an embedded member of a cluster finds its place before it starts
// (docs/membership.md). etcd decides on a member's first start from its
// flags alone: a member named in the running cluster whose data directory
// is empty exits with "member ... has already been bootstrapped", and a
// member whose peer address changed keeps being dialled at the old one.
// The catalog is the source of truth instead: before the member starts,
// the node asks the members it knows (InitialCluster) for the running
// cluster's member list, over TLS of the cluster CA (its own files, or the
// one derived from the secret: reaching them proves the node belongs), and
//
//   - with an empty data directory, at a peer address the cluster lists
//     as a member added and not started yet (`switchyard members add`):
//     it starts as that member, with ClusterState existing and the
//     current members;
//   - with an empty data directory, under a name the cluster lists as a
//     member that has run: it removes that member (unless it still
//     answers at another address: two nodes under one name), adds itself
//     as a learner, and starts the same way (the replacement of a node
//     that lost its disk);
//   - with an empty data directory, under a name the running cluster does
//     not list: it adds itself as a learner the same way (a node named in
//     InitialCluster that the running cluster has lost, such as a
//     replacement that stopped between its removal and its addition);
//   - with an empty data directory, named in a cluster none of whose
//     members has run yet, or in one whose other members started without
//     it (a late first start): etcd's flags decide;
//   - with data, under a name the cluster lists at another peer address:
//     it moves the member to its new address (MemberUpdate).
//
// A learner promotes itself once it has caught up with the leader (etcd
// refuses the promotion before), and Open returns only then. When no
// member answers, the member starts from its flags as before: the first
// start of a new cluster, whose members start together, or a restart on
// existing data.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/membership"

	"github.com/switchyard/switchyard/internal/netaddr"
)

// peerMember is a member as etcd's peer API lists it (GET /members on a
// peer port: etcd's membership.Member).
type peerMember struct {
	ID         uint64   `json:"id"`
	Name       string   `json:"name"`
	PeerURLs   []string `json:"peerURLs"`
	ClientURLs []string `json:"clientURLs"`
	IsLearner  bool     `json:"isLearner"`
}

// started reports whether the member has run: a member publishes its
// client URLs when it first joins, which is also etcd's own test for
// "already bootstrapped".
func (m peerMember) started() bool { return len(m.ClientURLs) > 0 }

// joinPlan is what prepareJoin decided.
type joinPlan struct {
	initialCluster string // "" keeps the flags'
	state          string
}

// peerTimeout bounds asking one member for the member list.
const peerTimeout = 2 * time.Second

// hasMemberData reports whether the member's data directory holds a WAL.
func hasMemberData(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "etcd", "member", "wal"))
	return err == nil
}

// prepareJoin is run before the embedded member of a cluster starts.
func prepareJoin(ctx context.Context, cfg Config, ms []clusterMember) (joinPlan, error) {
	log := cfg.Logger
	plan := joinPlan{state: cfg.ClusterState}
	pu := peerURL(cfg, ms) // what the member advertises
	selfURL := pu.String()
	current, from, err := askMembers(ctx, cfg, ms)
	if err != nil {
		return plan, err
	}
	hasData := hasMemberData(cfg.Dir)
	if current == nil || !slices.ContainsFunc(current, peerMember.started) {
		// No member answered, or the cluster is still being bootstrapped:
		// etcd's flags decide.
		if !hasData && cfg.ClusterState == ClusterStateExisting && current == nil {
			return plan, fmt.Errorf("ClusterState %q: no member of InitialCluster answered (%s): a member joins a running cluster through them", ClusterStateExisting, joinInitialCluster(ms))
		}
		return plan, nil
	}
	byName := slices.IndexFunc(current, func(m peerMember) bool { return m.Name == cfg.Name })
	byURL := slices.IndexFunc(current, func(m peerMember) bool {
		return slices.ContainsFunc(m.PeerURLs, func(u string) bool { return samePeerURL(u, selfURL) })
	})
	if hasData {
		if byName >= 0 && byURL != byName {
			// Moved: the member's data is here, its entry names the old
			// address, which nobody answers at any more.
			old := current[byName]
			return plan, moveMember(cfg, old.ID, old.PeerURLs, selfURL, "asked "+from, func(urls []string) error {
				return withRemote(ctx, cfg, current, func(cli *clientv3.Client) error {
					_, err := cli.MemberUpdate(ctx, old.ID, urls)
					return err
				})
			})
		}
		return plan, nil
	}
	// An empty data directory, and a running cluster.
	var id uint64
	switch {
	case byURL >= 0 && !current[byURL].started() && (current[byURL].Name == "" || current[byURL].Name == cfg.Name):
		// Added for this node (switchyard members add), not started yet.
		id = current[byURL].ID
		log.Info("catalog: membership: joining as the member added for this peer address", "member", cfg.Name, "id", memberID(id), "learner", current[byURL].IsLearner, "asked", from)
	case byName >= 0 && !current[byName].started() && cfg.ClusterState == ClusterStateNew:
		// Named in a cluster whose other members have started without it
		// yet: a late first start of a new cluster; etcd's flags decide.
		return plan, nil
	default:
		if byURL >= 0 && byURL != byName {
			return plan, fmt.Errorf("the cluster's member %s %q has this node's peer address %s: remove it (switchyard members remove) or give this node another --etcd-peer-addr", memberID(current[byURL].ID), current[byURL].Name, selfURL)
		}
		if byName >= 0 {
			stale := current[byName]
			if !slices.ContainsFunc(stale.PeerURLs, func(u string) bool { return samePeerURL(u, selfURL) }) {
				// At another address: make sure no process serves it
				// there (two nodes under one name).
				if answers, err := memberAnswers(ctx, cfg, stale.PeerURLs); err != nil {
					return plan, err
				} else if answers {
					return plan, fmt.Errorf("member %s %q runs at %v: another node has this node's name; refusing to replace it", memberID(stale.ID), stale.Name, stale.PeerURLs)
				}
			}
			log.Warn("catalog: membership: this node's data directory is empty but the cluster lists it as a member that has run: replacing that member (the cluster secret proves this node belongs)",
				"member", cfg.Name, "stale_id", memberID(stale.ID), "stale_peer_urls", stale.PeerURLs, "asked", from)
			if err := withRemote(ctx, cfg, current, func(cli *clientv3.Client) error {
				_, err := cli.MemberRemove(ctx, stale.ID)
				return err
			}); err != nil {
				return plan, fmt.Errorf("remove the stale member %s: %w", memberID(stale.ID), err)
			}
			log.Info("catalog: membership: removed the stale member", "member", cfg.Name, "id", memberID(stale.ID))
			current = slices.Delete(current, byName, byName+1)
		}
		log.Info("catalog: membership: adding this node as a learner", "member", cfg.Name, "peer_url", selfURL)
		if err := withRemote(ctx, cfg, current, func(cli *clientv3.Client) error {
			resp, err := retryUnhealthy(ctx, cfg, func() (*clientv3.MemberAddResponse, error) {
				return cli.MemberAddAsLearner(ctx, []string{selfURL})
			})
			if err == nil {
				id = resp.Member.ID
				current = current[:0]
				for _, m := range resp.Members {
					current = append(current, peerMember{ID: m.ID, Name: m.Name, PeerURLs: m.PeerURLs, ClientURLs: m.ClientURLs, IsLearner: m.IsLearner})
				}
			}
			return err
		}); err != nil {
			return plan, fmt.Errorf("add member %s as a learner: %w", cfg.Name, err)
		}
		log.Info("catalog: membership: added as a learner", "member", cfg.Name, "id", memberID(id))
	}
	var list []clusterMember
	for _, m := range current {
		name := m.Name
		if m.ID == id {
			name = cfg.Name
		}
		if name == "" || len(m.PeerURLs) == 0 {
			return plan, fmt.Errorf("member %s (%v) was added and has not started: start it (or remove it) before this node joins", memberID(m.ID), m.PeerURLs)
		}
		for _, u := range m.PeerURLs {
			list = append(list, clusterMember{name: name, scheme: cfg.scheme(), host: hostOf(u)})
		}
	}
	plan.initialCluster, plan.state = joinInitialCluster(list), ClusterStateExisting
	log.Info("catalog: membership: starting the member in the existing cluster", "member", cfg.Name, "initial_cluster", plan.initialCluster)
	return plan, nil
}

// moveMember updates the entry of this node's member id, which lists the
// peer URLs old, to selfURL with update: a member whose peer address
// changed (another --etcd-peer-addr, or a port chosen at start) is dialled
// at the old one until its entry says otherwise. Before the member starts
// (prepareJoin) update asks the other members; after (updateOwnEntry, the
// only way for a member with no other member to ask) it is the member's
// own server. how says which, for the log.
func moveMember(cfg Config, id uint64, old []string, selfURL, how string, update func(urls []string) error) error {
	cfg.Logger.Info("catalog: membership: this member's entry lists another peer address than it serves at (it moved, or its port was chosen at start); updating the entry", "member", cfg.Name, "id", memberID(id), "old_peer_urls", old, "peer_url", selfURL, "via", how)
	if err := update([]string{selfURL}); err != nil {
		return fmt.Errorf("update the peer URL of member %s: %w", cfg.Name, err)
	}
	cfg.Logger.Info("catalog: membership: member entry updated", "member", cfg.Name, "peer_url", selfURL)
	return nil
}

// updateOwnEntry runs once the embedded member e is ready: when its member
// entry lists other peer URLs than advertised, the URL it serves at now
// (with a port chosen at start, the bound one), it moves the entry there
// (moveMember). prepareJoin did so already when another member answered;
// this covers a member alone, restarted at another address, and one on
// port 0, whose entry would otherwise say port 0.
func updateOwnEntry(ctx context.Context, cfg Config, e *embed.Etcd, advertised url.URL) error {
	self := e.Server.Cluster().Member(e.Server.MemberID())
	if self == nil {
		return nil
	}
	if len(self.PeerURLs) == 1 && samePeerURL(self.PeerURLs[0], advertised.String()) {
		return nil
	}
	return moveMember(cfg, uint64(self.ID), self.PeerURLs, advertised.String(), "its own server", func(urls []string) error {
		uctx, cancel := context.WithTimeout(ctx, cfg.RequestTimeout)
		defer cancel()
		_, err := e.Server.UpdateMember(uctx, membership.Member{ID: self.ID, RaftAttributes: membership.RaftAttributes{PeerURLs: urls, IsLearner: self.IsLearner}})
		return err
	})
}

// askMembers asks the members of ms other than this node, all at once,
// for the member list on their peer port, and returns the first answer and
// who gave it; nil when none answered within peerTimeout. (At once, so that
// a start with peers unreachable, a partition, waits peerTimeout, not
// peerTimeout per peer.)
func askMembers(ctx context.Context, cfg Config, ms []clusterMember) ([]peerMember, string, error) {
	tc, err := cfg.memberTLS()
	if err != nil {
		return nil, "", err
	}
	tr := &http.Transport{TLSClientConfig: tc, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	actx, cancel := context.WithTimeout(ctx, peerTimeout)
	defer cancel()
	type answer struct {
		list []peerMember
		from string
	}
	answers := make(chan answer, len(ms))
	var wg sync.WaitGroup
	for _, m := range ms {
		if m.name == cfg.Name {
			continue
		}
		wg.Go(func() {
			list, err := askMember(actx, hc, m)
			if err != nil {
				cfg.Logger.Debug("catalog: membership: member gave no member list", "member", m.name, "err", err)
				return
			}
			answers <- answer{list, m.name}
		})
	}
	go func() {
		wg.Wait()
		close(answers)
	}()
	a, ok := <-answers
	cancel()
	wg.Wait() // the others end with actx
	if !ok {
		return nil, "", ctx.Err()
	}
	return a.list, a.from, nil
}

// askMember is GET /members on m's peer port.
func askMember(ctx context.Context, hc *http.Client, m clusterMember) ([]peerMember, error) {
	status, body, err := peerGet(ctx, hc, m.scheme+"://"+m.host+"/members")
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, fmt.Errorf("GET /members: %d %s", status, http.StatusText(status))
	}
	var list []peerMember
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, fmt.Errorf("GET /members: %w", err)
	}
	return list, nil
}

// peerGet is GET url on a member's peer port: the status and the first
// MiB of the body, read to its end or that far.
func peerGet(ctx context.Context, hc *http.Client, url string) (status int, body []byte, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	res, err := hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	body, err = io.ReadAll(io.LimitReader(res.Body, 1<<20))
	return res.StatusCode, body, err
}

// withRemote runs f with a client of the started members of current:
// their client URLs, less the loopback ones of members whose peer URL is
// not on loopback (a member that serves clients on its own loopback only,
// as in the compose demo, cannot be asked from another host).
func withRemote(ctx context.Context, cfg Config, current []peerMember, f func(cli *clientv3.Client) error) error {
	var eps, skipped []string
	for _, m := range current {
		if m.Name == cfg.Name {
			continue
		}
		for _, u := range m.ClientURLs {
			if isLoopbackURL(u) && !slices.ContainsFunc(m.PeerURLs, isLoopbackURL) {
				skipped = append(skipped, u)
				continue
			}
			eps = append(eps, u)
		}
	}
	if len(eps) == 0 {
		return fmt.Errorf("no other member has a client URL this node can reach (only loopback ones: %v): give the members an --etcd-client-addr on an address the other nodes reach (its port serves mutual TLS only)", skipped)
	}
	cli, err := remoteClient(cfg, eps)
	if err != nil {
		return err
	}
	defer cli.Close()
	return f(cli)
}

// hostOf is the host:port of a URL ("" if it is none).
func hostOf(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Host
}

// memberAnswers reports whether a member answers at one of peerURLs.
func memberAnswers(ctx context.Context, cfg Config, peerURLs []string) (bool, error) {
	tc, err := cfg.memberTLS()
	if err != nil {
		return false, err
	}
	tr := &http.Transport{TLSClientConfig: tc, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	actx, cancel := context.WithTimeout(ctx, peerTimeout)
	defer cancel()
	for _, u := range peerURLs {
		if peerAnswers(actx, hc, u) {
			return true, nil
		}
	}
	return false, nil
}

// isLoopbackURL reports whether raw's host is a loopback address or
// localhost.
func isLoopbackURL(raw string) bool { return netaddr.IsLoopback(hostOf(raw)) }

// promote promotes the learner id, this member, once etcd lets it (it has
// caught up with the leader), bounded by ctx.
func promote(ctx context.Context, cfg Config, e *embed.Etcd, id uint64) error {
	start := time.Now()
	for attempt := 1; ; attempt++ {
		pctx, cancel := context.WithTimeout(ctx, cfg.RequestTimeout)
		_, err := e.Server.PromoteMember(pctx, id)
		cancel()
		if err == nil {
			cfg.Logger.Info("catalog: membership: promoted to a voting member", "member", cfg.Name, "id", memberID(id), "after", time.Since(start).Round(time.Millisecond), "attempts", attempt)
			return nil
		}
		cfg.Logger.Debug("catalog: membership: not promoted yet", "member", cfg.Name, "err", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("promote learner %s: %w (last: %v)", memberID(id), ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// retryUnhealthy retries f while etcd refuses it as "unhealthy cluster":
// its strict reconfiguration check allows a member change only once the
// leader has been connected to every voting member for a few seconds,
// which a removal just before, or a member restarting, defers.
func retryUnhealthy[T any](ctx context.Context, cfg Config, f func() (T, error)) (T, error) {
	for {
		v, err := f()
		if err == nil || !errors.Is(err, rpctypes.ErrUnhealthy) {
			return v, err
		}
		cfg.Logger.Debug("catalog: membership: the cluster refuses a member change until every member has been connected for a while; retrying", "err", err)
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(500 * time.Millisecond):
		}
	}
}
