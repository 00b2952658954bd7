package peer_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/peer"
)

// Tests of fencing by incarnation: a job (forward, deliver) names the
// incarnation of the node it is meant for, and is dropped by the sender or
// the receiver once that node is another incarnation.

// incarnations is a settable view of each node's incarnation, or a node's
// own.
type incarnations struct {
	mu sync.Mutex
	m  map[string]string
}

func newIncarnations(kv ...string) *incarnations { return &incarnations{m: pairs(kv...)} }

func (in *incarnations) of(node string) string {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.m[node]
}

func (in *incarnations) set(node, inc string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.m[node] = inc
}

func staleCount(t *testing.T, n tnode, kind, side string) float64 {
	t.Helper()
	return counter(t, n.reg, "switchyard_peer_stale_incarnation_total", map[string]string{"kind": kind, "side": side})
}

// A job stamped for a previous incarnation of its node is dropped by the
// node's new incarnation and counted, by either path; one stamped for the
// node as it is, or not stamped (the sender's view had no record of it),
// is taken. A forward so dropped fails with core.ErrNodeReplaced, and the
// dispatcher is never asked.
func TestStaleIncarnationIsDroppedByTheReceiver(t *testing.T) {
	for _, tc := range []struct {
		name  string
		unary bool
	}{
		{"stream", false},
		{"unary", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &recorder{}
			self := newIncarnations("b", "inc-2")
			b := startNode(t, "b", "127.0.0.1:0", h, func(c *peer.Config) { c.Self = func() string { return self.of("b") } })
			view := newIncarnations("b", "inc-1")
			r := newRouter(t, "a", secret, newBook("b", b.addr).Addr, func(c *peer.Config) {
				c.Incarnation, c.ForceUnary = view.of, tc.unary
			})

			r.Send("b", deliverMsg("q", "old", 0)) // meant for inc-1: b is inc-2
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := r.Forward(ctx, "b", core.Delivery{JobID: "old-f", Queue: "q", Ingress: "a"})
			if !errors.Is(err, core.ErrNodeReplaced) {
				t.Fatalf("forward meant for a previous incarnation: got %v, want ErrNodeReplaced", err)
			}
			view.set("b", "inc-2")
			r.Send("b", deliverMsg("q", "new", 1)) // meant for inc-2
			view.set("b", "")
			r.Send("b", deliverMsg("q", "unknown", 2)) // no stamp
			if err := r.Forward(ctx, "b", core.Delivery{JobID: "unknown-f", Queue: "q", Ingress: "a"}); err != nil {
				t.Fatalf("forward with no stamp: %v", err)
			}
			waitFor(t, 10*time.Second, "the taken messages", func() bool { return len(h.messages()) >= 2 })
			waitSent(t, r, "b")
			var got []string
			for _, m := range h.messages() {
				got = append(got, m.m.JobID)
			}
			for _, f := range h.forwarded() {
				got = append(got, f.d.JobID)
			}
			if want := "new unknown unknown-f"; joined(got) != want {
				t.Errorf("taken %q, want %q", joined(got), want)
			}
			for kind, want := range map[string]float64{"deliver": 1, "forward": 1} {
				if got := staleCount(t, b, kind, "receiver"); got != want {
					t.Errorf("stale %s at the receiver = %v, want %v", kind, got, want)
				}
				if got := staleCount(t, r, kind, "sender"); got != 0 {
					t.Errorf("stale %s at the sender = %v, want 0", kind, got)
				}
			}
		})
	}
}

func joined(s []string) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += " "
		}
		out += x
	}
	return out
}

