package core_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard/switchyard/core"
)

// Silence and proven death (silence.go, reroute.go): a silent node ends
// what depended on it within the heartbeat bound, a crash as a pause,
// without moving at-most-once; and a job is never refused for want of a
// dispatcher while a capable consumer lives.

// A job with no output on a host gone silent is not failed at silence: it
// waits for proof of the host's death and then runs again, once, under a
// new generation.
func TestSilentHostJobWithoutOutputRedeliveredOnProof(t *testing.T) {
	net, n1, n2, n3 := threeNodes(t)
	a, _, j, oa := offerOne(t, n1, n2)
	a.Accept(j.ID, oa.Gen)
	net.settle()

	n1.e.ResponseLegSilent("n2", j.ID, oa.Gen)
	if v := n1.view(j.ID); v.State.Terminal() || v.Generation != 1 {
		t.Fatalf("after silence alone: %+v, want the job still waiting for proof", v)
	}

	c, fc := n3.worker("q", "c", 1)
	net.kill("n2")
	net.setDispatcher("q", "n3")
	n1.e.ClusterChanged()
	n1.e.ClusterChanged() // a second look changes nothing: released once
	oc := offerAt(t, fc, j.ID, 2)
	c.Output(j.ID, oc.Gen, []byte(`"done"`))
	c.End(j.ID, oc.Gen, "", "", nil)
	n1.waitState(j.ID, core.StateCompleted)
	wantMetric(t, n1, 1, "switchyard_dispatch_reclaims_total")
	wantKinds(t, j, core.EventAccepted, core.EventOutput, core.EventDone)
	if n := len(fc.offersFor(j.ID)); n != 1 {
		t.Fatalf("offered %d times on n3", n)
	}
}

// A host that was only paused comes back and completes the job it held
// with no output: silence threw nothing away.
func TestSilentHostThatComesBackCompletes(t *testing.T) {
	_, n1, n2 := twoNodes(t)
	a, fa, j, oa := offerOne(t, n1, n2)
	a.Accept(j.ID, oa.Gen)

	n1.e.ResponseLegSilent("n2", j.ID, oa.Gen)
	a.Output(j.ID, oa.Gen, []byte(`1`))
	a.End(j.ID, oa.Gen, "", "", nil)
	n1.waitState(j.ID, core.StateCompleted)
	wantKinds(t, j, core.EventAccepted, core.EventOutput, core.EventDone)
	if n := len(fa.offersFor(j.ID)); n != 1 {
		t.Fatalf("offered %d times", n)
	}
}

// A job that produced output fails worker_lost at silence, and is never
// run again, not even once the host's death is proven.
func TestSilentHostJobWithOutputFailsAtSilence(t *testing.T) {
	net, n1, n2, n3 := threeNodes(t)
	a, _, j, oa := offerOne(t, n1, n2)
	a.Output(j.ID, oa.Gen, []byte(`"partial"`))
	waitFor(t, 5*time.Second, "the output at the ingress", func() bool { return n1.view(j.ID).Outputs == 1 })

	n1.e.ResponseLegSilent("n2", j.ID, oa.Gen)
	wantEnded(t, n1.harness, j, core.OutcomeFailed, core.CodeWorkerLost)

	_, fc := n3.worker("q", "c", 1)
	net.kill("n2")
	net.setDispatcher("q", "n3")
	n1.e.ClusterChanged()
	net.settle()
	if o := fc.offersFor(j.ID); len(o) != 0 {
		t.Fatalf("a job with output ran again: %+v", o)
	}
	wantMetric(t, n1, 0, "switchyard_dispatch_reclaims_total")
}

// A host whose ingress went silent stops the ingress's jobs on its
// workers and releases them to it: an ingress that comes back runs again
// the job that had no output, and fails worker_lost the one that had.
func TestSilentIngressStopsItsJobs(t *testing.T) {
	_, n1, n2 := twoNodes(t)
	a, fa := n2.worker("q", "a", 2)
	quiet, loud, oq, ol := quietAndLoud(t, n1, a, fa)

	n2.e.PeersSilent([]string{"n1"})
	cancels := map[string]core.Code{}
	for _, c := range fa.Cancels() {
		cancels[c.JobID] = c.Reason
	}
	if len(cancels) != 2 || cancels[quiet.ID] != core.CodeCancelled || cancels[loud.ID] != core.CodeCancelled {
		t.Fatalf("worker cancels %+v, want both jobs stopped", fa.Cancels())
	}
	a.End(quiet.ID, oq.Gen, core.CodeCancelled, "", nil)
	a.End(loud.ID, ol.Gen, core.CodeCancelled, "", nil)

	// n1 was only paused: it hears the releases.
	n2.e.PeersSilent(nil)
	n1.waitState(loud.ID, core.StateFailed)
	wantEnded(t, n1.harness, loud, core.OutcomeFailed, core.CodeWorkerLost)
	o2 := waitOffers(t, fa, quiet.ID, 2)[1]
	if o2.Gen != 2 {
		t.Fatalf("re-offered with gen %d, want 2", o2.Gen)
	}
	a.End(quiet.ID, o2.Gen, "", "", nil)
	n1.waitState(quiet.ID, core.StateCompleted)
}

