package peer_test

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/internal/coretest"
	"github.com/switchyard/switchyard/internal/promtest"
	"github.com/switchyard/switchyard/internal/ticktest"
	"github.com/switchyard/switchyard/peer"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

var secret = []byte("0123456789abcdef-cluster")

// tnode is one node's peer transport in a test.
type tnode struct {
	*peer.Transport
	addr string // where its server listens; "" when it serves nothing
	reg  *prometheus.Registry
	stop func() // closes the transport; the end of the test does too
}

// startNode builds node's transport with the test's secret and limits,
// fast retries and no known peers, tweaked by tweak; serves it on listen
// unless listen is ""; and starts it with rcv unless rcv is nil.
func startNode(t testing.TB, node, listen string, rcv core.Receiver, tweak func(*peer.Config)) tnode {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := peer.Config{
		Node: node, Secret: secret, MaxMessageBytes: 1 << 20, MaxConcurrentStreams: 100, MaxReconnectDelay: 50 * time.Millisecond,
		Addr:           func(string) (string, bool) { return "", false },
		AttemptTimeout: 10 * time.Second, RetryMin: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond,
		Metrics: peer.NewMetrics(reg),
		Logger:  slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})).With("node", node),
	}
	if tweak != nil {
		tweak(&cfg)
	}
	tr, err := peer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	n := tnode{Transport: tr, reg: reg}
	done := make(chan struct{})
	if listen == "" {
		close(done)
	} else {
		ln, err := net.Listen("tcp", listen)
		if err != nil {
			_ = tr.Close()
			t.Fatal(err)
		}
		n.addr = ln.Addr().String()
		go func() {
			defer close(done)
			if err := tr.Serve(ln); err != nil {
				t.Errorf("serve: %v", err)
			}
		}()
	}
	var once sync.Once
	n.stop = func() { once.Do(func() { _ = tr.Close(); <-done }) }
	t.Cleanup(n.stop)
	if rcv != nil {
		tr.Start(rcv)
	}
	return n
}

// startServer runs node's peer server on a loopback port, not routing.
func startServer(t *testing.T, node string) tnode {
	t.Helper()
	return startServerOn(t, "127.0.0.1:0", node, nil)
}

// startServerOn runs node's peer server on addr, routing to rcv (nil: not
// yet).
func startServerOn(t *testing.T, addr, node string, rcv core.Receiver) tnode {
	t.Helper()
	return startNode(t, node, addr, rcv, nil)
}

func newClient(t *testing.T, node string, secret []byte) *peer.Client {
	t.Helper()
	c := peer.NewClient(peer.ClientConfig{Node: node, Secret: secret, MaxMessageBytes: 1 << 20})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// runTracker runs a Tracker of cfg until the test ends.
func runTracker(t *testing.T, cfg peer.TrackerConfig) *peer.Tracker {
	t.Helper()
	tr, err := peer.NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { tr.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	return tr
}

// rawClient is node a's client of b's peer service, for a test that
// speaks the wire protocol itself, and a context that bounds its calls.
func rawClient(t *testing.T, b tnode) (pb.PeerServiceClient, context.Context) {
	t.Helper()
	cc, err := newClient(t, "a", secret).Conn("b", b.addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return pb.NewPeerServiceClient(cc), ctx
}

// wantCounters fails t for each unlabelled metric in want whose value in reg
// is not the one given.
func wantCounters(t *testing.T, reg *prometheus.Registry, want map[string]float64) {
	t.Helper()
	for name, w := range want {
		if got := counter(t, reg, name, nil); got != w {
			t.Errorf("%s = %v, want %v", name, got, w)
		}
	}
}

// counter is the value of the first series of counter or gauge name in
// reg whose labels include labels; 0 when there is none (a vector's series
// appears with its first use).
func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	v, _ := promtest.Value(t, reg, name, labels)
	return v
}

// series is the number of series of name in reg.
func series(t *testing.T, reg *prometheus.Registry, name string) int {
	t.Helper()
	n, err := testutil.GatherAndCount(reg, name)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestNewRefusesAShortSecret(t *testing.T) {
	_, err := peer.New(peer.Config{Node: "a", Secret: []byte("short"), Addr: func(string) (string, bool) { return "", false }})
	coretest.WantConfigError(t, err, "cluster-secret")
}

// dialPeer is a PeerService client that passes the cluster handshake as
// node with key, to server at addr, and adds nothing to its calls (no
// protocol version: a call names its own).
func dialPeer(t *testing.T, addr, node, server string, key []byte) pb.PeerServiceClient {
	t.Helper()
	return dial(t, addr, peer.Credentials(peer.CredentialsConfig{Secret: key, Node: node, Peer: server}))
}

// dialBare is a PeerService client without the cluster handshake: plain
// gRPC, as anyone who reaches the port could dial.
func dialBare(t *testing.T, addr string) pb.PeerServiceClient {
	t.Helper()
	return dial(t, addr, insecure.NewCredentials())
}

func dial(t *testing.T, addr string, creds credentials.TransportCredentials) pb.PeerServiceClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return pb.NewPeerServiceClient(cc)
}

func TestClientAfterClose(t *testing.T) {
	c := peer.NewClient(peer.ClientConfig{Node: "a", Secret: secret, MaxMessageBytes: 1 << 20})
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Ping(context.Background(), "b", "127.0.0.1:1"); err != peer.ErrClosed {
		t.Fatalf("got %v, want ErrClosed", err)
	}
}

// fakeView is a catalog view the test edits.
type fakeView struct {
	mu    sync.Mutex
	nodes []core.NodeInfo
}

func (v *fakeView) Nodes() []core.NodeInfo {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]core.NodeInfo(nil), v.nodes...)
}

