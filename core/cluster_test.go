package core_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/internal/coretest"
)

// This file runs several engines in one process, joined by fakeNet: an
// in-memory core.Cluster and core.Transport that delivers peer messages on a goroutine of its
// own, in order per (from, to) pair, and records every message so a test
// can assert exactly which ones flowed.

// link is one direction between two nodes: messages on it arrive in order.
type link struct{ from, to string }

// sentMsg is one peer message as the fake saw it.
type sentMsg struct {
	Kind     core.MessageKind
	From, To string
	// Call is set for a synchronous Transport.Forward (Kind is MsgForward).
	Call bool
	// Dropped is set for a message the test's drop filter discarded.
	Dropped bool
	Msg     core.Message
}

func (s sentMsg) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s>%s", s.Kind, s.From, s.To)
	switch {
	case s.Call:
		b.WriteString(" (call)")
	case s.Msg.Accepted:
		b.WriteString(" accepted")
	case s.Msg.Output != nil:
		b.WriteString(" output")
	case s.Msg.End != nil:
		fmt.Fprintf(&b, " end(%s)", s.Msg.End.Code)
	}
	if s.Dropped {
		b.WriteString(" [dropped]")
	}
	return b.String()
}

// Gen is the generation a logged message carries.
func (s sentMsg) Gen() uint64 { return s.Msg.Gen }

// fakeNet is the cluster the engines of one test share: the catalog view
// (dispatch records, which nodes are routable and alive, each node's lease)
// and the message transport.
type fakeNet struct {
	t   *testing.T
	cat *coretest.Catalog

	mu       sync.Mutex
	cond     *sync.Cond
	nodes    map[string]*clusterNode
	dispatch map[string]string // queue → dispatcher node
	// epochs is each queue's record's epoch, bumped from revision (shared
	// by every queue, as etcd's revision is) on each write of dispatch.
	epochs   map[string]uint64
	revision uint64
	routable map[string]bool
	// suspected nodes are routable to nobody but still serve (their
	// consumers count for the capability check).
	suspected map[string]bool
	alive     map[string]bool
	lease     map[string]bool
	// queued holds the undelivered messages of each link; ready lists the
	// links with messages, in the order the deliverer serves them.
	queued map[link][]core.Message
	ready  []link
	held   map[link]bool
	busy   int
	stop   bool
	done   chan struct{}

	log      []sentMsg
	claims   []string // "node queue" per ClaimConsumer
	releases []string // "node queue" per ReleaseQueue
	resigned []string // nodes that called Resign (drain_test.go)
	// resignErr, when set, is what Resign returns, changing nothing.
	resignErr error
	// dupForward makes Forward hand the delivery over twice, as a retry
	// after a lost response would.
	dupForward bool
	// drop, when set, discards the messages it returns true for (they are
	// still logged, marked Dropped).
	drop func(s sentMsg) bool
	// silentForward, when set, makes a Forward to a node it returns true
	// for get no answer: it waits until its context ends or the node is
	// dead (then it fails as the peer transport does: node not in the
	// catalog), as a Forward to a paused or killed node does.
	silentForward func(node string) bool
	// replacedForward, when set, makes a Forward to a node it returns true
	// for fail as the peer transport fails one meant for an incarnation of
	// the node that was replaced (core.ErrNodeReplaced). Called without
	// the fake's lock.
	replacedForward func(node string) bool
	// onForward, when set, is called with each Forward's context and
	// node as it starts, without the fake's lock.
	onForward func(ctx context.Context, node string)
	// electErr, when set, is what Dispatcher returns instead of electing
	// while it returns non-nil (silence.go's tests: a record naming a node
	// that is not routable and cannot be taken over yet).
	electErr func(queue string) error
}

// threeNodes is the cluster most tests run on: n1 takes the jobs (the
// ingress), n2 is queue q's dispatcher, n3 is a third node for a second
// worker or a takeover. adjust[i], when given and not nil, adjusts the
// configuration of node n(i+1), as fakeNet.add's adjust does.
func threeNodes(t *testing.T, adjust ...func(*core.Config)) (*fakeNet, *clusterNode, *clusterNode, *clusterNode) {
	net, n1, n2 := twoNodes(t, adjust...)
	return net, n1, n2, net.add("n3", nth(adjust, 2))
}

// twoNodes is threeNodes without n3: n1 the ingress, n2 queue q's
// dispatcher.
func twoNodes(t *testing.T, adjust ...func(*core.Config)) (*fakeNet, *clusterNode, *clusterNode) {
	net := newFakeNet(t)
	n1, n2 := net.add("n1", nth(adjust, 0)), net.add("n2", nth(adjust, 1))
	net.setDispatcher("q", "n2")
	return net, n1, n2
}

// nth is adjust[i], or nil when adjust has no i-th.
func nth(adjust []func(*core.Config), i int) func(*core.Config) {
	if i < len(adjust) {
		return adjust[i]
	}
	return nil
}

// offerOne attaches worker "a" (one credit, queue q) on host, submits a
// job at ingress and waits for the job's offer to the worker.
func offerOne(t *testing.T, ingress, host *clusterNode) (*core.Worker, *fakeConn, *core.Job, core.Offer) {
	t.Helper()
	a, fa := host.worker("q", "a", 1)
	j := ingress.submit("q", env(clusterTTL))
	return a, fa, j, waitOffers(t, fa, j.ID, 1)[0]
}

// quietAndLoud submits two jobs at ingress, both offered to worker w: the
// quiet one accepted with no output, the loud one with an output the
// ingress has seen. They are the two fates of a lost worker's jobs (run
// again, or worker_lost).
func quietAndLoud(t *testing.T, ingress *clusterNode, w *core.Worker, fw *fakeConn) (quiet, loud *core.Job, oq, ol core.Offer) {
	t.Helper()
	quiet = ingress.submit("q", env(clusterTTL))
	loud = ingress.submit("q", env(clusterTTL))
	oq = waitOffers(t, fw, quiet.ID, 1)[0]
	ol = waitOffers(t, fw, loud.ID, 1)[0]
	w.Accept(quiet.ID, oq.Gen)
	w.Output(loud.ID, ol.Gen, []byte(`"partial"`))
	waitFor(t, 5*time.Second, "the output at the ingress", func() bool { return ingress.view(loud.ID).Outputs == 1 })
	return quiet, loud, oq, ol
}

func newFakeNet(t *testing.T) *fakeNet {
	t.Helper()
	n := &fakeNet{
		t:         t,
		cat:       &coretest.Catalog{},
		nodes:     map[string]*clusterNode{},
		dispatch:  map[string]string{},
		epochs:    map[string]uint64{},
		routable:  map[string]bool{},
		suspected: map[string]bool{},
		alive:     map[string]bool{},
		lease:     map[string]bool{},
		queued:    map[link][]core.Message{},
		held:      map[link]bool{},
		done:      make(chan struct{}),
	}
	n.cond = sync.NewCond(&n.mu)
	go n.run()
	// Registered first, so it runs last: the engines close (and send their
	// last cancels) while the deliverer still runs.
	t.Cleanup(func() {
		n.mu.Lock()
		n.stop = true
		n.cond.Broadcast()
		n.mu.Unlock()
		<-n.done
	})
	return n
}

// run is the deliverer: one message at a time, links served round-robin, so
// a link's messages arrive in order and different links interleave.
func (n *fakeNet) run() {
	defer close(n.done)
	n.mu.Lock()
	defer n.mu.Unlock()
	for {
		i := -1
		for !n.stop {
			if i = slices.IndexFunc(n.ready, func(l link) bool { return !n.held[l] }); i >= 0 {
				break
			}
			n.cond.Wait()
		}
		if n.stop {
			return
		}
		l := n.ready[i]
		n.ready = slices.Delete(n.ready, i, i+1)
		m := n.queued[l][0]
		n.queued[l] = n.queued[l][1:]
		if len(n.queued[l]) > 0 {
			n.ready = append(n.ready, l)
		}
		target := n.nodes[l.to]
		n.busy++
		n.mu.Unlock()
		if target != nil {
			target.e.HandleMessage(l.from, m)
		}
		n.mu.Lock()
		n.busy--
		n.cond.Broadcast()
	}
}

