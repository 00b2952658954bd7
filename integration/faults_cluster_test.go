//go:build faults

package integration_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/catalog"
	"github.com/switchyard/switchyard/internal/ticktest"
)

// faultTiming is what every node of the suite runs with, passed as flags:
// short enough that a run takes seconds, long enough to be realistic on a
// loaded machine (the lease TTL is the smallest the catalog accepts without
// a warning for an embedded 3-member cluster, see catalog/cluster.go).
type faultTiming struct {
	leaseTTL time.Duration
	// heartbeat is both the peer heartbeat (--peer-heartbeat-interval: ping
	// and reply-leg heartbeats) and the worker session heartbeat
	// (--heartbeat-interval): the unit of the issue's "4 heartbeat
	// intervals".
	heartbeat        time.Duration
	failureThreshold int
	workerIdle       time.Duration
	drain            time.Duration
}

var suiteTiming = faultTiming{
	leaseTTL:         6 * time.Second,
	heartbeat:        500 * time.Millisecond,
	failureThreshold: 3,
	workerIdle:       1500 * time.Millisecond,
	drain:            2 * time.Second,
}

func (ft faultTiming) flags() []string {
	return []string{
		"--lease-ttl", ft.leaseTTL.String(),
		"--peer-heartbeat-interval", ft.heartbeat.String(), "--peer-failure-threshold", fmt.Sprint(ft.failureThreshold),
		"--heartbeat-interval", ft.heartbeat.String(), "--worker-idle-timeout", ft.workerIdle.String(),
		"--drain-timeout", ft.drain.String(),
	}
}

func (ft faultTiming) String() string {
	return fmt.Sprintf("--lease-ttl %v (fence margin %v: a node fences %v after its last renewal), --peer-heartbeat-interval %v, --peer-failure-threshold %d, --heartbeat-interval %v, --worker-idle-timeout %v, --drain-timeout %v; etcd election: etcd's defaults (100ms heartbeat, 1s election timeout)",
		ft.leaseTTL, ft.leaseTTL/3, ft.leaseTTL-ft.leaseTTL/3, ft.heartbeat, ft.failureThreshold, ft.heartbeat, ft.workerIdle, ft.drain)
}

// faultCluster is three node processes, a, b and c, each an embedded etcd
// member of one cluster (--initial-cluster, as in docs/running.md, "Running a
// local cluster").
type faultCluster struct {
	net   *faultNet
	names []string
	nodes map[string]*procNode
	// etcdTLS is how the suite reaches the members' etcd (who leads, and
	// moving the leadership): a client certificate derived from the
	// cluster secret, as an operator's etcdctl would use.
	etcdTLS *tls.Config
}

func startFaultCluster(t *testing.T, bin string, fnet *faultNet, timing faultTiming) *faultCluster {
	t.Helper()
	cl := &faultCluster{net: fnet, names: fnet.nodes, nodes: map[string]*procNode{}}
	t.Cleanup(killHTTP.CloseIdleConnections)
	dir := t.TempDir()
	files, err := catalog.WriteClientTLS(t.TempDir(), []byte(testSecret), "fault-suite")
	if err != nil {
		t.Fatal(err)
	}
	if cl.etcdTLS, err = (transport.TLSInfo{CertFile: files.Cert, KeyFile: files.Key, TrustedCAFile: files.CA}).ClientConfig(); err != nil {
		t.Fatal(err)
	}
	var ic []string
	for _, name := range cl.names {
		ic = append(ic, name+"=https://"+fnet.addrs[name].etcdPeer)
	}
	for _, name := range cl.names {
		ad := fnet.addrs[name]
		args := append([]string{"node", "--name", name,
			"--http-addr", ad.http, "--grpc-addr", ad.grpc, "--peer-addr", ad.peer,
			"--data-dir", filepath.Join(dir, name), "--etcd-client-addr", ad.etcdClient, "--etcd-peer-addr", ad.etcdPeer,
			"--initial-cluster", strings.Join(ic, ","), "--cluster-secret", testSecret, "--log-level", "info",
			// In network namespaces the nodes listen on their own 10.x
			// addresses: the suite's network is the test's, so it takes
			// anonymous calls on purpose. The catalog is over TLS derived
			// from the secret, as everywhere.
			"--allow-anonymous"},
			timing.flags()...)
		cl.nodes[name] = launchProc(t, procSpec{name: name, bin: bin, args: args, wrap: ad.wrap, log: filepath.Join(dir, name+".log"), tailLines: 40})
	}
	// The members wait for each other: start all, then wait for each.
	for _, name := range cl.names {
		cl.nodes[name].awaitServing(t, 60*time.Second)
	}
	for _, name := range cl.names {
		poll(t, 30*time.Second, "a, b, c online in "+name+"'s view", func() bool {
			states, err := cl.states(name)
			return err == nil && len(states) == len(cl.names) && allOnline(states)
		})
	}
	return cl
}

func allOnline(states map[string]string) bool {
	for _, s := range states {
		if s != "online" {
			return false
		}
	}
	return true
}

// states is GET /v1/cluster/nodes from one node: node → state.
func (cl *faultCluster) states(from string) (map[string]string, error) {
	var body struct{ Nodes []struct{ ID, State string } }
	if err := procGetJSON(cl.nodes[from], "/v1/cluster/nodes", &body); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, n := range body.Nodes {
		out[n.ID] = n.State
	}
	return out, nil
}

