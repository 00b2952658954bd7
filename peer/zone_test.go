package peer_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/peer"
)

// zoned is the i-th deliver of job, scoped to zone.
func zoned(job, zone string, i int) core.Message {
	m := deliverMsg("q", job, i)
	m.Delivery.Zone = zone
	return m
}

// A delivery stream's Deliver stream passes the zone test when it opens and
// again whenever zones change: once its node's label changes, the stream is
// closed; an unacked delivery scoped to the old zone goes back to the
// engine (ReasonZone) instead of being resent, an unscoped one behind it is
// resent; from then on a delivery for the old zone is never sent, one for
// the new zone opens a new stream, and a node with no label takes no
// zone-scoped delivery at all.
func TestDeliveryZoneTest(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	h := &gatedRecorder{block: func(m core.Message) {
		if m.JobID == "held" {
			once.Do(func() { <-release })
		}
	}}
	b := startServerOn(t, "127.0.0.1:0", "b", h)
	var mu sync.Mutex
	zone := "z1"
	var reports []string
	r := newRouter(t, "a", secret, newBook("b", b.addr).Addr, func(c *peer.Config) {
		fastDeliveries(5*time.Second, 30*time.Second, time.Second)(c)
		c.Zone = func(node string) (string, bool) {
			mu.Lock()
			defer mu.Unlock()
			return zone, node == "b"
		}
	})
	r.Start(&recorder{undeliverable: func(node string, m core.Message, reason string) {
		mu.Lock()
		defer mu.Unlock()
		reports = append(reports, fmt.Sprintf("%s/%s/%s", node, m.JobID, reason))
	}})
	setZone := func(z string) {
		mu.Lock()
		zone = z
		mu.Unlock()
		r.ZonesChanged()
	}
	reported := func() string {
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprint(reports)
	}

	r.Send("b", zoned("in", "z1", 0))
	waitFor(t, 5*time.Second, "the in-zone delivery", func() bool { return h.handled("in") == 1 })
	r.Send("b", zoned("held", "z1", 0))   // the receiver holds it: unacked
	r.Send("b", zoned("unscoped", "", 0)) // behind it on the stream
	time.Sleep(100 * time.Millisecond)    // both on the stream
	setZone("z2")
	waitFor(t, 5*time.Second, "the zone close", func() bool {
		return counter(t, r.reg, "switchyard_peer_stream_zone_closes_total", nil) == 1
	})
	// The close is counted before the held delivery is handed back.
	waitFor(t, 5*time.Second, "the held delivery handed back", func() bool { return reported() != "[]" })
	if got, want := reported(), "[b/held/zone]"; got != want {
		t.Errorf("reports after the zone change = %s, want %s", got, want)
	}
	close(release)
	waitFor(t, 5*time.Second, "the unscoped delivery", func() bool { return h.handled("unscoped") == 1 })

	r.Send("b", zoned("old", "z1", 0))
	r.Send("b", zoned("new", "z2", 0))
	waitFor(t, 5*time.Second, "the new zone's delivery", func() bool { return h.handled("new") == 1 })
	waitSent(t, r, "b")
	if h.handled("old") != 0 {
		t.Errorf("a delivery scoped to the node's old zone was sent")
	}
	if got, want := reported(), "[b/held/zone b/old/zone]"; got != want {
		t.Errorf("reports = %s, want %s", got, want)
	}

	// No label is no zone: a zone-scoped delivery is refused, an unscoped
	// one goes.
	setZone("")
	r.Send("b", zoned("unlabelled", "z2", 0))
	r.Send("b", zoned("unscoped2", "", 0))
	waitFor(t, 5*time.Second, "the unscoped delivery", func() bool { return h.handled("unscoped2") == 1 })
	waitSent(t, r, "b")
	if got, want := reported(), "[b/held/zone b/old/zone b/unlabelled/zone]"; got != want {
		t.Errorf("reports = %s, want %s", got, want)
	}
	wantCounters(t, r.reg, map[string]float64{
		"switchyard_peer_stream_zone_closes_total": 2, // z1 → z2, z2 → none
		"switchyard_peer_streams_opened_total":     3,
		"switchyard_peer_unary_fallbacks_total":    0,
	})
	if got := counter(t, r.reg, "switchyard_peer_messages_undeliverable_total", map[string]string{"reason": "zone"}); got != 3 {
		t.Errorf("undeliverable{reason=zone} = %v, want 3", got)
	}
	if got := h.handled("held"); got > 1 {
		t.Errorf("the held delivery was handled %d times", got)
	}
}