// settle waits until every message not on a held link has been handled.
func (n *fakeNet) settle() {
	n.t.Helper()
	waitFor(n.t, 5*time.Second, "the network to go quiet", func() bool {
		n.mu.Lock()
		defer n.mu.Unlock()
		if n.busy > 0 {
			return false
		}
		for _, l := range n.ready {
			if !n.held[l] {
				return false
			}
		}
		return true
	})
}

// hold stops delivery on a link until unhold.
func (n *fakeNet) hold(from, to string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.held[link{from, to}] = true
}

func (n *fakeNet) unhold(from, to string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.held, link{from, to})
	n.cond.Broadcast()
}

func (n *fakeNet) setDispatcher(queue, node string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.setDispatcherLocked(queue, node)
}

// setDispatcherLocked writes queue's record ("" deletes it) under the
// next revision, which is its epoch.
func (n *fakeNet) setDispatcherLocked(queue, node string) {
	n.revision++
	if node == "" {
		delete(n.dispatch, queue)
		delete(n.epochs, queue)
		return
	}
	n.dispatch[queue], n.epochs[queue] = node, n.revision
}

// epoch is queue's record's epoch now.
func (n *fakeNet) epoch(queue string) uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.epochs[queue]
}

// setFlag sets node's entry of one of the net's per-node flags (suspected,
// routable, alive, lease) under the net's lock.
func (n *fakeNet) setFlag(flags map[string]bool, node string, v bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	flags[node] = v
}

func (n *fakeNet) setSuspected(node string, v bool) { n.setFlag(n.suspected, node, v) }
func (n *fakeNet) setRoutable(node string, v bool)  { n.setFlag(n.routable, node, v) }
func (n *fakeNet) setAlive(node string, v bool)     { n.setFlag(n.alive, node, v) }
func (n *fakeNet) setLease(node string, v bool)     { n.setFlag(n.lease, node, v) }

// kill proves node dead the way the catalog does: its record (and with it
// every consumer record under its lease) is gone, it is not routable, and
// it has fenced itself.
func (n *fakeNet) kill(node string) {
	n.mu.Lock()
	n.alive[node], n.routable[node], n.lease[node] = false, false, false
	n.mu.Unlock()
	n.cat.Withdraw(func(c core.ConsumerInfo) bool { return c.Node == node })
}

// sent returns every message sent so far, in order.
func (n *fakeNet) sent() []sentMsg {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.log)
}

// sentFor returns the messages about one job.
func (n *fakeNet) sentFor(id string) []sentMsg {
	var out []sentMsg
	for _, s := range n.sent() {
		if s.Msg.JobID == id {
			out = append(out, s)
		}
	}
	return out
}

// wantSent waits for the network to go quiet (settle), then checks that
// the messages about job id were exactly want (as sentMsg.String renders
// them), in order.
func (n *fakeNet) wantSent(t *testing.T, id string, want ...string) {
	t.Helper()
	n.settle()
	var got []string
	for _, s := range n.sentFor(id) {
		got = append(got, s.String())
	}
	if !slices.Equal(got, want) {
		t.Fatalf("messages about %s:\n got  %q\n want %q", id, got, want)
	}
}