// A host offers nothing for an ingress it holds silent: the delivery goes
// back to the ingress, which decides once it answers.
func TestSilentIngressJobIsNotOffered(t *testing.T) {
	net, n1, _, n3 := threeNodes(t)
	_, fc := n3.worker("q", "c", 1)
	n3.e.PeersSilent([]string{"n1"})
	j := n1.submit("q", env(clusterTTL))
	net.hold("n3", "n1")
	net.settle()
	if o := fc.offersFor(j.ID); len(o) != 0 {
		t.Fatalf("offered a silent ingress's job: %+v", o)
	}
	n3.e.PeersSilent(nil)
	net.unhold("n3", "n1")
	waitOffers(t, fc, j.ID, 1)
}

// silentDispatcher is the cluster of threeNodes where no forward reaches
// n2, q's dispatcher (paused, or killed and its record not gone yet), with
// a worker on n2, worker c on n3, and n1 waiting 50ms for a forward's
// verdict (ForwardWait).
func silentDispatcher(t *testing.T) (*fakeNet, *clusterNode, *core.Worker, *fakeConn) {
	t.Helper()
	net, n1, n2, n3 := threeNodes(t, func(c *core.Config) { c.ForwardWait = 50 * time.Millisecond })
	n2.worker("q", "a", 1)
	c, fc := n3.worker("q", "c", 1)
	net.mu.Lock()
	net.silentForward = func(node string) bool { return node == "n2" }
	net.mu.Unlock()
	return net, n1, c, fc
}

// A new job whose dispatcher does not answer (paused, or killed and its
// record not gone yet) is accepted within ForwardWait, not refused; once
// the dispatcher's death is proven it goes, under a new generation, to the
// queue's new dispatcher, and runs once.
func TestForwardToSilentDispatcherWaitsForTheNext(t *testing.T) {
	net, n1, c, fc := silentDispatcher(t)

	start := time.Now()
	j, _, err := n1.e.Submit(context.Background(), "q", env(clusterTTL), core.SubmitOptions{})
	if err != nil {
		t.Fatalf("Submit while the dispatcher is silent: %v, want the job accepted", err)
	}
	took := time.Since(start)
	t.Logf("Submit answered after %s (ForwardWait 50ms)", took)
	if v := n1.view(j.ID); v.State != core.StateQueued {
		t.Fatalf("after Submit: %+v", v)
	}
	wantKinds(t, j, core.EventAccepted)

	// n2 dies: its records go, n3's consumer claims the queue.
	net.kill("n2")
	net.setDispatcher("q", "n3")
	n1.e.ClusterChanged()
	oc := offerAt(t, fc, j.ID, 2)
	c.Output(j.ID, oc.Gen, []byte(`1`))
	c.End(j.ID, oc.Gen, "", "", nil)
	n1.waitState(j.ID, core.StateCompleted)
	net.settle()
	if n := len(fc.offersFor(j.ID)); n != 1 {
		t.Fatalf("offered %d times", n)
	}
	wantJobsTotal(t, n1.harness, map[core.Outcome]float64{core.OutcomeCompleted: 1})
}

// The same when the forward itself ends because the node is gone (the
// transport's "node not in the catalog") before this node's view acted:
// the job is re-routed by the forward's verdict, once.
func TestForwardFailsOnDeadDispatcherIsRerouted(t *testing.T) {
	net, n1, c, fc := silentDispatcher(t)
	j := n1.submit("q", env(clusterTTL))

	net.kill("n2") // the forward fails; n1's view is not told
	net.setDispatcher("q", "n3")
	oc := waitOffers(t, fc, j.ID, 1)[0]
	c.End(j.ID, oc.Gen, "", "", nil)
	n1.waitState(j.ID, core.StateCompleted)
	n1.e.ClusterChanged() // the death seen late releases nothing twice
	net.settle()
	if n := len(fc.offersFor(j.ID)); n != 1 {
		t.Fatalf("offered %d times", n)
	}
}