// ready is GET /readyz of one node, answered 200 within 300ms (a paused
// node answers nothing).
func (cl *faultCluster) ready(node string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+cl.nodes[node].http+"/readyz", nil)
	res, err := killHTTP.Do(req)
	if err != nil {
		return false
	}
	defer res.Body.Close()
	_, _ = io.Copy(io.Discard, res.Body)
	return res.StatusCode == http.StatusOK
}

// queue is GET /v1/queues/{queue} from one node.
func (cl *faultCluster) queue(from, queue string) (killQueueView, error) {
	var q killQueueView
	err := procGetJSON(cl.nodes[from], "/v1/queues/"+queue, &q)
	return q, err
}

// --- etcd's view: who leads, and moving the leadership ---

// etcdLeader asks every reachable member who leads.
func (cl *faultCluster) etcdLeader(ctx context.Context) (string, error) {
	cli, err := cl.etcdClient(cl.names...)
	if err != nil {
		return "", err
	}
	defer cli.Close()
	names, err := memberNames(ctx, cli)
	if err != nil {
		return "", err
	}
	for _, name := range cl.names {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := cli.Status(ctx, "https://"+cl.net.addrs[name].etcdClient)
		cancel()
		if err == nil && st.Leader != 0 {
			return names[st.Leader], nil
		}
	}
	return "", fmt.Errorf("no member names a leader")
}

// moveEtcdLeader makes to's member the etcd leader (etcd's MoveLeader, sent
// to the current leader) and waits until every member agrees.
func (cl *faultCluster) moveEtcdLeader(t *testing.T, to string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	leader, err := cl.etcdLeader(ctx)
	if err != nil {
		t.Fatalf("etcd leader: %v", err)
	}
	if leader == to {
		return
	}
	cli, err := cl.etcdClient(leader)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	names, err := memberNames(ctx, cli)
	if err != nil {
		t.Fatal(err)
	}
	var id uint64
	for mid, name := range names {
		if name == to {
			id = mid
		}
	}
	if _, err := cli.MoveLeader(ctx, id); err != nil {
		t.Fatalf("move the etcd leadership from %s to %s: %v", leader, to, err)
	}
	poll(t, 10*time.Second, "etcd leader "+to, func() bool {
		l, err := cl.etcdLeader(ctx)
		return err == nil && l == to
	})
}

func (cl *faultCluster) etcdClient(members ...string) (*clientv3.Client, error) {
	var eps []string
	for _, m := range members {
		eps = append(eps, "https://"+cl.net.addrs[m].etcdClient)
	}
	return clientv3.New(clientv3.Config{Endpoints: eps, TLS: cl.etcdTLS, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
}

func memberNames(ctx context.Context, cli *clientv3.Client) (map[uint64]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	ml, err := cli.MemberList(ctx)
	if err != nil {
		return nil, err
	}
	out := map[uint64]string{}
	for _, m := range ml.Members {
		out[m.ID] = m.Name
	}
	return out, nil
}

// --- the cluster as one node sees it, over time ---

// nodeSample is one GET /v1/cluster/nodes, and each node's GET /readyz.
type nodeSample struct {
	at     time.Time
	from   string
	states map[string]string // nil when the GET failed
	ready  map[string]bool
}

// observer samples GET /v1/cluster/nodes every 100ms from the first of its
// nodes that answers, and every node's own /readyz: a node is back when
// another lists it online and it says it is ready. (The list alone can be
// stale: a node whose catalog lost its quorum keeps its last view.)
type observer struct {
	cl   *faultCluster
	from []string
	stop chan struct{}
	wg   sync.WaitGroup

	mu      sync.Mutex
	samples []nodeSample
}

func startObserver(t *testing.T, cl *faultCluster, from ...string) *observer {
	o := &observer{cl: cl, from: from, stop: make(chan struct{})}
	o.wg.Go(o.run)
	t.Cleanup(o.halt)
	return o
}

func (o *observer) run() {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		s := nodeSample{at: time.Now(), ready: map[string]bool{}}
		for _, from := range o.from {
			if st, err := o.cl.states(from); err == nil {
				s.from, s.states = from, st
				break
			}
		}
		for _, n := range o.cl.names {
			s.ready[n] = o.cl.ready(n)
		}
		o.mu.Lock()
		o.samples = append(o.samples, s)
		o.mu.Unlock()
		select {
		case <-o.stop:
			return
		case <-tick.C:
		}
	}
}

func (o *observer) halt() {
	select {
	case <-o.stop:
	default:
		close(o.stop)
	}
	o.wg.Wait()
}

// onlineAt is the first sample at or after since in which node is online
// in another's view and ready in its own.
func (o *observer) onlineAt(node string, since time.Time) time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, s := range o.samples {
		if !s.at.Before(since) && s.states[node] == "online" && s.ready[node] {
			return s.at
		}
	}
	return time.Time{}
}

// history is node's state over time, as runs of equal samples from since.
func (o *observer) history(node string, since time.Time) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var parts []string
	last := "-"
	for _, s := range o.samples {
		if s.at.Before(since) {
			continue
		}
		st := "absent"
		switch {
		case s.states == nil:
			st = "no answer"
		case s.states[node] != "":
			st = s.states[node]
		}
		if !s.ready[node] {
			st += " (not ready)"
		}
		if st != last {
			parts = append(parts, fmt.Sprintf("%s@+%v", st, s.at.Sub(since).Round(100*time.Millisecond)))
			last = st
		}
	}
	return strings.Join(parts, " → ")
}

// poll checks cond every 100ms until it holds, failing the test after
// timeout. (waitFor polls every 5ms: too often for HTTP on two cores.)
func poll(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	ticktest.WaitEvery(t, 100*time.Millisecond, timeout, what, cond)
}
