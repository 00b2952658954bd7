package peer

import (
	"fmt"

	"github.com/switchyard/switchyard/internal/chans"

	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// The zone test on the request leg: a zone-scoped delivery goes only to a
// node whose zone label in the catalog view is the job's, at the time it
// is sent (docs/cluster.md, "Zones").

// inZone is the zone test of an item: a delivery of a zone-scoped job goes
// only to a node whose zone label in the catalog view is the job's. Every
// other item passes: forwards go to a dispatcher, whose zone does not
// matter (only where a job runs does), and a cancel or unbind must reach a
// job wherever it is.
func (l *deliveryStream) inZone(it *item) bool {
	zone := it.msg.GetDelivery().GetZone()
	if it.fwd != nil || it.msg.GetKind() != pb.PeerMessage_KIND_DELIVER || zone == "" {
		return true
	}
	nz, ok := l.r.zoneOf(l.key.node)
	return ok && nz == zone
}

func (l *deliveryStream) zoneErr(it *item) error {
	nz, ok := l.r.zoneOf(l.key.node)
	if !ok {
		nz = "none"
	}
	return fmt.Errorf("job %s is scoped to zone %q; node %s is in zone %q", jobOf(it), it.msg.GetDelivery().GetZone(), l.key.node, nz)
}

// zoneCheck applies the zone test to the delivery stream's Deliver stream
// again after zones changed in the catalog view. A stream opened while its
// node had another zone label (or none) no longer passes: it is closed, its
// unacked deliveries that fail the test now go back to the engine to be
// routed again (ReasonZone), and the rest are resent by unary calls, in
// order, as after a stall; the next item opens a stream under the node's
// new label.
func (l *deliveryStream) zoneCheck() {
	r := l.r
	st := l.st
	if st == nil || r.ctx.Err() != nil {
		return
	}
	if nz, ok := r.zoneOf(l.key.node); ok == st.zoned && nz == st.zone {
		return
	}
	l.dropStream()
	r.m.zoneCloses.Inc()
	r.log.Info("deliver stream closed: its node's zone changed", "node", l.key.node, "queue", l.key.queue, "was", st.zone, "unacked", len(l.unacked))
	items := l.unacked
	l.unacked = nil
	l.ackTimer.Stop()
	keep := items[:0]
	for _, it := range items {
		if it.fwd == nil && !l.inZone(it) {
			r.undeliverable(l.key.node, it.msg, nil, ReasonZone, l.zoneErr(it))
			continue
		}
		keep = append(keep, it)
	}
	clear(items[len(keep):])
	l.unary(keep)
}

// zoneOf is node's zone label in the catalog view.
func (r *router) zoneOf(node string) (string, bool) {
	if r.cfg.Zone == nil {
		return "", false
	}
	z, ok := r.cfg.Zone(node)
	return z, ok && z != ""
}

// ZonesChanged applies the zone test again to every open Deliver stream:
// one opened while its node had another zone label is closed, and what it
// held is sent again under the node's new label (or handed back to the
// engine; see delivery stream.zoneCheck). The node calls it on every change
// of its catalog view; it never blocks.
func (t *Transport) ZonesChanged() {
	r := t.rt
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range r.deliveries {
		chans.Notify(l.rezone)
	}
}
