package peer

import (
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/switchyard/switchyard/core"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// Fencing by incarnation (docs/cluster.md, "Incarnations"). A job sent to
// a node — a forward to its dispatcher, a deliver to its consumer host, the
// only messages that make a node take a binding (job, generation) — names
// the incarnation of that node it is meant for: the one the sender's
// catalog view named when the job was queued for the node. A resend keeps
// the stamp. The sender drops a job whose node the view names under
// another incarnation since, before sending it and before each resend; the
// receiver drops one stamped for an incarnation other than its own. Either
// way the incarnation it was meant for is dead, and the engine that sent
// it releases what that incarnation held when its view sees it replaced
// (core/membership.go): nothing is handed back from here but a forward's
// error, which wraps core.ErrNodeReplaced.
//
// Every other message acts only on a binding its receiver holds (a reply
// or release on the ingress's job of that generation, a cancel, unbind or
// grant on the binding), and a binding is only ever taken by the
// incarnation its forward or deliver was meant for: reaching another
// incarnation, such a message finds nothing to act on. Those carry no
// stamp: a stamp taken from a view that lags could name a previous
// incarnation of a node that is already answering for the job (an ingress
// back under a new incarnation whose job reached the host before its
// record did), and dropping a reply would lose output.

// incarnationOf is node's incarnation in the view: "" when it has no
// record of it (or no Config.Incarnation).
func (r *router) incarnationOf(node string) string {
	if r.cfg.Incarnation == nil {
		return ""
	}
	return r.cfg.Incarnation(node)
}

// replaced reports whether a job stamped inc for node is meant for an
// incarnation the view no longer names: it names another one. A view with
// no record of the node says nothing here (Addr tells a node gone from one
// not seen yet); an empty stamp is never replaced.
func (r *router) replaced(node, inc string) (now string, ok bool) {
	if inc == "" {
		return "", false
	}
	now = r.incarnationOf(node)
	return now, now != "" && now != inc
}

// stampOf is the incarnation an item's job is meant for ("" for items
// that carry no job).
func (it *item) stampOf() string {
	if it.fwd != nil {
		return it.fwd.GetIncarnation()
	}
	return it.msg.GetDelivery().GetIncarnation()
}

// fresh returns the items that may still be sent to the delivery stream's
// node: it drops (and counts) those stamped for an incarnation of it the
// view no longer names. A dropped forward fails with core.ErrNodeReplaced.
func (l *deliveryStream) fresh(items []*item) []*item {
	r := l.r
	ok := items[:0]
	var dropped int
	for _, it := range items {
		now, stale := r.replaced(l.key.node, it.stampOf())
		if !stale {
			ok = append(ok, it)
			continue
		}
		r.m.stale.WithLabelValues(it.kind, sideSender).Inc()
		r.log.Info("dropped a job queued for a previous incarnation of its node", "node", l.key.node, "queue", l.key.queue,
			"kind", it.kind, "job", jobOf(it), "meant_for", it.stampOf(), "incarnation", now)
		if it.fwd != nil {
			it.finish(nil, fmt.Errorf("%w: meant for incarnation %s, the view names %s", core.ErrNodeReplaced, it.stampOf(), now))
			continue
		}
		r.m.dropped.WithLabelValues(it.kind).Inc()
		dropped++
	}
	if dropped > 0 {
		r.m.queue.WithLabelValues(l.key.node).Sub(float64(dropped))
	}
	clear(items[len(ok):])
	return ok
}

// Sides of switchyard_peer_stale_incarnation_total.
const (
	sideSender   = "sender"
	sideReceiver = "receiver"
)

// stale reports whether job p, received from from as kind, was meant for
// an incarnation of this node other than its own now, and counts it. An
// empty stamp, or an incarnation this node does not know (no Config.Self),
// is never stale.
func (s *server) stale(from, kind string, p *pb.PeerDelivery) bool {
	inc := p.GetIncarnation()
	if inc == "" || s.cfg.Self == nil {
		return false
	}
	self := s.cfg.Self()
	if self == "" || inc == self {
		return false
	}
	s.cfg.Metrics.stale.WithLabelValues(kind, sideReceiver).Inc()
	s.cfg.Logger.Info("dropped a job meant for a previous incarnation of this node", "from", from, "kind", kind,
		"job", p.GetJobId(), "generation", p.GetGeneration(), "meant_for", inc, "incarnation", self)
	return true
}

// staleForward is the status a forward dropped by stale is answered with.
func staleForward(p *pb.PeerDelivery, self string) error {
	return status.Errorf(codes.NotFound, "peer: job %s was meant for incarnation %s of this node, which is %s now", p.GetJobId(), p.GetIncarnation(), self)
}

// replacedError is err as a forward's error: one the receiver answered for
// a previous incarnation (NotFound) wraps core.ErrNodeReplaced.
func replacedError(err error) error {
	if status.Code(err) == codes.NotFound {
		return fmt.Errorf("%w: %w", core.ErrNodeReplaced, err)
	}
	return err
}
