package core_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/core"
)

// The graceful drain (core/drain.go) across the fake cluster of
// cluster_test.go.

// Resign is the fake's catalog side of a drain: each queue the node
// dispatches goes to a routable node hosting one of its consumers (the
// first by name), or its record is deleted; then the node is no longer
// routable.
func (p *fakePeer) Resign(context.Context) error {
	n := p.net
	n.mu.Lock()
	err := n.resignErr
	n.mu.Unlock()
	if err != nil {
		return err
	}
	consumers := map[string][]string{}
	for _, q := range n.queuesOf(p.node) {
		for _, ci := range n.cat.Consumers(q) {
			consumers[q] = append(consumers[q], ci.Node)
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.resigned = append(n.resigned, p.node)
	for q, nodes := range consumers {
		slices.Sort(nodes)
		heir := ""
		for _, node := range nodes {
			if node != p.node && n.routable[node] {
				heir = node
				break
			}
		}
		n.setDispatcherLocked(q, heir)
	}
	n.routable[p.node] = false
	return nil
}

// queuesOf lists the queues node dispatches.
func (n *fakeNet) queuesOf(node string) []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for q, d := range n.dispatch {
		if d == node {
			out = append(out, q)
		}
	}
	return out
}

// drain runs Drain on c in the background with timeout; the channel gets
// what it returned.
func (c *clusterNode) drain(timeout time.Duration) <-chan int {
	done := make(chan int, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		done <- c.e.Drain(ctx)
	}()
	return done
}

func waitResigned(t *testing.T, net *fakeNet, node string) {
	t.Helper()
	waitFor(t, 5*time.Second, node+" resigned", func() bool {
		net.mu.Lock()
		defer net.mu.Unlock()
		return slices.Contains(net.resigned, node)
	})
}

// A draining node keeps its worker's session and its binding until the job
// ends, whoever the requester: the job completes, with every output. It
// hands its queue to the node hosting the other consumer, offers its own
// worker nothing new, and Drain returns once the job has ended.
func TestDrainFinishesJobsForOtherNodes(t *testing.T) {
	net, n1, n2, n3 := threeNodes(t)
	a, fa := n2.worker("q", "a", 2)
	c, fc := n3.worker("q", "c", 1)

	j := n1.submit("q", env(clusterTTL))
	oa := waitOffers(t, fa, j.ID, 1)[0]
	a.Output(j.ID, oa.Gen, []byte(`1`))

	done := n2.drain(time.Minute)
	waitResigned(t, net, "n2")
	if d, ok := (&fakePeer{net: net, node: "n1"}).CachedDispatcher("q"); !ok || d != "n3" {
		t.Fatalf("dispatch record after the resign: %q %v, want n3", d, ok)
	}
	select {
	case n := <-done:
		t.Fatalf("Drain returned (%d) while the job still ran on its worker", n)
	case <-time.After(50 * time.Millisecond):
	}

	// A new job goes to the heir's worker, never to the draining node's.
	j2 := n1.submit("q", env(clusterTTL))
	waitOffers(t, fc, j2.ID, 1)
	c.End(j2.ID, 1, "", "", nil)

	a.Output(j.ID, oa.Gen, []byte(`2`))
	a.End(j.ID, oa.Gen, "", "", nil)
	wantDrained(t, done, 0)
	n1.waitState(j.ID, core.StateCompleted)
	if got := outputsOf(t, j); !slices.Equal(got, []string{"1", "2"}) {
		t.Fatalf("outputs %q", got)
	}
	net.settle()
	if len(fa.Offers()) != 1 || len(fa.Closes()) != 0 {
		t.Fatalf("the draining node's worker: offers %+v, closes %v; want the one job and an open session", fa.Offers(), fa.Closes())
	}
}

// Jobs waiting on a dispatcher that drains go back to their ingress, which
// sends them to the heir; a forward that reaches the draining dispatcher
// after it resigned is taken and handed back, not refused. None of them is
// ever offered to the draining node's worker. Its own requesters' waiting
// jobs it keeps and dispatches to another node.
func TestDrainHandsBackWaitingJobs(t *testing.T) {
	net, n1, n2, n3 := threeNodes(t)
	a, fa, busy, oa := offerOne(t, n1, n2)
	waiting := n1.submit("q", env(clusterTTL))
	own := n2.submit("q", env(clusterTTL))
	n2.wantQueue(t, 2, anyCount, "before the drain")
	// n3's consumer registers while n3 is not routable for n2, so both jobs
	// keep waiting on n2 until the drain.
	net.setRoutable("n3", false)
	c, fc := n3.worker("q", "c", 3)
	net.settle()
	net.setRoutable("n3", true)
	done := n2.drain(time.Minute)
	waitResigned(t, net, "n2")
	oc := offerAt(t, fc, waiting.ID, 2)
	// n2 sends its own requester's job to n3's consumer itself.
	ocOwn := waitOffers(t, fc, own.ID, 1)[0]

	// A forward from a view that still names n2 (routable, as it was).
	net.setDispatcher("q", "n2")
	net.setRoutable("n2", true)
	late := n1.submit("q", env(clusterTTL))
	net.setRoutable("n2", false)
	net.setDispatcher("q", "n3")
	n1.e.ClusterChanged()
	net.settle()
	if v := n1.view(late.ID); v.State.Terminal() {
		t.Fatalf("the late forward ended %s %s", v.Code, v.Detail)
	}
	ol := waitOffers(t, fc, late.ID, 1)[0]

	for _, j := range []struct {
		id  string
		gen uint64
	}{{waiting.ID, oc.Gen}, {own.ID, ocOwn.Gen}, {late.ID, ol.Gen}} {
		c.End(j.id, j.gen, "", "", nil)
	}
	a.End(busy.ID, oa.Gen, "", "", nil)
	wantDrained(t, done, anyCount)
	net.settle()
	n1.waitState(waiting.ID, core.StateCompleted)
	n1.waitState(late.ID, core.StateCompleted)
	n2.waitState(own.ID, core.StateCompleted)
	if got := fa.Offers(); len(got) != 1 {
		t.Fatalf("the draining node's worker got %d offers, want only the first job's: %+v", len(got), got)
	}
	n2.wantQueue(t, 0, 0, "after its drain")
}

// wantRoutedPastDrained submits a job on n1 while the view names n2, a
// node that has drained, as q's dispatcher (and as routable): n2 refuses
// the forward as draining, having taken nothing, so the job is accepted,
// not refused, and routed again under a new generation once the view
// names n1.
func wantRoutedPastDrained(t *testing.T, net *fakeNet, n1 *clusterNode, opts core.SubmitOptions) {
	t.Helper()
	net.setDispatcher("q", "n2")
	net.setRoutable("n2", true)
	j, _, err := n1.e.Submit(context.Background(), "q", env(clusterTTL), opts)
	if err != nil {
		t.Fatalf("Submit with a drained dispatcher in the view = %v, want the job accepted and routed again", err)
	}
	net.setDispatcher("q", "n1")
	waitFor(t, 5*time.Second, "the refused job routed again under a new generation", func() bool {
		v, err := n1.e.View(j.ID)
		return err == nil && v.Generation >= 2 && !v.State.Terminal()
	})
}

// At the drain's deadline a job the draining node's worker still runs for
// another node's requester is stopped there and released: without output it
// runs again on another node; with output it fails worker_lost. The
// node's own requester's job ends node_shutdown.
func TestDrainTimeoutReleasesRunningJobs(t *testing.T) {
	net, n1, n2, n3 := threeNodes(t)
	a, fa := n2.worker("q", "a", 3)
	quiet := n1.submit("q", env(clusterTTL))
	loud := n1.submit("q", env(clusterTTL))
	own := n2.submit("q", env(clusterTTL))
	oq := waitOffers(t, fa, quiet.ID, 1)[0]
	ol := waitOffers(t, fa, loud.ID, 1)[0]
	waitOffers(t, fa, own.ID, 1)
	a.Accept(quiet.ID, oq.Gen)
	a.Output(loud.ID, ol.Gen, []byte(`1`))
	waitFor(t, 5*time.Second, "the output at the ingress", func() bool { return n1.view(loud.ID).Outputs == 1 })
	c, fc := n3.worker("q", "c", 1)

	select {
	case n := <-n2.drain(100 * time.Millisecond):
		if n != 3 {
			t.Fatalf("Drain ended %d jobs, want 3", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Drain did not return at its deadline")
	}
	wantEnded(t, n2.harness, own, core.OutcomeFailed, core.CodeNodeShutdown)
	n1.waitState(loud.ID, core.StateFailed)
	wantEnded(t, n1.harness, loud, core.OutcomeFailed, core.CodeWorkerLost)
	oc := offerAt(t, fc, quiet.ID, 2)
	c.End(quiet.ID, oc.Gen, "", "", nil)
	n1.waitState(quiet.ID, core.StateCompleted)
	var reasons []core.Code
	for _, m := range fa.Cancels() {
		reasons = append(reasons, m.Reason)
	}
	if len(reasons) != 3 || slices.ContainsFunc(reasons, func(c core.Code) bool { return c != core.CodeNodeShutdown }) {
		t.Fatalf("cancels on the draining node's worker: %+v, want 3 × node_shutdown", fa.Cancels())
	}
	// A forward after the drain is refused as draining (the node is
	// closing): the job is accepted all the same and routed again, never
	// refused while a capable worker lives.
	wantRoutedPastDrained(t, net, n1, core.SubmitOptions{})
}

// A job running on a worker of its own ingress node, dispatched by another
// node, is held by the ingress: the dispatcher's death leaves it running.
func TestDispatcherDeathSparesJobRunningAtIngress(t *testing.T) {
	net, n1, _ := twoNodes(t)
	a, fa := n1.worker("q", "a", 1)
	// n1 reaches n2 as dispatcher, which delivers to n1's consumer.
	j := n1.submit("q", env(clusterTTL))
	o := waitOffers(t, fa, j.ID, 1)[0]
	a.Output(j.ID, o.Gen, []byte(`1`))
	net.settle()

	net.kill("n2")
	n1.e.ClusterChanged()
	net.settle()
	if v := n1.view(j.ID); v.State != core.StateRunning {
		t.Fatalf("after its dispatcher died: %s %s %s, want running", v.State, v.Code, v.Detail)
	}
	a.End(j.ID, o.Gen, "", "", nil)
	n1.waitState(j.ID, core.StateCompleted)
	if len(fa.offersFor(j.ID)) != 1 {
		t.Fatalf("offers %+v", fa.offersFor(j.ID))
	}
}

// A consumer that left before its job reached it is no refusal: the job
// goes back to its queue and waits for a capable worker (here one that
// registers later), instead of failing rejected.
func TestConsumerLeftIsNotARefusal(t *testing.T) {
	net, n1, n2, n3 := threeNodes(t)
	b, _ := n3.worker("q", "b", 1)
	j := submitDeliveryHeld(net, n1)
	// b leaves with the delivery on its way: n2 has not seen it go yet.
	b.Detach(context.Background())
	net.unhold("n2", "n3")
	net.settle()
	v := n1.view(j.ID)
	if v.State.Terminal() {
		t.Fatalf("the job ended %s %q when its only worker left", v.Code, v.Detail)
	}
	for _, s := range net.sentFor(j.ID) {
		if s.Kind == core.MsgRelease && s.Msg.Rejected {
			t.Fatalf("a consumer that left counted as a refusal: %+v", s.Msg)
		}
	}
	d, fd := n3.worker("q", "d", 1)
	n2.e.ClusterChanged() // the view shows n2 the new consumer
	od := waitOffers(t, fd, j.ID, 1)[0]
	d.End(j.ID, od.Gen, "", "", nil)
	n1.waitState(j.ID, core.StateCompleted)
	if strings.Contains(n1.view(j.ID).Detail, "refused") {
		t.Fatalf("detail %q", n1.view(j.ID).Detail)
	}
}

// A worker that registers with a draining node is refused, and leaves no
// consumer record behind that other nodes would count.
func TestDrainRefusesWorkersWithoutARecord(t *testing.T) {
	net := newFakeNet(t)
	n1 := net.add("n1", nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	n1.e.Drain(ctx)
	_, err := n1.e.AttachWorker(context.Background(), core.WorkerSpec{Queue: "q"}, &fakeConn{})
	wantCode(t, err, core.CodeDraining)
	if cs := net.cat.Consumers("q"); len(cs) != 0 {
		t.Fatalf("consumer records after a refused registration: %+v", cs)
	}
}

// A node whose resign failed (its catalog did not answer) keeps the jobs
// waiting on it and dispatches them to consumers on other nodes itself:
// handing them back would only bring them back while its records still
// name it.
func TestDrainWithoutResignKeepsWaitingJobs(t *testing.T) {
	net, n1, n2, n3 := threeNodes(t)
	a, _, busy, oa := offerOne(t, n1, n2)
	net.setRoutable("n3", false)
	c, fc := n3.worker("q", "c", 1)
	waiting := n1.submit("q", env(clusterTTL))
	net.setRoutable("n3", true)
	net.mu.Lock()
	net.resignErr = errors.New("etcdserver: request timed out")
	net.mu.Unlock()

	done := n2.drain(time.Minute)
	oc := waitOffers(t, fc, waiting.ID, 1)[0]
	if oc.Gen != 1 {
		t.Fatalf("offered with gen %d, want 1: the job should not have gone back", oc.Gen)
	}
	for _, s := range net.sentFor(waiting.ID) {
		if s.Kind == core.MsgRelease {
			t.Fatalf("the job was handed back although n2 still dispatches: %v", net.sentFor(waiting.ID))
		}
	}
	c.End(waiting.ID, oc.Gen, "", "", nil)
	a.End(busy.ID, oa.Gen, "", "", nil)
	wantDrained(t, done, anyCount)
	n1.waitState(waiting.ID, core.StateCompleted)
	n1.waitState(busy.ID, core.StateCompleted)
}