// The failure this fences (docs/cluster.md, "Incarnations"): a node is
// restarted while a peer's delivery stream holds deliveries for it unacked;
// the delivery stream's Deliver stream is dropped and its unacked items
// resent by unary calls. The resend keeps each item's stamp, the
// incarnation it was queued for, so the node's new incarnation drops them
// (the sender's view still names the old one), or the sender does (its view
// names the new one already). A job queued once the view names the new
// incarnation is taken.
func TestResentItemKeepsItsIncarnation(t *testing.T) {
	for _, c := range []struct {
		name       string
		viewMoved  bool // the sender's view names the new incarnation before the resend
		atSender   float64
		atReceiver float64
	}{
		// The receiver skips gen 0, which it took already, by its number.
		{"view-lags", false, 0, 4},
		// The sender drops all 5: it does not know gen 0 was taken. The
		// receiver drops the dropped stream's copies of 1..4 if it reads
		// them before it sees the stream end (-1: not checked).
		{"view-moved", true, 5, -1},
	} {
		t.Run(c.name, func(t *testing.T) {
			self := newIncarnations("b", "inc-1")
			held, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			h := &gatedRecorder{block: func(m core.Message) {
				if m.JobID == "j" && m.Gen == 0 {
					once.Do(func() { close(held); <-release })
				}
			}}
			b := startNode(t, "b", "127.0.0.1:0", h, func(cfg *peer.Config) { cfg.Self = func() string { return self.of("b") } })
			view := newIncarnations("b", "inc-1")
			const ack = 200 * time.Millisecond
			r := newRouter(t, "a", secret, newBook("b", b.addr).Addr, func(cfg *peer.Config) {
				fastDeliveries(ack, 10*ack, 50*time.Millisecond)(cfg)
				cfg.Incarnation = view.of
			})

			const n = 5
			for i := range n {
				r.Send("b", deliverMsg("q", "j", i))
			}
			<-held
			// gen 0 was taken by inc-1, and its handler holds the delivery
			// stream while the node "restarts" as inc-2: the stream misses
			// its ack deadline and 1..4 are resent.
			self.set("b", "inc-2")
			if c.viewMoved {
				view.set("b", "inc-2")
			}
			waitFor(t, 5*time.Second, "the fallback", func() bool {
				return counter(t, r.reg, "switchyard_peer_unary_fallbacks_total", nil) >= 1
			})
			close(release)
			waitSent(t, r, "b")
			view.set("b", "inc-2")
			r.Send("b", deliverMsg("q", "after", 0))
			waitFor(t, 10*time.Second, "the job queued for the new incarnation", func() bool { return h.handled("after") > 0 })
			var got []string
			for _, m := range h.messages() {
				got = append(got, m.m.JobID)
			}
			if want := "j after"; joined(got) != want {
				t.Errorf("taken %q, want %q (only gen 0 of j, taken before the restart)", joined(got), want)
			}
			if got := staleCount(t, r, "deliver", "sender"); got != c.atSender {
				t.Errorf("stale at the sender = %v, want %v", got, c.atSender)
			}
			if got := staleCount(t, b, "deliver", "receiver"); c.atReceiver >= 0 && got != c.atReceiver {
				t.Errorf("stale at the receiver = %v, want %v", got, c.atReceiver)
			}
		})
	}
}

// A forward retried while its node does not answer fails once the view
// names the node under another incarnation: it was meant for the one that
// died, and its caller re-forwards the job under a new generation, which
// the new incarnation may take. Re-stamping the retry would have the new
// incarnation take the old generation too.
func TestForwardRetryEndsWhenTheNodeIsReplaced(t *testing.T) {
	// b is the node's new incarnation; its routing calls are Unavailable
	// until Start.
	b := startNode(t, "b", "127.0.0.1:0", nil, func(c *peer.Config) { c.Self = func() string { return "inc-2" } })
	view := newIncarnations("b", "inc-1")
	r := newRouter(t, "a", secret, newBook("b", b.addr).Addr, func(c *peer.Config) { c.Incarnation = view.of })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- r.Forward(ctx, "b", core.Delivery{JobID: "f", Queue: "q", Ingress: "a"}) }()
	waitFor(t, 5*time.Second, "a failed attempt", func() bool {
		return counter(t, r.reg, "switchyard_peer_send_failures_total", nil) >= 1
	})
	view.set("b", "inc-2")
	h := &recorder{}
	b.Start(h)
	if err := <-errc; !errors.Is(err, core.ErrNodeReplaced) {
		t.Fatalf("forward: got %v, want ErrNodeReplaced", err)
	}
	if got := len(h.forwarded()); got != 0 {
		t.Errorf("the new incarnation was asked %d times, want never", got)
	}
	// An attempt already past the sender's check when the view moved is
	// dropped by the receiver.
	if got := staleCount(t, r, "forward", "sender") + staleCount(t, b, "forward", "receiver"); got != 1 {
		t.Errorf("stale forwards = %v, want 1", got)
	}
}
