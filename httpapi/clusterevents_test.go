package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/apierr"
	"github.com/switchyard/switchyard/core"
)

// fakeCluster is a ClusterView the test changes.
type fakeCluster struct {
	mu        sync.Mutex
	nodes     []core.NodeInfo
	consumers map[string][]core.ConsumerInfo
}

var _ core.ClusterView = (*fakeCluster)(nil)

func (f *fakeCluster) Nodes() []core.NodeInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]core.NodeInfo(nil), f.nodes...)
}

func (f *fakeCluster) Queues() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for q := range f.consumers {
		out = append(out, q)
	}
	return out
}

func (f *fakeCluster) Consumers(q string) []core.ConsumerInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.consumers[q]
}

func (f *fakeCluster) Dispatch(string) (core.DispatchInfo, bool) { return core.DispatchInfo{}, false }

func (f *fakeCluster) addNode(n core.NodeInfo) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nodes = append(f.nodes, n)
}

// clusterFixture is a node's HTTP API over a real engine, with a cluster
// view and metrics the test controls, served on loopback.
type clusterFixture struct {
	cluster   *fakeCluster
	fallbacks prometheus.Counter
	messages  *prometheus.CounterVec
	srv       *httptest.Server
	// handled receives once per request the handler finished.
	handled chan struct{}
}

func newClusterFixture(t *testing.T, mutate func(*Config)) *clusterFixture {
	t.Helper()
	reg := prometheus.NewRegistry()
	ecfg := core.DefaultConfig()
	ecfg.Node, ecfg.Registerer = "n1", reg
	fx := &clusterFixture{
		cluster: &fakeCluster{
			nodes: []core.NodeInfo{{ID: "n1", Zone: "z1", State: core.StateOnline, HTTPAddr: "127.0.0.1:1"}},
			consumers: map[string][]core.ConsumerInfo{"demo": {{
				ID: "c1", Queue: "demo", Node: "n1", Name: "w1", Capabilities: core.Capabilities{"model": {"demo"}}, Concurrency: 4,
			}}},
		},
		// The peer package's counters, by name: the view reads names.
		fallbacks: prometheus.NewCounter(prometheus.CounterOpts{Name: "switchyard_peer_unary_fallbacks_total"}),
		messages:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "switchyard_peer_messages_total"}, []string{"kind"}),
		handled:   make(chan struct{}, 16),
	}
	reg.MustRegister(fx.fallbacks, fx.messages)
	cfg := DefaultConfig()
	cfg.Cluster, cfg.Gatherer = fx.cluster, reg
	cfg.ClusterEventsInterval = 10 * time.Millisecond
	if mutate != nil {
		mutate(&cfg)
	}
	s, _ := newServerWith(t, ecfg, cfg, reg)
	fx.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { fx.handled <- struct{}{} }()
		s.ServeHTTP(w, r)
	}))
	t.Cleanup(fx.srv.Close)
	return fx
}

// block is one SSE message as it is on the wire: its lines.
type block []string

func (b block) field(name string) string {
	for _, l := range b {
		if v, ok := strings.CutPrefix(l, name+": "); ok {
			return v
		}
	}
	return ""
}

func (b block) comment() bool { return len(b) == 1 && strings.HasPrefix(b[0], ":") }

// open starts the stream and returns its blocks as they arrive; the
// channel closes when the body ends. cancel leaves.
func (fx *clusterFixture) open(t *testing.T) (blocks <-chan block, res *http.Response, cancel func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fx.srv.URL+"/v1/cluster/events", nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET /v1/cluster/events: %v", err)
	}
	ch := make(chan block, 64)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(ch)
		br := bufio.NewReader(res.Body)
		var cur block
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			line = strings.TrimSuffix(line, "\n")
			if line == "" {
				ch <- cur
				cur = nil
				continue
			}
			cur = append(cur, line)
		}
	})
	t.Cleanup(func() {
		cancel()
		res.Body.Close()
		wg.Wait()
	})
	return ch, res, cancel
}