func (v *fakeView) set(nodes ...core.NodeInfo) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.nodes = nodes
}

// waitFor polls cond until it holds, failing the test after timeout.
var waitFor = ticktest.WaitFor

// A peer whose server stops answering turns spare after Threshold missed
// pings; a peer that keeps answering stays as its record says; a node whose
// record is gone is not listed; a node that moved starts afresh. Both
// peers are tied to this node by the catalog (Related), so both are
// pinged every round.
func TestTrackerTurnsSilentPeersSpare(t *testing.T) {
	b, c := startServer(t, "b"), startServer(t, "c")
	view := &fakeView{}
	view.set(
		core.NodeInfo{ID: "a", PeerAddr: "127.0.0.1:1", State: core.StateOnline}, // self: never pinged
		core.NodeInfo{ID: "b", PeerAddr: b.addr, State: core.StateOnline},
		core.NodeInfo{ID: "c", PeerAddr: c.addr, State: core.StateOnline},
		core.NodeInfo{ID: "d", State: core.StateInProgress}, // no peer address yet
	)
	reg := prometheus.NewRegistry()
	const interval, threshold = 50 * time.Millisecond, 3
	tr := runTracker(t, peer.TrackerConfig{
		Self: "a", Interval: interval, Threshold: threshold, View: view,
		Client: newClient(t, "a", secret), Metrics: peer.NewMetrics(reg),
		Related: func() map[string]bool { return map[string]bool{"b": true, "c": true} },
	})

	waitFor(t, 5*time.Second, "b pinged", func() bool {
		return counter(t, b.reg, "switchyard_peer_messages_total", map[string]string{"kind": "ping"}) >= 2
	})
	want := map[string]core.PeerState{"a": core.StateOnline, "b": core.StateOnline, "c": core.StateOnline, "d": core.StateInProgress}
	if got := tr.States(); !equal(got, want) {
		t.Fatalf("states = %v, want %v", got, want)
	}

	c.stop()
	start := time.Now()
	waitFor(t, 10*time.Second, "c spare", func() bool { return tr.States()["c"] == core.StateSpare })
	t.Logf("c spare after %s (threshold x interval = %s)", time.Since(start), threshold*interval)
	if got := tr.States()["b"]; got != core.StateOnline {
		t.Errorf("b = %s while it answers, want online", got)
	}
	waitFor(t, 5*time.Second, "spare in metrics", func() bool {
		return counter(t, reg, "switchyard_peer_state", map[string]string{"node": "c", "state": "spare"}) == 1
	})
	if got := counter(t, reg, "switchyard_peer_state", map[string]string{"node": "c", "state": "online"}); got != 0 {
		t.Errorf("c online gauge = %v, want 0", got)
	}

	// c comes back on another port and republishes: its misses were
	// counted against the old address, so it is online again at once.
	c2 := startServer(t, "c")
	view.set(
		core.NodeInfo{ID: "a", PeerAddr: "127.0.0.1:1", State: core.StateOnline},
		core.NodeInfo{ID: "c", PeerAddr: c2.addr, State: core.StateOnline},
	)
	if got := tr.States(); !equal(got, map[string]core.PeerState{"a": core.StateOnline, "c": core.StateOnline}) {
		t.Fatalf("after b left and c moved: states = %v", got)
	}
	waitFor(t, 5*time.Second, "b gone from metrics", func() bool {
		return series(t, reg, "switchyard_peer_state") == 2*4 // two nodes, four states each
	})
}