// wantForwards checks that the forwards of job id were exactly want (as
// sentMsg.String renders them, with " gen N" after), in order.
func (n *fakeNet) wantForwards(t *testing.T, id string, want ...string) {
	t.Helper()
	var got []string
	for _, s := range n.sentFor(id) {
		if s.Kind == core.MsgForward {
			got = append(got, fmt.Sprintf("%s gen %d", s, s.Gen()))
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("forwards of %s %q, want %q", id, got, want)
	}
}

// clusterNode is one engine of the fake cluster.
type clusterNode struct {
	*harness
	name string
}

// add starts an engine for node name, routable, alive and with a valid
// lease, and closes it when the test ends.
func (n *fakeNet) add(name string, adjust func(*core.Config)) *clusterNode {
	n.t.Helper()
	reg := prometheus.NewRegistry()
	cfg := testConfig(reg)
	fp := &fakePeer{net: n, node: name}
	cfg.Node, cfg.Catalog, cfg.Cluster, cfg.Transport = name, n.cat, fp, fp
	if adjust != nil {
		adjust(&cfg)
	}
	e, err := core.New(cfg)
	if err != nil {
		n.t.Fatalf("core.New(%s): %v", name, err)
	}
	n.t.Cleanup(e.Close)
	cn := &clusterNode{harness: &harness{t: n.t, e: e, reg: reg}, name: name}
	n.mu.Lock()
	n.nodes[name] = cn
	n.routable[name], n.alive[name], n.lease[name] = true, true, true
	n.mu.Unlock()
	return cn
}

// worker registers a worker on queue on this node.
func (c *clusterNode) worker(queue, name string, concurrency int, caps ...string) (*core.Worker, *fakeConn) {
	c.t.Helper()
	fc := &fakeConn{}
	w, err := c.e.AttachWorker(context.Background(), core.WorkerSpec{
		Queue: queue, Name: name, Capabilities: caps, Concurrency: concurrency,
	}, fc)
	if err != nil {
		c.t.Fatalf("AttachWorker on %s: %v", c.name, err)
	}
	return w, fc
}

// waitState waits until the job's view on this (ingress) node is in state.
func (c *clusterNode) waitState(id string, state core.State) core.JobView {
	c.t.Helper()
	var v core.JobView
	waitFor(c.t, 5*time.Second, fmt.Sprintf("job %s on %s to be %s", id, c.name, state), func() bool {
		var err error
		v, err = c.e.View(id)
		return err == nil && v.State == state
	})
	return v
}

// cancelOnWorker cancels job id on this (its ingress) node and waits until
// fc's worker is told.
func (c *clusterNode) cancelOnWorker(t *testing.T, id string, fc *fakeConn) {
	t.Helper()
	if _, err := c.e.Cancel(id, "test"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the cancel on the worker", func() bool { return len(fc.Cancels()) > 0 })
}

// submitDeliveryHeld submits a job at n1 that n2, q's dispatcher in
// threeNodes, binds to a worker on n3, with the delivery held on its way
// from n2 to n3 (net.unhold lets it go).
func submitDeliveryHeld(net *fakeNet, n1 *clusterNode) *core.Job {
	net.hold("n2", "n3")
	j := n1.submit("q", env(clusterTTL))
	net.settle()
	return j
}

// offerAt waits for the one offer of job id that fc's worker gets and
// checks it is of generation gen.
func offerAt(t *testing.T, fc *fakeConn, id string, gen uint64) core.Offer {
	t.Helper()
	o := waitOffers(t, fc, id, 1)[0]
	if o.Gen != gen {
		t.Fatalf("job %s offered with gen %d, want %d", id, o.Gen, gen)
	}
	return o
}

// wantQueue checks this node's dispatcher view of queue q: depth jobs
// waiting and bound jobs bound (anyCount: not checked). why says what the
// test expects of the node at that point.
func (c *clusterNode) wantQueue(t *testing.T, depth, bound int, why string) {
	t.Helper()
	s := c.queueStat("q")
	if (depth != anyCount && s.Depth != depth) || (bound != anyCount && s.Bound != bound) {
		t.Fatalf("%s, %s: queue q %+v, want depth %d, bound %d (%d: any)", c.name, why, s, depth, bound, anyCount)
	}
}

// queueStat returns this node's dispatcher view of queue (zero if none).
func (c *clusterNode) queueStat(queue string) core.QueueStat {
	for _, s := range c.e.QueueStats() {
		if s.Name == queue {
			return s
		}
	}
	return core.QueueStat{Name: queue}
}

// waitOffers waits until fc holds n offers of job id and returns them.
func waitOffers(t *testing.T, fc *fakeConn, id string, n int) []core.Offer {
	t.Helper()
	waitFor(t, 5*time.Second, fmt.Sprintf("%d offer(s) of %s", n, id), func() bool { return len(fc.offersFor(id)) >= n })
	o := fc.offersFor(id)
	if len(o) != n {
		t.Fatalf("job %s was offered %d times, want %d: %+v", id, len(o), n, o)
	}
	return o
}

// fakePeer is one node's core.Cluster and core.Transport.
type fakePeer struct {
	net  *fakeNet
	node string
}

var (
	_ core.Cluster   = (*fakePeer)(nil)
	_ core.Transport = (*fakePeer)(nil)
)

func (p *fakePeer) Dispatcher(_ context.Context, queue string) (string, error) {
	n := p.net
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.electErr != nil {
		if err := n.electErr(queue); err != nil {
			return "", err
		}
	}
	if d, ok := n.dispatch[queue]; ok && n.routable[d] && !n.suspected[d] {
		return d, nil
	}
	// A producer's claim: the record is missing or void.
	n.setDispatcherLocked(queue, p.node)
	return p.node, nil
}

func (p *fakePeer) CachedDispatcher(queue string) (string, bool) {
	n := p.net
	n.mu.Lock()
	defer n.mu.Unlock()
	d, ok := n.dispatch[queue]
	return d, ok && n.routable[d] && !n.suspected[d]
}

func (p *fakePeer) DispatchRecord(queue string) (core.DispatchInfo, bool) {
	n := p.net
	n.mu.Lock()
	defer n.mu.Unlock()
	d, ok := n.dispatch[queue]
	return core.DispatchInfo{Dispatcher: d, Epoch: n.epochs[queue]}, ok
}

func (p *fakePeer) ClaimConsumer(_ context.Context, queue string) error {
	p.net.mu.Lock()
	defer p.net.mu.Unlock()
	p.net.claims = append(p.net.claims, p.node+" "+queue)
	return nil
}

func (p *fakePeer) ReleaseQueue(_ context.Context, queue string) error {
	p.net.mu.Lock()
	defer p.net.mu.Unlock()
	p.net.releases = append(p.net.releases, p.node+" "+queue)
	return nil
}

func (p *fakePeer) Routable(node string) bool {
	p.net.mu.Lock()
	defer p.net.mu.Unlock()
	return p.net.routable[node] && !p.net.suspected[node]
}

func (p *fakePeer) Serves(node string) bool {
	p.net.mu.Lock()
	defer p.net.mu.Unlock()
	return p.net.routable[node]
}

func (p *fakePeer) Alive(node string) bool {
	p.net.mu.Lock()
	defer p.net.mu.Unlock()
	return p.net.alive[node]
}

// Gone: a node the fake knows (its record was there) that is not alive.
func (p *fakePeer) Gone(node string) bool {
	p.net.mu.Lock()
	defer p.net.mu.Unlock()
	alive, known := p.net.alive[node]
	return known && !alive
}

func (p *fakePeer) LeaseValid() bool {
	p.net.mu.Lock()
	defer p.net.mu.Unlock()
	return p.net.lease[p.node]
}

// NodeZone: the fake's nodes carry the zones their consumers were
// published with.
func (p *fakePeer) NodeZone(string) string { return "" }

// Expect: the fake opens nothing ahead of time.
func (p *fakePeer) Expect(string, string, uint64, string, time.Duration) {}

func (p *fakePeer) Forward(ctx context.Context, node string, d core.Delivery) error {
	n := p.net
	n.mu.Lock()
	n.log = append(n.log, sentMsg{Kind: core.MsgForward, From: p.node, To: node, Call: true,
		Msg: core.Message{Kind: core.MsgForward, JobID: d.JobID, Gen: d.Gen, Queue: d.Queue, Delivery: &d}})
	target, dup := n.nodes[node], n.dupForward
	silent := n.silentForward != nil && n.silentForward(node)
	replaced, onForward := n.replacedForward, n.onForward
	n.mu.Unlock()
	if onForward != nil {
		onForward(ctx, node)
	}
	if replaced != nil && replaced(node) {
		return fmt.Errorf("fake: forward to %s: %w", node, core.ErrNodeReplaced)
	}
	if silent {
		for {
			select {
			case <-ctx.Done():
				return fmt.Errorf("fake: forward to %s: %w", node, ctx.Err())
			case <-time.After(5 * time.Millisecond):
			}
			if !p.Alive(node) {
				return fmt.Errorf("fake: forward to %s: node not in the catalog", node)
			}
		}
	}
	if target == nil {
		return fmt.Errorf("fake: no node %q", node)
	}
	err := target.e.HandleForward(p.node, d)
	if dup && err == nil {
		err = target.e.HandleForward(p.node, d)
	}
	return err
}

// Send is called with the sender's engine lock held: it only queues.
func (p *fakePeer) Send(node string, m core.Message) {
	n := p.net
	n.mu.Lock()
	defer n.mu.Unlock()
	s := sentMsg{Kind: m.Kind, From: p.node, To: node, Msg: m}
	if n.drop != nil && n.drop(s) {
		s.Dropped = true
		n.log = append(n.log, s)
		return
	}
	n.log = append(n.log, s)
	if n.stop {
		return
	}
	l := link{p.node, node}
	if len(n.queued[l]) == 0 {
		n.ready = append(n.ready, l)
	}
	n.queued[l] = append(n.queued[l], m)
	n.cond.Broadcast()
}

// submit posts a job on this node.
func (c *clusterNode) submit(queue string, e *core.Envelope) *core.Job {
	c.t.Helper()
	j, _, err := c.e.Submit(context.Background(), queue, e, core.SubmitOptions{})
	if err != nil {
		c.t.Fatalf("Submit on %s: %v", c.name, err)
	}
	return j
}

// outputsOf returns the data of the job's output events, in order.
func outputsOf(t *testing.T, j *core.Job) []string {
	t.Helper()
	var out []string
	for _, ev := range events(t, j) {
		if ev.Kind != core.EventOutput {
			continue
		}
		var d struct {
			Data json.RawMessage `json:"data"`
		}
		if err := json.Unmarshal(ev.Data, &d); err != nil {
			t.Fatalf("output event %s: %v", ev.Data, err)
		}
		out = append(out, string(d.Data))
	}
	return out
}

func wantKinds(t *testing.T, j *core.Job, want ...core.EventKind) {
	t.Helper()
	if got := kinds(events(t, j)); !slices.Equal(got, want) {
		t.Fatalf("job %s history %v, want %v", j.ID, got, want)
	}
}

func wantMetric(t *testing.T, c *clusterNode, want float64, name string, labels ...string) {
	t.Helper()
	if got := c.metric(name, labels...); got != want {
		t.Errorf("%s: %s%v = %v, want %v", c.name, name, labels, got, want)
	}
}

const clusterTTL = 30 * time.Second

// 1. Ingress n1, dispatcher and worker on n2: one synchronous forward and
// one reply per worker answer, and no accept message of its own (the
// dispatcher is the host, so the accept rides on the first output).
func TestClusterCrossNodeHappyPath(t *testing.T) {
	net, n1, n2 := twoNodes(t)
	w, fc := n2.worker("q", "a", 1)

	j := n1.submit("q", env(clusterTTL))
	if got := net.sentFor(j.ID); len(got) != 1 || !got[0].Call || got[0].To != "n2" {
		t.Fatalf("after Submit: %v, want one Forward call to n2", got)
	}
	o := waitOffers(t, fc, j.ID, 1)[0]
	if o.Gen != 1 || o.Queue != "q" || string(o.Input) != `{"prompt":"hi"}` {
		t.Fatalf("offer %+v", o)
	}
	if o.TTL <= 0 || o.TTL > clusterTTL {
		t.Fatalf("offer TTL %v, want in (0, %v]", o.TTL, clusterTTL)
	}

	w.Accept(j.ID, o.Gen)
	w.Output(j.ID, o.Gen, []byte(`{"n":1}`))
	w.Output(j.ID, o.Gen, []byte(`{"n":2}`))
	w.End(j.ID, o.Gen, "", "", json.RawMessage(`{"ok":true}`))
	v := n1.waitState(j.ID, core.StateCompleted)
	net.settle()

	wantKinds(t, j, core.EventAccepted, core.EventOutput, core.EventOutput, core.EventDone)
	if got := outputsOf(t, j); !slices.Equal(got, []string{`{"n":1}`, `{"n":2}`}) {
		t.Fatalf("outputs %q", got)
	}
	wantEnded(t, n1.harness, j, core.OutcomeCompleted, "")
	if v.HandledBy != w.ID || v.WorkerName != "a" || v.Generation != 1 {
		t.Fatalf("view %+v, want handled by %s (a), gen 1", v, w.ID)
	}
	net.wantSent(t, j.ID,
		"forward n1>n2 (call)",
		"reply n2>n1 output",
		"reply n2>n1 output",
		"reply n2>n1 end()",
	)
	n2.wantQueue(t, 0, 0, "after the job")
	wantJobsTotal(t, n1.harness, map[core.Outcome]float64{core.OutcomeCompleted: 1})
	// The outcome is counted on the ingress only.
	wantJobsTotal(t, n2.harness, map[core.Outcome]float64{})
}

// 2. Ingress n1, dispatcher n2 without workers, worker on n3: the job is
// delivered n2→n3, the host tells the ingress at once that it took the job
// (so the ingress knows the host before the dispatcher could die), and the
// credit goes back to n2 when the binding ends. A cancel then goes
// straight to the host.
func TestClusterThirdPartyDispatcher(t *testing.T) {
	net, n1, n2, n3 := threeNodes(t)
	w, fc := n3.worker("q", "b", 1)

	t.Run("completes", func(t *testing.T) {
		j := n1.submit("q", env(clusterTTL))
		o := waitOffers(t, fc, j.ID, 1)[0]
		if o.Gen != 1 || o.TTL <= 0 || o.TTL > clusterTTL {
			t.Fatalf("offer %+v", o)
		}
		n2.wantQueue(t, 0, 1, "while the job is delivered")
		w.Accept(j.ID, o.Gen)
		v := n1.waitState(j.ID, core.StateRunning)
		if v.HandledBy != w.ID || v.WorkerName != "b" {
			t.Fatalf("the accept did not name the consumer: %+v", v)
		}
		w.Output(j.ID, o.Gen, []byte(`"x"`))
		w.End(j.ID, o.Gen, "", "", nil)
		n1.waitState(j.ID, core.StateCompleted)
		net.settle()
		wantKinds(t, j, core.EventAccepted, core.EventOutput, core.EventDone)
		net.wantSent(t, j.ID,
			"forward n1>n2 (call)",
			"deliver n2>n3",
			"reply n3>n1 accepted",
			"reply n3>n1 output",
			"unbind n3>n2",
			"reply n3>n1 end()",
		)
		n2.wantQueue(t, anyCount, 0, "kept the credit after the unbind")
	})

	t.Run("cancel goes to the host", func(t *testing.T) {
		j := n1.submit("q", env(clusterTTL))
		o := waitOffers(t, fc, j.ID, 1)[0]
		w.Accept(j.ID, o.Gen)
		n1.waitState(j.ID, core.StateRunning)
		n1.cancelOnWorker(t, j.ID, fc)
		fc.wantCancels(t, cancelMsg{j.ID, 1, core.CodeCancelled})
		w.End(j.ID, o.Gen, core.CodeCancelled, "stopped", nil) // the acknowledgement
		net.settle()
		wantEnded(t, n1.harness, j, core.OutcomeCancelled, core.CodeCancelled)
		net.wantSent(t, j.ID,
			"forward n1>n2 (call)",
			"deliver n2>n3",
			"reply n3>n1 accepted",
			"cancel n1>n3",
			"unbind n3>n2",
		)
		n2.wantQueue(t, anyCount, 0, "kept the credit after the cancelled job")
	})
}

// 3. A worker lost before any output: the ingress re-forwards under gen+1
// and another worker gets it; whatever the old binding still says is
// refused at the ingress, at the old host and at the new host.
func TestClusterStaleGenerationRefused(t *testing.T) {
	net, n1, n2, n3 := threeNodes(t)
	a, _, j, oa := offerOne(t, n1, n2)
	a.Accept(j.ID, oa.Gen)
	b, fb := n3.worker("q", "b", 1) // arrives while a runs the job

	a.Detach(context.Background())
	ob := offerAt(t, fb, j.ID, oa.Gen+1)
	b.Accept(j.ID, ob.Gen)
	n1.waitState(j.ID, core.StateRunning)
	net.wantSent(t, j.ID,
		"forward n1>n2 (call)",
		"release n2>n1",
		"forward n1>n2",
		"deliver n2>n3",
		"reply n3>n1 accepted",
	)
	if s := net.sentFor(j.ID)[2]; s.Gen() != 2 || s.Msg.Delivery == nil || !s.Msg.Delivery.Front {
		t.Fatalf("the re-forward %+v, want gen 2 at the front of the queue", s.Msg)
	}
	wantMetric(t, n1, 1, "switchyard_dispatch_reclaims_total")

	before := kinds(events(t, j))
	// The old binding's answers, as its host would relay them late.
	n1.e.HandleMessage("n2", core.Message{Kind: core.MsgReply, JobID: j.ID, Gen: 1, Queue: "q", Consumer: a.ID, WorkerName: "a", Output: json.RawMessage(`"old"`)})
	n1.e.HandleMessage("n2", core.Message{Kind: core.MsgReply, JobID: j.ID, Gen: 1, Queue: "q", Consumer: a.ID, WorkerName: "a", End: &core.End{}})
	n1.e.HandleMessage("n2", core.Message{Kind: core.MsgRelease, JobID: j.ID, Gen: 1, Queue: "q", Consumer: a.ID})
	// The old worker itself, on its own node.
	a.Output(j.ID, oa.Gen, []byte(`"old"`))
	a.End(j.ID, oa.Gen, "", "", nil)
	// An old cancel on the new host, an old unbind on the dispatcher.
	n3.e.HandleMessage("n1", core.Message{Kind: core.MsgCancel, JobID: j.ID, Gen: 1, Queue: "q", Code: core.CodeCancelled})
	n2.e.HandleMessage("n3", core.Message{Kind: core.MsgUnbind, JobID: j.ID, Gen: 1, Queue: "q", Consumer: b.ID})
	net.settle()

	v := n1.view(j.ID)
	if v.State != core.StateRunning || v.Generation != 2 || v.HandledBy != b.ID || v.Outputs != 0 {
		t.Fatalf("after stale messages: %+v", v)
	}
	if got := kinds(events(t, j)); !slices.Equal(got, before) {
		t.Fatalf("history changed by stale messages: %v, was %v", got, before)
	}
	wantMetric(t, n1, 2, "switchyard_dispatch_stale_messages_total", "kind", "reply")
	wantMetric(t, n1, 1, "switchyard_dispatch_stale_messages_total", "kind", "release")
	wantMetric(t, n2, 1, "switchyard_dispatch_stale_messages_total", "kind", "output")
	wantMetric(t, n2, 1, "switchyard_dispatch_stale_messages_total", "kind", "end")
	if c := fb.Cancels(); len(c) != 0 {
		t.Fatalf("a gen-1 cancel reached the gen-2 worker: %+v", c)
	}
	n2.wantQueue(t, anyCount, 1, "a gen-1 unbind freed the gen-2 binding on the dispatcher")

	b.Output(j.ID, ob.Gen, []byte(`"new"`))
	b.End(j.ID, ob.Gen, "", "", nil)
	n1.waitState(j.ID, core.StateCompleted)
	wantKinds(t, j, core.EventAccepted, core.EventOutput, core.EventDone)
	if got := outputsOf(t, j); !slices.Equal(got, []string{`"new"`}) {
		t.Fatalf("outputs %q", got)
	}
	for _, ev := range events(t, j)[1:] {
		if ev.Gen != 2 {
			t.Fatalf("event %s has gen %d, want 2", ev.Kind, ev.Gen)
		}
	}
}

// 4. The ingress decides a lost worker's job: run again when it produced
// nothing, worker_lost when it did.
func TestClusterLostWorker(t *testing.T) {
	t.Run("before output runs again", func(t *testing.T) {
		_, n1, n2 := twoNodes(t)
		a, _, j, oa := offerOne(t, n1, n2)
		a.Accept(j.ID, oa.Gen)
		b, fb := n2.worker("q", "b", 1)
		a.Detach(context.Background())
		ob := offerAt(t, fb, j.ID, 2)
		b.Output(j.ID, ob.Gen, []byte(`1`))
		b.End(j.ID, ob.Gen, "", "", nil)
		n1.waitState(j.ID, core.StateCompleted)
		wantMetric(t, n1, 1, "switchyard_dispatch_reclaims_total")
		wantKinds(t, j, core.EventAccepted, core.EventOutput, core.EventDone)
		if v := n1.view(j.ID); v.HandledBy != b.ID {
			t.Fatalf("handled by %s, want %s", v.HandledBy, b.ID)
		}
	})

	t.Run("after output fails worker_lost", func(t *testing.T) {
		net, n1, n2 := twoNodes(t)
		a, fa := n2.worker("q", "a", 1)
		_, fb := n2.worker("q", "b", 1)
		j := n1.submit("q", env(clusterTTL))
		oa := waitOffers(t, fa, j.ID, 1)[0]
		a.Output(j.ID, oa.Gen, []byte(`1`))
		// The release follows the output on the same link: no wait needed.
		a.Detach(context.Background())
		n1.waitState(j.ID, core.StateFailed)
		wantEnded(t, n1.harness, j, core.OutcomeFailed, core.CodeWorkerLost)
		wantKinds(t, j, core.EventAccepted, core.EventOutput, core.EventError)
		wantMetric(t, n1, 0, "switchyard_dispatch_reclaims_total")
		net.settle()
		if o := fb.offersFor(j.ID); len(o) != 0 {
			t.Fatalf("a job with output ran again: %+v", o)
		}
	})
}

// 5. A refusal on one node sends the job to a consumer on another, never
// back to the one that refused; when every capable consumer refused, the
// job fails rejected.
func TestClusterRejectAcrossNodes(t *testing.T) {
	net, n1, n2, n3 := threeNodes(t)
	a, fa := n2.worker("q", "a", 1)
	b, fb := n3.worker("q", "b", 1)

	j := n1.submit("q", env(clusterTTL))
	oa := waitOffers(t, fa, j.ID, 1)[0] // local first
	a.Reject(j.ID, oa.Gen, "not me")
	ob := offerAt(t, fb, j.ID, 2)
	wantMetric(t, n2, 1, "switchyard_dispatch_rejects_total")
	net.settle()
	if o := fa.offersFor(j.ID); len(o) != 1 {
		t.Fatalf("the job went back to the worker that refused it: %+v", o)
	}
	rel := net.sentFor(j.ID)[1]
	if rel.Kind != core.MsgRelease || !rel.Msg.Rejected || rel.Msg.Consumer != a.ID || rel.Msg.Reason != "not me" {
		t.Fatalf("a's refusal travelled as %+v", rel.Msg)
	}
	fwd := net.sentFor(j.ID)[2]
	if fwd.Kind != core.MsgForward || fwd.Msg.Delivery == nil || !slices.Equal(fwd.Msg.Delivery.Exclude, []string{a.ID}) {
		t.Fatalf("the re-forward %+v does not exclude a", fwd.Msg)
	}

	b.Reject(j.ID, ob.Gen, "nor me")
	n1.waitState(j.ID, core.StateFailed)
	wantEnded(t, n1.harness, j, core.OutcomeFailed, core.CodeRejected)
	if v := n1.view(j.ID); !strings.Contains(v.Detail, "nor me") {
		t.Fatalf("detail %q does not carry the last reason", v.Detail)
	}
	net.settle()
	if len(fa.offersFor(j.ID)) != 1 || len(fb.offersFor(j.ID)) != 1 {
		t.Fatalf("offers after both refused: a %d, b %d", len(fa.offersFor(j.ID)), len(fb.offersFor(j.ID)))
	}
	for _, n := range []*clusterNode{n2, n3} {
		n.wantQueue(t, 0, 0, "still holds the job")
	}
	// Both workers are still there and free.
	j2 := n1.submit("q", env(clusterTTL))
	waitOffers(t, fa, j2.ID, 1)
}

// 6. A retried forward of the same (job, gen) never makes a second job.
func TestClusterForwardIdempotent(t *testing.T) {
	net, _, n2 := twoNodes(t)

	d := core.Delivery{JobID: "j_fwd", Gen: 1, Queue: "q", Ingress: "n1", Input: json.RawMessage(`1`), TTL: clusterTTL, MaxOutputBytes: 1 << 20}
	for range 2 {
		if err := n2.e.HandleForward("n1", d); err != nil {
			t.Fatalf("HandleForward: %v", err)
		}
	}
	// The asynchronous leg too.
	n2.e.HandleMessage("n1", core.Message{Kind: core.MsgForward, JobID: d.JobID, Gen: 1, Queue: "q", Delivery: &d})
	n2.wantQueue(t, 1, anyCount, "after three forwards of one (job, gen)")
	// An older generation is not taken either.
	old := d
	old.Gen = 0
	if err := n2.e.HandleForward("n1", old); err != nil {
		t.Fatalf("HandleForward(old gen): %v", err)
	}
	n2.wantQueue(t, 1, anyCount, "an older generation was queued")
	// Only the job's own ingress forwards it.
	wantCode(t, n2.e.HandleForward("n3", d), core.CodeInvalidField)

	_, fc := n2.worker("q", "a", 2)
	waitOffers(t, fc, d.JobID, 1)
	if err := n2.e.HandleForward("n1", d); err != nil {
		t.Fatalf("HandleForward after the bind: %v", err)
	}
	n2.wantQueue(t, 0, 1, "after a retry of a bound job")
	net.settle()
	if o := fc.offersFor(d.JobID); len(o) != 1 {
		t.Fatalf("offers %+v, want exactly one", o)
	}
	if got := net.sent(); len(got) != 0 {
		t.Fatalf("idempotent forwards sent %v", got)
	}
}

// 6b. The same through Submit: the transport retries the Forward (its
// response was lost) and the job still runs once.
func TestClusterSubmitForwardRetried(t *testing.T) {
	net, n1, n2 := twoNodes(t)
	w, fc := n2.worker("q", "a", 2)
	net.mu.Lock()
	net.dupForward = true
	net.mu.Unlock()
	j := n1.submit("q", env(clusterTTL))
	o := waitOffers(t, fc, j.ID, 1)[0]
	w.End(j.ID, o.Gen, "", "", nil)
	n1.waitState(j.ID, core.StateCompleted)
	net.settle()
	if got := len(fc.offersFor(j.ID)); got != 1 {
		t.Fatalf("%d offers", got)
	}
	n2.wantQueue(t, 0, 0, "after the job")
}

// 7. A host that must treat its lease as lost forwards no worker answer.
func TestClusterFencedHost(t *testing.T) {
	net, n1, n2 := twoNodes(t)
	w, _, j, o := offerOne(t, n1, n2)

	net.setLease("n2", false)
	w.Accept(j.ID, o.Gen)
	w.Output(j.ID, o.Gen, []byte(`1`))
	w.End(j.ID, o.Gen, "", "", nil)
	net.wantSent(t, j.ID, "forward n1>n2 (call)")
	wantMetric(t, n2, 2, "switchyard_dispatch_fenced_messages_total")
	v := n1.view(j.ID)
	if v.State.Terminal() || v.Outputs != 0 {
		t.Fatalf("the ingress heard from a fenced host: %+v", v)
	}
	wantKinds(t, j, core.EventAccepted)
}

// 7b. A fenced host that lets go of a job it never ran (it refused the
// delivery, or its worker left before accepting) must leave the job where
// the cluster finds it again: once the host's death is proven, the job runs
// elsewhere, long before its TTL. Here the dispatcher is a third node, so
// the ingress does not know the host and counts on the dispatcher's
// binding (consumersGoneLocked) to bring the job back.
func TestClusterFencedHostKeepsJobRecoverable(t *testing.T) {
	for _, tc := range []struct {
		name   string
		detach bool
	}{
		{"delivery refused", false},
		{"worker left before accepting", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			net, n1, n2, n3 := threeNodes(t)
			b, fb := n3.worker("q", "b", 1)
			if !tc.detach {
				net.setLease("n3", false)
			}
			j := n1.submit("q", env(clusterTTL))
			if tc.detach {
				waitOffers(t, fb, j.ID, 1)
				net.setLease("n3", false)
				b.Detach(context.Background())
			}
			net.settle()
			if !tc.detach {
				if o := fb.offersFor(j.ID); len(o) != 0 {
					t.Fatalf("a fenced host offered the job: %+v", o)
				}
			}

			// n3's lease runs out: its records go, and a worker turns up on n2.
			net.kill("n3")
			c, fc := n2.worker("q", "c", 1)
			n1.e.ClusterChanged()
			n2.e.ClusterChanged()
			oc := waitOffers(t, fc, j.ID, 1)[0]
			c.End(j.ID, oc.Gen, "", "", nil)
			n1.waitState(j.ID, core.StateCompleted)
		})
	}
}

// 8a. The dispatcher (also the host) dies: a job it held with no output
// goes to the queue's new dispatcher and completes; one with output fails
// worker_lost.
func TestClusterDispatcherDies(t *testing.T) {
	net, n1, n2, n3 := threeNodes(t)
	a, fa := n2.worker("q", "a", 2)
	c, fc := n3.worker("q", "c", 1)

	quiet, loud, _, _ := quietAndLoud(t, n1, a, fa)
	net.settle()

	net.kill("n2")
	net.setDispatcher("q", "n3")
	n1.e.ClusterChanged()

	wantEnded(t, n1.harness, loud, core.OutcomeFailed, core.CodeWorkerLost)
	oc := offerAt(t, fc, quiet.ID, 2)
	c.Output(quiet.ID, oc.Gen, []byte(`"done"`))
	c.End(quiet.ID, oc.Gen, "", "", nil)
	n1.waitState(quiet.ID, core.StateCompleted)
	wantKinds(t, quiet, core.EventAccepted, core.EventOutput, core.EventDone)
	wantMetric(t, n1, 1, "switchyard_dispatch_reclaims_total")
	net.wantForwards(t, quiet.ID, "forward n1>n2 (call) gen 1", "forward n1>n3 gen 2")
}

// 8b. A remote consumer's record disappears: its dispatcher hands the job
// bound to it back to the ingress, which runs it again.
func TestClusterRemoteConsumerGone(t *testing.T) {
	net, n1, n2, n3 := threeNodes(t)
	b, fb := n3.worker("q", "b", 1)

	j := n1.submit("q", env(clusterTTL))
	waitOffers(t, fb, j.ID, 1)
	net.settle()
	n2.wantQueue(t, anyCount, 1, "before")

	if err := net.cat.WithdrawConsumer(context.Background(), "q", b.ID); err != nil {
		t.Fatal(err)
	}
	n2.e.ClusterChanged()
	net.wantSent(t, j.ID,
		"forward n1>n2 (call)",
		"deliver n2>n3",
		"release n2>n1",
		"forward n1>n2",
	)
	if rel := net.sentFor(j.ID)[2].Msg; rel.Consumer != b.ID || rel.Rejected || rel.Gen != 1 {
		t.Fatalf("release %+v", rel)
	}
	wantMetric(t, n1, 1, "switchyard_dispatch_reclaims_total")
	n2.wantQueue(t, 1, 0, "after: the job waiting again")
	if v := n1.view(j.ID); v.State != core.StateQueued || v.Generation != 2 {
		t.Fatalf("ingress after: %+v", v)
	}

	d, fd := n2.worker("q", "d", 1)
	od := waitOffers(t, fd, j.ID, 1)[0]
	d.End(j.ID, od.Gen, "", "", nil)
	n1.waitState(j.ID, core.StateCompleted)
}

// 8c. The ingress dies: its job is cancelled on the worker running it, and
// a job of it still waiting on the dispatcher is dropped.
func TestClusterIngressDies(t *testing.T) {
	net, n1, n2 := twoNodes(t)
	w, fc := n2.worker("q", "a", 1)
	running := n1.submit("q", env(clusterTTL))
	waiting := n1.submit("q", env(clusterTTL))
	o := waitOffers(t, fc, running.ID, 1)[0]
	w.Accept(running.ID, o.Gen)
	n2.wantQueue(t, 1, 1, "before")

	net.kill("n1")
	n2.e.ClusterChanged()
	fc.wantCancels(t, cancelMsg{running.ID, 1, core.CodeCancelled})
	w.End(running.ID, o.Gen, core.CodeCancelled, "", nil)
	net.settle()
	n2.wantQueue(t, 0, 0, "after: nothing left of the dead ingress's jobs")
	if o := fc.offersFor(waiting.ID); len(o) != 0 {
		t.Fatalf("the dead ingress's waiting job was offered: %+v", o)
	}
}

// 9. A reply for a job the ingress does not know gets a cancel back to the
// host that sent it.
func TestClusterReplyForUnknownJob(t *testing.T) {
	t.Run("made-up id", func(t *testing.T) {
		net := newFakeNet(t)
		n1, _ := net.add("n1", nil), net.add("n2", nil)
		n1.e.HandleMessage("n2", core.Message{Kind: core.MsgReply, JobID: "j_nope", Gen: 3, Queue: "q", Consumer: "c_x", Output: json.RawMessage(`1`)})
		n1.e.HandleMessage("n2", core.Message{Kind: core.MsgReply, JobID: "j_nope2", Gen: 1, Queue: "q", Consumer: "c_x", Accepted: true})
		// An end needs no cancel: the host has already let go.
		n1.e.HandleMessage("n2", core.Message{Kind: core.MsgReply, JobID: "j_nope3", Gen: 1, Queue: "q", Consumer: "c_x", End: &core.End{}})
		net.settle()
		var got []string
		for _, s := range net.sent() {
			got = append(got, fmt.Sprintf("%s %s gen %d code %s", s, s.Msg.JobID, s.Gen(), s.Msg.Code))
		}
		want := []string{"cancel n1>n2 j_nope gen 3 code cancelled", "cancel n1>n2 j_nope2 gen 1 code cancelled"}
		if !slices.Equal(got, want) {
			t.Fatalf("sent %q, want %q", got, want)
		}
	})

	t.Run("forgotten job", func(t *testing.T) {
		net, n1, n2 := twoNodes(t, func(c *core.Config) { c.Retention = 20 * time.Millisecond })
		w, fc, j, o := offerOne(t, n1, n2)
		w.Accept(j.ID, o.Gen)
		// The cancel the ingress sends when the job ends is lost.
		var once sync.Once
		net.mu.Lock()
		net.drop = func(s sentMsg) bool {
			d := false
			if s.Kind == core.MsgCancel {
				once.Do(func() { d = true })
			}
			return d
		}
		net.mu.Unlock()
		if _, err := n1.e.Cancel(j.ID, "test"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 5*time.Second, "the ingress to forget the job", func() bool {
			_, err := n1.e.View(j.ID)
			return errors.Is(err, core.ErrJobNotFound)
		})
		if c := fc.Cancels(); len(c) != 0 {
			t.Fatalf("cancel arrived although dropped: %+v", c)
		}

		w.Output(j.ID, o.Gen, []byte(`"late"`))
		waitFor(t, 5*time.Second, "the cancel on the worker", func() bool { return len(fc.Cancels()) == 1 })
		fc.wantCancels(t, cancelMsg{j.ID, 1, core.CodeCancelled})
		w.End(j.ID, o.Gen, core.CodeCancelled, "", nil)
		net.wantSent(t, j.ID,
			"forward n1>n2 (call)",
			"cancel n1>n2 [dropped]",
			"reply n2>n1 output",
			"cancel n1>n2",
		)
		n2.wantQueue(t, anyCount, 0, "still binds the job")
	})
}

// The ingress is also the dispatcher and the consumer is on n2: a cancel
// after the host is known travels once.
func TestClusterIngressDispatcherCancelOnce(t *testing.T) {
	net := newFakeNet(t)
	n1, n2 := net.add("n1", nil), net.add("n2", nil)
	net.setDispatcher("q", "n1")
	w, fc, j, o := offerOne(t, n1, n2)
	w.Output(j.ID, o.Gen, []byte(`1`))
	waitFor(t, 5*time.Second, "the output at the ingress", func() bool { return n1.view(j.ID).Outputs == 1 })
	n1.cancelOnWorker(t, j.ID, fc)
	w.End(j.ID, o.Gen, core.CodeCancelled, "", nil)
	net.settle()
	n1.wantQueue(t, anyCount, 0, "kept the credit")
	net.wantSent(t, j.ID,
		"deliver n1>n2",
		"reply n2>n1 output",
		"cancel n1>n2",
		"unbind n2>n1",
	)
}

// A delivery from an earlier generation that arrives late (a zombie
// dispatcher flushing its queue) must not replace the current binding of
// the same job on the host.
func TestClusterLateDeliverDoesNotReplaceBinding(t *testing.T) {
	net, n1, n2, n3 := threeNodes(t)
	b, fb := n3.worker("q", "b", 2)
	j := submitDeliveryHeld(net, n1)
	n2.wantQueue(t, anyCount, 1, "now")

	// n2 is declared dead with the deliver still held on its link to n3;
	// the job goes to the new dispatcher n3, which is also b's node.
	net.setAlive("n2", false)
	net.setRoutable("n2", false)
	net.setDispatcher("q", "n3")
	n1.e.ClusterChanged()
	offerAt(t, fb, j.ID, 2)
	// The zombie's deliver arrives now.
	net.unhold("n2", "n3")
	net.settle()

	b.Accept(j.ID, 2)
	b.Output(j.ID, 2, []byte(`1`))
	b.End(j.ID, 2, "", "", nil)
	n1.waitState(j.ID, core.StateCompleted)
}

// The queue's dispatcher died and no record names another: the ingress
// elects (here: itself) and the job runs on a consumer elsewhere.
func TestClusterDispatcherDiesNoRecord(t *testing.T) {
	net, n1, n2, n3 := threeNodes(t)
	_, fa := n2.worker("q", "a", 1)
	c, fc := n3.worker("q", "c", 1)
	j := n1.submit("q", env(clusterTTL))
	waitOffers(t, fa, j.ID, 1)

	net.kill("n2") // the record still names n2, which is not routable
	n1.e.ClusterChanged()
	oc := offerAt(t, fc, j.ID, 2)
	if d, ok := (&fakePeer{net: net, node: "n3"}).CachedDispatcher("q"); !ok || d != "n1" {
		t.Fatalf("dispatch record %q %v, want n1 elected", d, ok)
	}
	c.Output(j.ID, oc.Gen, []byte(`1`))
	c.End(j.ID, oc.Gen, "", "", nil)
	n1.waitState(j.ID, core.StateCompleted)
	net.wantSent(t, j.ID,
		"forward n1>n2 (call)",
		"deliver n1>n3",
		"reply n3>n1 output",
		"reply n3>n1 end()",
	)
	n1.wantQueue(t, 0, 0, "as dispatcher after the job")
}

// A job whose TTL runs out while it waits on a remote dispatcher is failed
// there, and the ingress, told by the end, sends no cancel back.
func TestClusterQueuedJobExpiresOnDispatcher(t *testing.T) {
	net, n1, n2, n3 := threeNodes(t, func(c *core.Config) { c.ExpirySlack = 5 * time.Second })
	_, fb := n3.worker("q", "b", 1)
	busy := n1.submit("q", env(clusterTTL))
	waitOffers(t, fb, busy.ID, 1)

	j := n1.submit("q", env(150*time.Millisecond))
	n2.wantQueue(t, 1, anyCount, "the job waiting")
	n1.waitState(j.ID, core.StateExpired)
	wantEnded(t, n1.harness, j, core.OutcomeExpired, core.CodeExpired)
	net.wantSent(t, j.ID, "forward n1>n2 (call)", "reply n2>n1 end(expired)")
	n2.wantQueue(t, 0, anyCount, "after")
}

// A remote dispatcher's refusal is the Submit's refusal, and leaves no job
// behind on the ingress.
func TestClusterForwardRefused(t *testing.T) {
	net, n1, n2 := twoNodes(t, nil, func(c *core.Config) { c.Limits.MaxQueueDepth = 1 })
	_, fc := n2.worker("q", "a", 1)
	n1.submit("q", env(clusterTTL)) // bound
	n1.submit("q", env(clusterTTL)) // waits: the queue is full

	_, _, err := n1.e.Submit(context.Background(), "q", env(clusterTTL), core.SubmitOptions{IdempotencyKey: "k"})
	wantCode(t, err, core.CodeQueueFull)

	// n2 drains past its deadline at once: both jobs go back to n1, which
	// dispatches them itself (n2's consumer takes nothing new).
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	n2.e.Drain(ctx)
	waitFor(t, 5*time.Second, "both jobs waiting on n1", func() bool { return n1.queueStat("q").Depth == 2 })
	// A view that still names n2: a node that has drained refuses the
	// forward as draining. It took nothing, so the job is not refused: it
	// is accepted and routed again a heartbeat later, here to n1 once the
	// view names it.
	wantRoutedPastDrained(t, net, n1, core.SubmitOptions{IdempotencyKey: "k2"})

	n2.wantQueue(t, 0, 0, "now")
	if n := len(fc.Offers()); n != 1 {
		t.Fatalf("%d offers", n)
	}
	wantJobsTotal(t, n1.harness, map[core.Outcome]float64{})
	// The refused key is free again: the refused jobs never existed.
	net.setDispatcher("q", "n1")
	if _, existing, err := n1.e.Submit(context.Background(), "q", env(clusterTTL), core.SubmitOptions{IdempotencyKey: "k"}); err != nil || existing {
		t.Fatalf("Submit with the refused key: %v existing=%v", err, existing)
	}
}

// A cancel before the ingress knows the host goes to the dispatcher, which
// drops a waiting job or passes the cancel on to the host of a bound one.
func TestClusterCancelBeforeHostKnown(t *testing.T) {
	net, n1, n2, n3 := threeNodes(t)
	w, fc := n3.worker("q", "b", 1)
	bound := n1.submit("q", env(clusterTTL))
	waiting := n1.submit("q", env(clusterTTL))
	o := waitOffers(t, fc, bound.ID, 1)[0]
	net.settle()

	if _, err := n1.e.Cancel(waiting.ID, "test"); err != nil {
		t.Fatal(err)
	}
	net.settle()
	n2.wantQueue(t, 0, 1, "after cancelling the waiting job")
	net.wantSent(t, waiting.ID, "forward n1>n2 (call)", "cancel n1>n2")

	n1.cancelOnWorker(t, bound.ID, fc)
	w.End(bound.ID, o.Gen, core.CodeCancelled, "", nil)
	net.wantSent(t, bound.ID,
		"forward n1>n2 (call)",
		"deliver n2>n3",
		"cancel n1>n2",
		"cancel n2>n3",
		"unbind n3>n2",
	)
	n2.wantQueue(t, anyCount, 0, "kept the credit")
	if o := fc.offersFor(waiting.ID); len(o) != 0 {
		t.Fatalf("the cancelled waiting job was offered: %+v", o)
	}
}

// A dispatcher hosting none of its queue's consumers hands the queue to the
// one node that hosts them all, once that has held for PinStable and the
// queue is empty; a consumer's node claims a queue whose dispatcher is gone.
func TestClusterRelocationAndClaims(t *testing.T) {
	net, n1, n2, n3 := threeNodes(t, nil, func(c *core.Config) { c.PinStable = 20 * time.Millisecond })
	w, fc := n3.worker("q", "b", 1)
	j := n1.submit("q", env(clusterTTL))
	o := waitOffers(t, fc, j.ID, 1)[0]
	w.End(j.ID, o.Gen, "", "", nil)
	n1.waitState(j.ID, core.StateCompleted)
	waitFor(t, 5*time.Second, "n2 to release q", func() bool {
		net.mu.Lock()
		defer net.mu.Unlock()
		return slices.Contains(net.releases, "n2 q")
	})
	wantMetric(t, n2, 1, "switchyard_dispatch_relocations_total")

	claims := func() int {
		net.mu.Lock()
		defer net.mu.Unlock()
		c := 0
		for _, s := range net.claims {
			if s == "n3 q" {
				c++
			}
		}
		return c
	}
	waitFor(t, 5*time.Second, "n3's claim at attach", func() bool { return claims() == 1 })
	net.kill("n2")
	n3.e.ClusterChanged()
	waitFor(t, 5*time.Second, "n3 to claim the orphaned queue", func() bool { return claims() == 2 })
}

// TestClusterTTLPerHop walks a job ingress (n1) → dispatcher (n2) → consumer
// host (n3) → worker and checks that the remaining TTL it carries strictly
// decreases at every hop, queue residence on the dispatcher included. Each
// hop measures on its own clock from the TTL it received: nothing compares
// clocks across nodes. (A job whose TTL runs out on the way fails where it
// is found: TestClusterQueuedJobExpiresOnDispatcher.)
func TestClusterTTLPerHop(t *testing.T) {
	const ttl = 10 * time.Second
	const residence = 200 * time.Millisecond
	net := newFakeNet(t)
	n1, n3 := net.add("n1", nil), net.add("n3", nil)
	net.add("n2", nil)
	net.setDispatcher("q", "n2")
	wb, fb := n3.worker("q", "b", 1)
	busy := n1.submit("q", env(clusterTTL))
	ob := waitOffers(t, fb, busy.ID, 1)[0]

	start := time.Now()
	j := n1.submit("q", env(ttl))
	time.Sleep(residence) // the job waits on n2: the worker's one credit is taken
	wb.End(busy.ID, ob.Gen, "", "", nil)
	o := waitOffers(t, fb, j.ID, 1)[0]
	elapsed := time.Since(start)

	var forward, deliver time.Duration
	for _, s := range net.sentFor(j.ID) {
		switch {
		case s.Kind == core.MsgForward && s.Call:
			forward = s.Msg.Delivery.TTL
		case s.Kind == core.MsgDeliver:
			deliver = s.Msg.Delivery.TTL
		}
	}
	t.Logf("TTL per hop: envelope %v → forwarded by n1 %v → delivered by n2 %v (after %v queued) → offered to the worker by n3 %v; %v elapsed in all",
		ttl, forward, deliver, residence, o.TTL, elapsed)
	if !(ttl > forward && forward > deliver && deliver > o.TTL && o.TTL > 0) {
		t.Fatalf("TTL did not strictly decrease: %v > %v > %v > %v", ttl, forward, deliver, o.TTL)
	}
	if forward-deliver < residence {
		t.Errorf("the dispatcher took %v off for a job that waited %v there", forward-deliver, residence)
	}
	if ttl-o.TTL > elapsed {
		t.Errorf("the hops took %v off in all, more than the %v that passed", ttl-o.TTL, elapsed)
	}
}

// A job's output credit across nodes: the window is the ingress's (n1),
// carried in the delivery to the host's offer (n2); the host counts the
// worker's output against it, and the ingress's grant, once the job's
// owner stream took half the window, goes back to the host as a message
// and on to the worker. No grant for a job shorter than half its window.
func TestClusterGrantsGoBackToTheHost(t *testing.T) {
	net, n1, n2 := twoNodes(t, smallWindow, func(c *core.Config) { c.OutputWindowEvents, c.OutputWindowBytes = 1000, 1<<20 })
	w, fc := n2.worker("q", "a", 1)
	j, _, err := n1.e.Submit(context.Background(), "q", env(clusterTTL), core.SubmitOptions{Streamed: true})
	if err != nil {
		t.Fatal(err)
	}
	o := waitOffers(t, fc, j.ID, 1)[0]
	if o.Credit != (core.OutputCredit{Events: 4, Bytes: 1000}) {
		t.Fatalf("offer credit %+v, want the ingress's window {4 1000}", o.Credit)
	}
	for i := range 4 {
		w.Output(j.ID, o.Gen, output(i))
	}
	waitFor(t, 5*time.Second, "the outputs at the ingress", func() bool { return n1.view(j.ID).Outputs == 4 })
	if !n1.view(j.ID).WaitingForReader || n2.metric("switchyard_worker_credit_waiting") != 1 {
		t.Fatal("the job does not wait for its reader on both nodes")
	}
	n1.e.StreamSent(j.ID, 3) // accepted and two outputs
	waitFor(t, 5*time.Second, "the grant at the worker", func() bool { return len(fc.Credits()) == 1 })
	if got := fc.Credits()[0]; got.JobID != j.ID || got.Credit != (core.OutputCredit{Events: 6, Bytes: 1014}) {
		t.Fatalf("credit at the worker %+v, want {6 1014} for %s", got, j.ID)
	}
	if n2.metric("switchyard_worker_credit_waiting") != 0 {
		t.Error("the host still counts the job waiting after the grant")
	}
	w.Output(j.ID, o.Gen, output(4))
	w.End(j.ID, o.Gen, "", "", nil)
	n1.waitState(j.ID, core.StateCompleted)
	net.wantSent(t, j.ID,
		"forward n1>n2 (call)",
		"reply n2>n1 output",
		"reply n2>n1 output",
		"reply n2>n1 output",
		"reply n2>n1 output",
		"grant n1>n2",
		"reply n2>n1 output",
		"reply n2>n1 end()",
	)
}

// Output reports the first output of a job relayed to a remote ingress
// that sent it latency first (no other job in flight there) while the job
// is the only one its host holds (grpcapi's session reader then yields to
// the sender it woke), and nothing for the job's later outputs, for a job
// with company on the host, for a job its ingress sent while it held
// another, or for a local ingress.
func TestOutputReportsALoneJobsFirstRemoteOutput(t *testing.T) {
	_, n1, n2 := twoNodes(t)
	w, fc := n2.worker("q", "a", 2)

	j1 := n1.submit("q", env(clusterTTL))
	if got := n1.e.IngressJobs(); got != 1 {
		t.Fatalf("the ingress with one job: IngressJobs %d, want 1", got)
	}
	o1 := waitOffers(t, fc, j1.ID, 1)[0]
	if !w.Output(j1.ID, o1.Gen, []byte(`1`)) {
		t.Fatal("the lone job's first output: Output reported false, want true")
	}
	if w.Output(j1.ID, o1.Gen, []byte(`2`)) {
		t.Fatal("the lone job's second output: Output reported true, want false")
	}
	w.End(j1.ID, o1.Gen, "", "", nil)
	n1.waitState(j1.ID, core.StateCompleted)
	if got := n1.e.IngressJobs(); got != 0 {
		t.Fatalf("the ingress with its job ended: IngressJobs %d, want 0", got)
	}

	// Alone at its ingress, not at its host: a job of n2's own is hosted too.
	jl := n2.submit("q", env(clusterTTL))
	ol := waitOffers(t, fc, jl.ID, 1)[0]
	if w.Output(jl.ID, ol.Gen, []byte(`1`)) {
		t.Fatal("a first output to a local ingress: Output reported true, want false")
	}
	j2 := n1.submit("q", env(clusterTTL))
	o2 := waitOffers(t, fc, j2.ID, 1)[0]
	if w.Output(j2.ID, o2.Gen, []byte(`1`)) {
		t.Fatal("a first output while another job is hosted: Output reported true, want false")
	}
	w.End(jl.ID, ol.Gen, "", "", nil)
	n2.waitState(jl.ID, core.StateCompleted)

	// Alone at its host, not at its ingress when it was sent: n1 held j2.
	j3 := n1.submit("q", env(clusterTTL))
	o3 := waitOffers(t, fc, j3.ID, 1)[0]
	w.End(j2.ID, o2.Gen, "", "", nil)
	n1.waitState(j2.ID, core.StateCompleted)
	if w.Output(j3.ID, o3.Gen, []byte(`1`)) {
		t.Fatal("a first output of a job sent without the hint, alone at its host: Output reported true, want false")
	}
	w.End(j3.ID, o3.Gen, "", "", nil)
	n1.waitState(j3.ID, core.StateCompleted)
}