func next(t *testing.T, blocks <-chan block, d time.Duration) (block, bool) {
	t.Helper()
	select {
	case b, ok := <-blocks:
		return b, ok
	case <-time.After(d):
		t.Fatalf("no message within %s", d)
		return nil, false
	}
}

func snapshotOf(t *testing.T, b block) ClusterSnapshot {
	t.Helper()
	if b.field("event") != "snapshot" {
		t.Fatalf("message %q is not a snapshot", b)
	}
	var s ClusterSnapshot
	if err := json.Unmarshal([]byte(b.field("data")), &s); err != nil {
		t.Fatalf("snapshot data: %v", err)
	}
	return s
}

// The stream opens with a snapshot: the shapes of the cluster and queue
// views, and the counters from the node's registry.
func TestClusterEventsSnapshot(t *testing.T) {
	fx := newClusterFixture(t, nil)
	fx.fallbacks.Add(2)
	fx.messages.WithLabelValues("forward").Add(3)
	fx.messages.WithLabelValues("reply").Add(4)
	blocks, res, _ := fx.open(t)
	if ct := res.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	if cc := res.Header.Get("Cache-Control"); cc != "no-store" {
		t.Errorf("Cache-Control %q", cc)
	}
	b, _ := next(t, blocks, 5*time.Second)
	if b.field("retry") != "1000" {
		t.Errorf("first message %q has no retry: 1000", b)
	}
	if b.field("id") != "" {
		t.Errorf("snapshot has an id (%q): there is nothing to resume", b.field("id"))
	}
	s := snapshotOf(t, b)
	if s.Node != "n1" || len(s.Nodes) != 1 || s.Nodes[0].ID != "n1" || s.Nodes[0].Zone != "z1" || s.Nodes[0].State != "online" {
		t.Errorf("node %q, nodes %+v", s.Node, s.Nodes)
	}
	if len(s.Queues) != 1 || s.Queues[0].Name != "demo" || len(s.Queues[0].Consumers) != 1 {
		t.Fatalf("queues %+v", s.Queues)
	}
	if c := s.Queues[0].Consumers[0]; c.Name != "w1" || c.Concurrency != 4 || strings.Join(c.Capabilities, ",") != "model=demo" {
		t.Errorf("consumer %+v", c)
	}
	c := s.Counters
	if c.UnaryFallbacks != 2 || c.PeerMessages["forward"] != 3 || c.PeerMessages["reply"] != 4 {
		t.Errorf("peer counters: fallbacks %v, messages %v", c.UnaryFallbacks, c.PeerMessages)
	}
	// The engine's and the streams' own series, by their labels.
	if _, ok := c.Jobs["completed"]; !ok {
		t.Errorf("jobs by outcome %v: no completed series", c.Jobs)
	}
	if _, ok := c.StreamsOpen["sse"]; !ok {
		t.Errorf("streams open %v: no sse series", c.StreamsOpen)
	}
}

// Nothing changed: only heartbeats. A change: one snapshot with it, within
// a few intervals.
func TestClusterEventsOnChange(t *testing.T) {
	fx := newClusterFixture(t, func(c *Config) { c.Stream.Heartbeat = 80 * time.Millisecond })
	blocks, _, _ := fx.open(t)
	first := snapshotOf(t, mustNext(t, blocks))
	if first.Load == nil || first.Load.JobsPerSecond != nil {
		t.Fatalf("first load %+v: want the figures, and no rate before a second reading", first.Load)
	}
	// One interval later, the second reading gives the first rates.
	if s := snapshotOf(t, mustNext(t, blocks)); s.Load == nil || s.Load.JobsPerSecond == nil {
		t.Fatalf("second load %+v: want the first rates", s.Load)
	}
	// A few heartbeat periods with no change: heartbeats only (the
	// interval is 10ms, so a snapshot per tick would show).
	deadline := time.Now().Add(300 * time.Millisecond)
	beats := 0
	for time.Now().Before(deadline) {
		b := mustNext(t, blocks)
		if !b.comment() {
			t.Fatalf("unchanged cluster, yet %q", b)
		}
		beats++
	}
	if beats < 2 {
		t.Errorf("%d heartbeats in 300ms with an 80ms heartbeat", beats)
	}
	fx.cluster.addNode(core.NodeInfo{ID: "n2", Zone: "z2", State: core.StateInProgress})
	for {
		b := mustNext(t, blocks)
		if b.comment() {
			continue
		}
		s := snapshotOf(t, b)
		if len(s.Nodes) != len(first.Nodes)+1 || s.Nodes[1].ID != "n2" || s.Nodes[1].State != "in_progress" {
			t.Fatalf("after adding n2: %+v", s.Nodes)
		}
		break
	}
	// A counter is a change too.
	fx.fallbacks.Inc()
	for {
		b := mustNext(t, blocks)
		if !b.comment() {
			if got := snapshotOf(t, b).Counters.UnaryFallbacks; got != 1 {
				t.Fatalf("unary fallbacks %v, want 1", got)
			}
			break
		}
	}
}