// A peer is suspected from its first missed ping, long before it is spare,
// and from the transport's word (Suspect) at once; an answered ping clears
// either, and OnChange hears of each change.
func TestTrackerSuspectsBeforeSpare(t *testing.T) {
	b := startServer(t, "b")
	view := &fakeView{}
	view.set(core.NodeInfo{ID: "b", PeerAddr: b.addr, State: core.StateOnline})
	const interval, threshold = 50 * time.Millisecond, 20
	var changes atomic.Int64
	tr := runTracker(t, peer.TrackerConfig{
		Self: "a", Interval: interval, Threshold: threshold, View: view,
		Client: newClient(t, "a", secret), OnChange: func() { changes.Add(1) },
		Related: func() map[string]bool { return map[string]bool{"b": true} },
	})
	nb := peer.NodeAddr{ID: "b", PeerAddr: b.addr}
	waitFor(t, 5*time.Second, "b pinged", func() bool {
		return counter(t, b.reg, "switchyard_peer_messages_total", map[string]string{"kind": "ping"}) >= 1
	})
	if tr.Suspected(nb) || tr.Suspected(peer.NodeAddr{ID: "a"}) {
		t.Fatal("a peer that answers (or this node) is suspected")
	}

	// The transport's word: suspected at once, and cleared by the next
	// answered ping.
	before := changes.Load()
	tr.Suspect("b")
	if !tr.Suspected(nb) || !tr.SuspectedNodes()["b"] || tr.Spare(nb) {
		t.Fatalf("after Suspect: suspected %v, spare %v; want suspected, not spare", tr.Suspected(nb), tr.Spare(nb))
	}
	if changes.Load() == before {
		t.Error("Suspect did not call OnChange")
	}
	waitFor(t, 5*time.Second, "an answered ping to clear the suspicion", func() bool { return !tr.Suspected(nb) })

	// A silent peer: suspected after one missed ping, spare only after
	// Threshold.
	b.stop()
	start := time.Now()
	waitFor(t, 5*time.Second, "b suspected", func() bool { return tr.Suspected(nb) })
	t.Logf("b suspected after %s (interval %s)", time.Since(start), interval)
	if tr.Spare(nb) || tr.States()["b"] != core.StateOnline {
		t.Fatalf("b spare (%v, state %s) after one missed ping; threshold is %d", tr.Spare(nb), tr.States()["b"], threshold)
	}
}

