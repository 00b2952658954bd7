package core_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/switchyard/switchyard/core"
)

// A fenced node comes back: Unfence republishes its live workers'
// consumer records, takes jobs again, and a later graceful drain still
// waits for the jobs it holds (the fence had closed the drain's "nothing
// open" signal; Unfence makes a fresh one).
func TestUnfenceTakesJobsAgain(t *testing.T) {
	net := newFakeNet(t)
	n1 := net.add("n1", nil)
	w, fc := n1.worker("q", "w", 2)
	before := n1.submit("q", env(clusterTTL))
	o := waitOffers(t, fc, before.ID, 1)[0]
	w.Accept(before.ID, o.Gen)

	net.setLease("n1", false)
	n1.e.Fence()
	wantEnded(t, n1.harness, before, core.OutcomeFailed, core.CodeNodeShutdown)
	if _, _, err := n1.e.Submit(context.Background(), "q", env(clusterTTL), core.SubmitOptions{}); err == nil {
		t.Fatal("Submit on a fenced node = nil")
	}
	// The fence's records go with its lease.
	net.cat.Withdraw(func(core.ConsumerInfo) bool { return true })

	net.setLease("n1", true)
	if err := n1.e.Unfence(context.Background()); err != nil {
		t.Fatalf("Unfence: %v", err)
	}
	if n1.e.Draining() || n1.e.Fenced() {
		t.Fatal("still draining or fenced after Unfence")
	}
	if got := net.cat.Consumers("q"); len(got) != 1 || got[0].ID != w.ID {
		t.Fatalf("consumer records after Unfence = %+v, want the live worker %s again", got, w.ID)
	}
	if err := n1.e.Unfence(context.Background()); !errors.Is(err, core.ErrNotFenced) {
		t.Fatalf("second Unfence = %v, want ErrNotFenced", err)
	}

	after := n1.submit("q", env(clusterTTL))
	oa := waitOffers(t, fc, after.ID, 1)[0]
	w.Accept(after.ID, oa.Gen)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	ended := n1.e.Drain(ctx)
	cancel()
	if ended != 1 || time.Since(start) < 150*time.Millisecond {
		t.Fatalf("Drain after Unfence ended %d jobs after %v, want it to wait for the open job and end 1", ended, time.Since(start))
	}
	if err := n1.e.Unfence(context.Background()); !errors.Is(err, core.ErrNotFenced) {
		t.Fatalf("Unfence of a draining node = %v, want ErrNotFenced", err)
	}
}

// A node seen back under a new incarnation (restarted inside its lease, or
// recovered from a fence before its record left the view) is the proven
// death of the previous one: the ingress releases at once what that one
// held, as for a node whose record is gone. A job with output fails
// worker_lost; one without goes to the queue's dispatcher again.
func TestClusterNewIncarnationIsDeath(t *testing.T) {
	net := newFakeNet(t)
	n1, n2, n3 := net.add("n1", nil), net.add("n2", nil), net.add("n3", nil)
	for _, n := range []string{"n1", "n2", "n3"} {
		net.cat.SetIncarnation(n, "1")
	}
	n1.e.ClusterChanged()
	net.setDispatcher("q", "n2")
	a, fa := n2.worker("q", "a", 2)
	c, fc := n3.worker("q", "c", 1)

	quiet, loud, _, _ := quietAndLoud(t, n1, a, fa)
	net.settle()

	// n2 comes back: same name, still online and routable, new incarnation.
	net.setDispatcher("q", "n3")
	net.cat.SetIncarnation("n2", "2")
	n1.e.ClusterChanged()

	wantEnded(t, n1.harness, loud, core.OutcomeFailed, core.CodeWorkerLost)
	oc := offerAt(t, fc, quiet.ID, 2)
	c.End(quiet.ID, oc.Gen, "", "", nil)
	n1.waitState(quiet.ID, core.StateCompleted)
	wantMetric(t, n1, 1, "switchyard_cluster_incarnations_replaced_total")
	net.wantForwards(t, quiet.ID, "forward n1>n2 (call) gen 1", "forward n1>n3 gen 2")
	// Seen once: the next view change releases nothing more.
	n1.e.ClusterChanged()
	wantMetric(t, n1, 1, "switchyard_cluster_incarnations_replaced_total")
}