// A forward meant for an incarnation of the dispatcher's node that was
// replaced (the transport's core.ErrNodeReplaced) is not a refusal: that
// incarnation is dead and took nothing, so the job is accepted and goes
// back to its queue under a new generation, as for a dispatcher gone, and
// runs once.
func TestForwardToAReplacedIncarnationIsRerouted(t *testing.T) {
	net, n1, _, n3 := threeNodes(t)
	c, fc := n3.worker("q", "c", 1)
	var once atomic.Bool
	net.mu.Lock()
	net.replacedForward = func(node string) bool {
		if node != "n2" || !once.CompareAndSwap(false, true) {
			return false
		}
		// The view now names the queue's next dispatcher.
		net.setDispatcher("q", "n3")
		return true
	}
	net.mu.Unlock()
	j, _, err := n1.e.Submit(context.Background(), "q", env(clusterTTL), core.SubmitOptions{})
	if err != nil {
		t.Fatalf("Submit: %v, want the job accepted", err)
	}
	oc := waitOffers(t, fc, j.ID, 1)[0]
	if oc.Gen < 2 {
		t.Errorf("offered as generation %d, want a new one", oc.Gen)
	}
	c.End(j.ID, oc.Gen, "", "", nil)
	n1.waitState(j.ID, core.StateCompleted)
	net.settle()
	if n := len(fc.offersFor(j.ID)); n != 1 {
		t.Fatalf("offered %d times", n)
	}
}

// A job whose queue's record names no routable dispatcher, and whose
// elections keep failing (the old record cannot be taken over yet), waits
// — through any number of failed elections — and is forwarded to the
// dispatcher once one is found: never refused, never failed.
func TestAwaitDispatcherSurvivesFailedElections(t *testing.T) {
	net, n1, n2, n3 := threeNodes(t)
	n2.worker("q", "a", 1)
	c, fc := n3.worker("q", "c", 1)
	net.setRoutable("n2", false) // n2 is silent: spare in n1's view
	var elections atomic.Int32
	net.mu.Lock()
	net.electErr = func(string) error {
		elections.Add(1)
		return errors.New("fake: the record names n2, which is not routable")
	}
	net.mu.Unlock()

	j := n1.submit("q", env(clusterTTL))
	if v := n1.view(j.ID); v.State != core.StateQueued {
		t.Fatalf("after Submit: %+v", v)
	}
	waitFor(t, 5*time.Second, "three failed elections", func() bool { return elections.Load() >= 3 })
	if v := n1.view(j.ID); v.State.Terminal() {
		t.Fatalf("the job ended while it waited for a dispatcher: %+v", v)
	}

	// n2's record goes; n3 is elected.
	net.mu.Lock()
	net.electErr = nil
	net.mu.Unlock()
	net.kill("n2")
	net.setDispatcher("q", "n3")
	oc := waitOffers(t, fc, j.ID, 1)[0]
	c.End(j.ID, oc.Gen, "", "", nil)
	n1.waitState(j.ID, core.StateCompleted)
	t.Logf("%d failed elections before the dispatcher was found", elections.Load())
}

// A job waits for a dispatcher no longer than DispatcherWait: then it
// fails dispatcher_unavailable (it was accepted: this is its outcome, not
// a refusal).
func TestAwaitDispatcherBounded(t *testing.T) {
	net, n1, n2 := twoNodes(t, func(c *core.Config) { c.DispatcherWait = 150 * time.Millisecond; c.ForwardWait = 50 * time.Millisecond })
	n2.worker("q", "a", 1)
	net.mu.Lock()
	net.electErr = func(string) error { return errors.New("fake: no dispatcher") }
	net.mu.Unlock()
	net.setRoutable("n2", false)
	net.mu.Lock()
	net.routable["n2"] = true // capable, but the election keeps failing
	net.mu.Unlock()
	net.setDispatcher("q", "")
	j := n1.submit("q", env(clusterTTL))
	n1.waitState(j.ID, core.StateFailed)
	wantEnded(t, n1.harness, j, core.OutcomeFailed, core.CodeDispatcherUnavailable)
}

// Jobs that come back to their queue together (a lost worker's, a dead
// node's) line up ahead of new arrivals by the TTL they have left, the
// oldest first, whatever order they came back in.
func TestJobsThatComeBackLineUpByTTLLeft(t *testing.T) {
	h := newHarness(t, nil)
	w1, f1 := h.attach("q", 4)
	var old []*core.Job
	for range 4 {
		old = append(old, h.submit("q", env(clusterTTL)))
		time.Sleep(2 * time.Millisecond)
	}
	for _, j := range old {
		waitOffers(t, f1, j.ID, 1)
	}
	late := h.submit("q", env(clusterTTL)) // waits: w1 is full
	w1.Detach(context.Background())        // the four go back, in map order
	w2, f2 := h.attach("q", 1)
	var got []string
	for i := range 5 {
		o := f2.lastOffer(t)
		for len(f2.Offers()) != i+1 {
			time.Sleep(time.Millisecond)
			o = f2.lastOffer(t)
		}
		got = append(got, o.JobID)
		w2.End(o.JobID, o.Gen, "", "", nil)
	}
	want := []string{old[0].ID, old[1].ID, old[2].ID, old[3].ID, late.ID}
	if !slices.Equal(got, want) {
		t.Fatalf("offered %q, want the returned jobs oldest first, then the new one: %q", got, want)
	}
}