func mustNext(t *testing.T, blocks <-chan block) block {
	t.Helper()
	b, ok := next(t, blocks, 5*time.Second)
	if !ok {
		t.Fatal("the stream ended")
	}
	return b
}

// The handler returns when its client leaves.
func TestClusterEventsClientLeaves(t *testing.T) {
	fx := newClusterFixture(t, nil)
	blocks, _, cancel := fx.open(t)
	mustNext(t, blocks)
	cancel()
	select {
	case <-fx.handled:
	case <-time.After(5 * time.Second):
		t.Fatal("the handler is still running 5s after its client left")
	}
}

// The stream ends by itself after the stream max duration (an EventSource
// reconnects and gets a fresh snapshot).
func TestClusterEventsMaxDuration(t *testing.T) {
	fx := newClusterFixture(t, func(c *Config) {
		c.Stream.MaxDuration, c.Stream.Idle, c.Stream.Heartbeat = 300*time.Millisecond, 200*time.Millisecond, 50*time.Millisecond
		c.Stream.Setup, c.Stream.WriteTimeout = 100*time.Millisecond, 100*time.Millisecond
	})
	start := time.Now()
	blocks, _, _ := fx.open(t)
	for {
		if _, ok := next(t, blocks, 5*time.Second); !ok {
			break
		}
	}
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Errorf("the stream ended after %s, before its max duration", d)
	}
	select {
	case <-fx.handled:
	case <-time.After(5 * time.Second):
		t.Fatal("the body ended but the handler did not return")
	}
}

// The page and its assets are routed, and a wrong asset path is a problem
// like any unknown route.
func TestWebRoutes(t *testing.T) {
	fx := newClusterFixture(t, nil)
	res, err := http.Get(fx.srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != "text/html; charset=utf-8" || res.Header.Get("Content-Security-Policy") == "" {
		t.Fatalf("GET /: %d %q, CSP %q", res.StatusCode, res.Header.Get("Content-Type"), res.Header.Get("Content-Security-Policy"))
	}
	m := regexp.MustCompile(`src="(/ui/[0-9a-f]+/app\.js)"`).FindStringSubmatch(string(body))
	if m == nil {
		t.Fatalf("no app.js in the page")
	}
	app := m[1]
	res, err = http.Get(fx.srv.URL + app)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != "text/javascript; charset=utf-8" {
		t.Errorf("GET %s: %d %q", app, res.StatusCode, res.Header.Get("Content-Type"))
	}
	res, err = http.Get(fx.srv.URL + "/ui/0000000000000000/app.js")
	if err != nil {
		t.Fatal(err)
	}
	var p apierr.Problem
	_ = json.NewDecoder(res.Body).Decode(&p)
	res.Body.Close()
	if res.StatusCode != http.StatusNotFound || p.Code != string(core.CodeNotFound) {
		t.Errorf("another build's asset: %d %+v, want 404 not_found", res.StatusCode, p)
	}
	req, _ := http.NewRequest(http.MethodPost, fx.srv.URL+"/", nil)
	res, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /: %d, want 405", res.StatusCode)
	}
}