// A peer this node has no business with is pinged until its address has
// answered once, then left to its lease: pinged again only while there is
// traffic with it (Activity) or while it is in doubt (the transport's
// Suspect), which is how its silence is still found.
func TestTrackerPingsOnlyPeersItWorksWith(t *testing.T) {
	b, c := startServer(t, "b"), startServer(t, "c")
	view := &fakeView{}
	view.set(
		core.NodeInfo{ID: "b", PeerAddr: b.addr, State: core.StateOnline},
		core.NodeInfo{ID: "c", PeerAddr: c.addr, State: core.StateOnline},
	)
	const interval, threshold = 50 * time.Millisecond, 3
	reg := prometheus.NewRegistry()
	metrics := peer.NewMetrics(reg)
	tr := runTracker(t, peer.TrackerConfig{
		Self: "a", Interval: interval, Threshold: threshold, View: view,
		Client: newClient(t, "a", secret), Metrics: metrics,
	})
	pings := func(s tnode) float64 {
		return counter(t, s.reg, "switchyard_peer_messages_total", map[string]string{"kind": "ping"})
	}
	waitFor(t, 5*time.Second, "b and c pinged once", func() bool { return pings(b) >= 1 && pings(c) >= 1 })
	waitFor(t, 5*time.Second, "no peer left to ping", func() bool { return counter(t, reg, "switchyard_peer_pinged_nodes", nil) == 0 })
	pb, pc := pings(b), pings(c)
	time.Sleep(20 * interval)
	if pings(b) != pb || pings(c) != pc {
		t.Fatalf("idle peers pinged again: b %v → %v, c %v → %v", pb, pings(b), pc, pings(c))
	}

	// Traffic with b: b is pinged every round again; c is not.
	stopTraffic := make(chan struct{})
	var tg sync.WaitGroup
	tg.Go(func() {
		for {
			metrics.Activity().Mark("b")
			select {
			case <-stopTraffic:
				return
			case <-time.After(interval):
			}
		}
	})
	waitFor(t, 5*time.Second, "b pinged with traffic", func() bool { return pings(b) >= pb+3 })
	close(stopTraffic)
	tg.Wait()
	if pings(c) != pc {
		t.Errorf("c pinged without traffic: %v → %v", pc, pings(c))
	}

	// c goes silent: its record stands, nothing here pings it, so it stays
	// as its record says until the transport's word puts it in doubt.
	c.stop()
	time.Sleep(5 * interval)
	if got := tr.States()["c"]; got != core.StateOnline {
		t.Fatalf("c = %s with no ping sent to it, want online (its record)", got)
	}
	tr.Suspect("c")
	waitFor(t, 5*time.Second, "c spare once in doubt", func() bool { return tr.States()["c"] == core.StateSpare })
}

// A connection that carries nothing for IdleTimeout goes idle (its
// transport closed), and the next call dials again and is answered.
func TestClientIdleConnectionCloses(t *testing.T) {
	b := startServer(t, "b")
	c := peer.NewClient(peer.ClientConfig{Node: "a", Secret: secret, MaxMessageBytes: 1 << 20, IdleTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	if _, err := c.Ping(context.Background(), "b", b.addr); err != nil {
		t.Fatal(err)
	}
	cc, err := c.Conn("b", b.addr)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the connection idle", func() bool { return cc.GetState() == connectivity.Idle })
	if got, err := c.Ping(context.Background(), "b", b.addr); err != nil || got != "b" {
		t.Fatalf("ping after idle: %q, %v", got, err)
	}
}

func TestTrackerSuspectAfterAtMostThreshold(t *testing.T) {
	_, err := peer.NewTracker(peer.TrackerConfig{Self: "a", Interval: time.Second, Threshold: 2, SuspectAfter: 3,
		View: &fakeView{}, Client: newClient(t, "a", secret)})
	coretest.WantConfigError(t, err, "peer-suspect-after")
}

// An address that answers as another node is a miss: the node it named is
// not there.
func TestTrackerRefusesAnImpostorAddress(t *testing.T) {
	b := startServer(t, "b")
	view := &fakeView{}
	view.set(core.NodeInfo{ID: "c", PeerAddr: b.addr, State: core.StateOnline})
	tr := runTracker(t, peer.TrackerConfig{Self: "a", Interval: 20 * time.Millisecond, Threshold: 2, View: view, Client: newClient(t, "a", secret)})
	waitFor(t, 5*time.Second, "c spare", func() bool { return tr.States()["c"] == core.StateSpare })
}

func TestNewTrackerValidates(t *testing.T) {
	v, c := &fakeView{}, newClient(t, "a", secret)
	for _, tc := range []struct {
		field string
		cfg   peer.TrackerConfig
	}{
		{"peer-heartbeat-interval", peer.TrackerConfig{Threshold: 1, View: v, Client: c}},
		{"peer-failure-threshold", peer.TrackerConfig{Interval: time.Second, View: v, Client: c}},
	} {
		_, err := peer.NewTracker(tc.cfg)
		coretest.WantConfigError(t, err, tc.field)
	}
}

func equal(a, b map[string]core.PeerState) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