// A caller that leaves while its job's forward has no verdict yet gets an
// error, and the job is cancelled behind it (its cancel follows the
// forward to the dispatcher): nobody is left to read it.
func TestForwardCallerLeavesBeforeAccepted(t *testing.T) {
	net, n1, n2 := twoNodes(t)
	n2.worker("q", "a", 1)
	net.mu.Lock()
	net.silentForward = func(node string) bool { return node == "n2" }
	net.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	ended := 0
	_, _, err := n1.e.Submit(ctx, "q", env(clusterTTL), core.SubmitOptions{OnEnd: func() { ended++ }})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Submit = %v, want the caller's context error", err)
	}
	if ended != 0 {
		t.Fatalf("OnEnd called %d times for a Submit that returned an error", ended)
	}
	wantJobsTotal(t, n1.harness, map[core.Outcome]float64{core.OutcomeCancelled: 1})
	waitFor(t, 5*time.Second, "the cancel to n2", func() bool {
		for _, s := range net.sent() {
			if s.Kind == core.MsgCancel && s.To == "n2" {
				return true
			}
		}
		return false
	})
}

// Jobs waiting for their queue's next dispatcher leave for it in the order
// a queue would take them: a job a dead node held (going back under a new
// generation) before the jobs posted during the outage, and those by the
// TTL they have left. The new dispatcher binds each forward on arrival
// while it has free slots, so this order is the order they run in.
func TestAwaitingJobsLeaveReturnedFirstThenByTTL(t *testing.T) {
	net, n1, n2, n3 := threeNodes(t)
	a, _, held, oa := offerOne(t, n1, n2)
	a.Accept(held.ID, oa.Gen)
	net.settle()

	// n2 goes silent, and no election can replace it yet; n3's worker is
	// the capable consumer that lives.
	c, fc := n3.worker("q", "c", 1)
	net.setRoutable("n2", false)
	net.mu.Lock()
	net.electErr = func(string) error { return errors.New("fake: the record names n2, which is not routable") }
	net.mu.Unlock()
	var posted []*core.Job
	for range 4 {
		posted = append(posted, n1.submit("q", env(clusterTTL)))
		time.Sleep(2 * time.Millisecond)
	}
	// n2's death is proven: the job it held goes back under generation 2
	// and waits with the others.
	net.kill("n2")
	n1.e.ClusterChanged()
	if v := n1.view(held.ID); v.State.Terminal() || v.Generation != 2 {
		t.Fatalf("the dead node's job after proof: %+v, want it waiting under generation 2", v)
	}

	net.mu.Lock()
	net.electErr = nil
	net.mu.Unlock()
	net.setDispatcher("q", "n3")
	var got []string
	for i := range 5 {
		waitFor(t, 5*time.Second, "the next offer on n3", func() bool { return len(fc.Offers()) == i+1 })
		o := fc.lastOffer(t)
		got = append(got, o.JobID)
		c.End(o.JobID, o.Gen, "", "", nil)
	}
	want := []string{held.ID, posted[0].ID, posted[1].ID, posted[2].ID, posted[3].ID}
	if !slices.Equal(got, want) {
		t.Fatalf("n3 ran %q, want the returned job first, then the posted ones oldest first: %q", got, want)
	}
}

type callerKey struct{}

// A new job's first forward is made under its Submit caller's context
// (on its goroutine, bounded by ForwardWait): what the caller's context
// carries reaches it, and a caller that leaves ends it. One that got no
// verdict in time goes on from the background, under the engine's.
func TestFirstForwardUnderCallersContext(t *testing.T) {
	net, n1, n2 := twoNodes(t)
	n2.worker("q", "a", 1)
	var (
		mu   sync.Mutex
		seen []any
	)
	net.mu.Lock()
	net.onForward = func(ctx context.Context, node string) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, ctx.Value(callerKey{}))
	}
	net.mu.Unlock()
	ctx := context.WithValue(context.Background(), callerKey{}, "caller")
	// Submit returns once the verdict is in: the forward was made by then.
	j, _, err := n1.e.Submit(ctx, "q", env(clusterTTL), core.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if v := n1.view(j.ID); v.State.Terminal() {
		t.Fatalf("job %s", v.State)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 || seen[0] != "caller" {
		t.Fatalf("forwards saw %v of the caller's context, want one forward that saw it", seen)
	}
}