// The load: this node's figures and its peers', read once per interval
// however many streams watch, with rates from two readings.
func TestClusterEventsLoad(t *testing.T) {
	var mu sync.Mutex
	calls := 0
	peers := func(ctx context.Context) []core.NodeFigures {
		if _, ok := ctx.Deadline(); !ok {
			t.Error("peers asked without a deadline")
		}
		mu.Lock()
		defer mu.Unlock()
		calls++
		return []core.NodeFigures{
			{
				// n2 ends 5 jobs a reading and holds the queue.
				Node: "n2", At: time.Now(), JobsEnded: map[string]uint64{"completed": uint64(5 * calls)}, StreamsOpen: 7,
				Queues: []core.QueueStat{{Name: "demo", Depth: 2, Bound: 4}},
			},
			{Node: "n3", Err: "no answer: deadline exceeded"},
		}
	}
	const interval = 100 * time.Millisecond
	fx := newClusterFixture(t, func(c *Config) {
		c.ClusterEventsInterval, c.PeerFigures = interval, peers
	})
	start := time.Now()
	a, _, _ := fx.open(t)
	b, _, _ := fx.open(t)
	var last ClusterSnapshot
	for _, blocks := range []<-chan block{a, b} {
		for {
			s := snapshotOf(t, mustNext(t, blocks))
			if s.Load != nil && s.Load.JobsPerSecond != nil {
				last = s
				break
			}
		}
	}
	l := last.Load
	if len(l.Nodes) != 3 || l.Nodes[0].Node != "n1" || l.Nodes[1].Node != "n2" || l.Nodes[2].Node != "n3" {
		t.Fatalf("nodes %+v: want n1, n2 and n3", l.Nodes)
	}
	if n := l.Nodes[1]; n.StreamsOpen != 7 || n.JobsPerSecond == nil || *n.JobsPerSecond <= 0 || n.Error != "" {
		t.Errorf("n2 %+v: want 7 streams and a rate", n)
	}
	if n := l.Nodes[2]; n.Error == "" || n.JobsPerSecond != nil {
		t.Errorf("n3 %+v: want its error and no rate", n)
	}
	if r := l.JobsPerSecond["completed"]; r <= 0 || r > 5/(interval*9/10).Seconds()+0.01 {
		t.Errorf("%v completed/s: want 5 a reading, readings at least %s apart", r, interval*9/10)
	}
	if len(l.Queues) != 1 || l.Queues[0] != (QueueLoad{Name: "demo", InFlight: 4, Depth: 2}) {
		t.Errorf("queues %+v", l.Queues)
	}
	// Two streams, one sampler: one reading per 90% of an interval at most.
	mu.Lock()
	got := calls
	mu.Unlock()
	if most := int(time.Since(start)/(interval*9/10)) + 1; got > most {
		t.Errorf("%d readings of the peers in %s by two streams: the sampler is not shared (want <= %d)", got, time.Since(start), most)
	}
}

// A change of the catalog goes out at once, not at the next look.
func TestClusterEventsCatalogChange(t *testing.T) {
	changes := make(chan struct{}, 1)
	var unsubscribed sync.WaitGroup
	unsubscribed.Add(1)
	fx := newClusterFixture(t, func(c *Config) {
		c.ClusterEventsInterval = time.Hour // the ticks alone would never show it
		c.ClusterChanges = func() (<-chan struct{}, func()) { return changes, unsubscribed.Done }
	})
	blocks, _, cancel := fx.open(t)
	mustNext(t, blocks)
	fx.cluster.addNode(core.NodeInfo{ID: "n2", State: core.StateDraining})
	start := time.Now()
	changes <- struct{}{}
	for {
		b := mustNext(t, blocks)
		if b.comment() {
			continue
		}
		s := snapshotOf(t, b)
		if len(s.Nodes) != 2 || s.Nodes[1].State != "draining" {
			t.Fatalf("after the change: %+v", s.Nodes)
		}
		break
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the change took %s to go out", d)
	}
	cancel()
	done := make(chan struct{})
	go func() { unsubscribed.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the stream did not unsubscribe from the catalog's changes when its client left")
	}
}
