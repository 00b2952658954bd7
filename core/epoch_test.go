package core_test

import (
	"testing"
	"time"

	"github.com/switchyard/switchyard/core"
)

// A delivery from a dispatcher that has been replaced (its epoch older than
// the one the host has seen for the queue, under another node) is not
// offered: the host hands it back to the ingress unrun, which sends it to
// the new dispatcher under a new generation. The old dispatcher waking up
// mid-offer binds nothing the new one binds.
func TestClusterStaleEpochDeliveryHandedBack(t *testing.T) {
	net, n1, n2, n3 := threeNodes(t)
	w, fc := n3.worker("q", "w", 4)
	old := net.epoch("q")

	// n2 binds the job to n3's worker; the delivery is held on the way,
	// as one sent just before n2 paused.
	net.hold("n2", "n3")
	j := n1.submit("q", env(clusterTTL))
	waitFor(t, 5*time.Second, "n2 to bind the job", func() bool { return n2.queueStat("q").Bound == 1 })
	// n3 takes the queue over (n2 was suspected): a newer epoch.
	net.setDispatcher("q", "n3")
	if net.epoch("q") <= old {
		t.Fatalf("epoch %d after the takeover, want above %d", net.epoch("q"), old)
	}
	net.unhold("n2", "n3")
	net.settle()

	o := waitOffers(t, fc, j.ID, 1)[0]
	if o.Gen != 2 {
		t.Fatalf("offered gen %d, want 2: the stale delivery (gen 1) must not reach the worker", o.Gen)
	}
	wantMetric(t, n3, 1, "switchyard_dispatch_stale_epoch_total")
	w.End(j.ID, o.Gen, "", "", nil)
	n1.waitState(j.ID, core.StateCompleted)
	net.settle()
	n2.wantQueue(t, 0, 0, "the replaced dispatcher still holds the job")
}

// A dispatcher whose record comes to name another node steps down: the
// jobs waiting in its queue go back to their ingress, which sends them to
// the new dispatcher under a new generation; the job it had bound runs on
// where it is.
func TestClusterStepDownHandsBackWaitingJobs(t *testing.T) {
	net, n1, n2, n3 := threeNodes(t)
	w, fc := n3.worker("q", "w", 1)
	running := n1.submit("q", env(clusterTTL))
	o1 := waitOffers(t, fc, running.ID, 1)[0]
	w.Accept(running.ID, o1.Gen)
	waiting := n1.submit("q", env(clusterTTL))
	waitFor(t, 5*time.Second, "the second job to wait on n2", func() bool { return n2.queueStat("q").Depth == 1 })

	net.setDispatcher("q", "n3")
	n2.e.ClusterChanged()
	net.settle()
	wantMetric(t, n2, 1, "switchyard_dispatch_step_downs_total")
	n2.wantQueue(t, 0, 1, "after stepping down: nothing waiting and the running job still bound")
	waitFor(t, 5*time.Second, "the waiting job on n3", func() bool { return n3.queueStat("q").Depth == 1 })

	// The running job ends where it ran; the waiting one then runs, once,
	// under its second generation.
	w.End(running.ID, o1.Gen, "", "", nil)
	n1.waitState(running.ID, core.StateCompleted)
	o2 := offerAt(t, fc, waiting.ID, 2)
	w.End(waiting.ID, o2.Gen, "", "", nil)
	n1.waitState(waiting.ID, core.StateCompleted)
	net.settle()
	n2.wantQueue(t, anyCount, 0, "still holds a binding")
}

// A suspected node is offered nothing new, by any dispatcher; its
// consumers still count as capable, so a job only they can run is
// accepted and waits rather than being refused no_capable_worker. When the
// node answers again, the job goes to it. The stall shows in
// switchyard_queue_stalled_seconds.
func TestClusterSuspectedHostGetsNoOffers(t *testing.T) {
	net := newFakeNet(t)
	n1, n3 := net.add("n1", nil), net.add("n3", nil)
	net.setDispatcher("q", "n1")
	w, fc := n3.worker("q", "w", 1)
	net.setSuspected("n3", true)

	j := n1.submit("q", env(clusterTTL))
	time.Sleep(50 * time.Millisecond)
	net.settle()
	if o := fc.offersFor(j.ID); len(o) != 0 {
		t.Fatalf("a suspected host was offered the job: %+v", o)
	}
	n1.wantQueue(t, 1, anyCount, "the job waiting")
	if c := n1.metric("switchyard_queue_stalled_seconds"); c != 0 {
		t.Fatalf("stalled histogram count %v before any binding, want 0", c)
	}

	net.setSuspected("n3", false)
	n1.e.ClusterChanged()
	o := waitOffers(t, fc, j.ID, 1)[0]
	w.End(j.ID, o.Gen, "", "", nil)
	n1.waitState(j.ID, core.StateCompleted)
	if c := n1.metric("switchyard_queue_stalled_seconds"); c != 1 {
		t.Errorf("stalled histogram count %v, want 1 (one binding)", c)
	}
}
