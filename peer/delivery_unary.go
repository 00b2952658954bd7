package peer

import (
	"context"
	"log/slog"

	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// A delivery stream's unary path: its items as Post and Forward calls, one
// call at a time, when it has no stream (ForceUnary, an open that failed)
// and to resend what a dropped stream held unacked.

// unary sends items in order by unary calls: runs of messages as Posts
// (each resent until handed over), forwards as one Forward attempt each.
func (l *deliveryStream) unary(items []*item) {
	r := l.r
	// A resend (after a dropped stream) may hold jobs for an incarnation
	// of the node the view no longer names.
	items = l.fresh(items)
	for len(items) > 0 {
		if r.ctx.Err() != nil {
			l.drop(items, ErrClosed)
			return
		}
		if items[0].fwd != nil {
			l.forwardOnce(items[0])
			items = items[1:]
			continue
		}
		n, size := 0, 0
		for n < len(items) && items[n].fwd == nil && (n == 0 || size+items[n].cost <= r.maxUnicast) {
			size += items[n].cost
			n++
		}
		switch l.unicast(items[:n]) {
		case unicastGone:
			l.gone(items)
			return
		case unicastClosed:
			l.drop(items, ErrClosed)
			return
		}
		items = items[n:]
	}
}

type unicastOutcome int

const (
	unicastSent unicastOutcome = iota
	unicastRefused
	unicastGone
	unicastClosed
)

// unicast sends one run of messages as a Post naming the delivery stream,
// resending it unchanged until it is handed over, the node leaves the
// catalog (unicastGone: nothing dropped yet), the peer refuses it for good
// (dropped), or the router closes (unicastClosed: nothing dropped yet).
func (l *deliveryStream) unicast(items []*item) unicastOutcome {
	r := l.r
	req := &pb.PostRequest{Session: r.session, Lane: &pb.PeerLane{Queue: l.key.queue},
		Messages: make([]*pb.PeerMessage, len(items)), Seqs: make([]uint64, len(items))}
	for i, it := range items {
		req.Messages[i], req.Seqs[i] = it.msg, it.seq
	}
	for attempt := 0; ; attempt++ {
		addr, ok := r.cfg.Addr(l.key.node)
		if !ok {
			return unicastGone
		}
		err := r.unicastOnce(l.key.node, addr, req)
		if err == nil {
			for _, it := range items {
				r.m.messages.WithLabelValues(it.kind).Inc()
			}
			r.m.queue.WithLabelValues(l.key.node).Sub(float64(len(items)))
			return unicastSent
		}
		if r.ctx.Err() != nil {
			return unicastClosed
		}
		r.m.sendFailures.Inc()
		if permanent(err) {
			r.log.Error("dropped routing messages the peer refused", "node", l.key.node, "queue", l.key.queue, "addr", addr, "messages", len(items), "err", err)
			l.drop(items, err)
			return unicastRefused
		}
		lvl := slog.LevelDebug
		if attempt == 0 {
			lvl = slog.LevelWarn
		}
		r.log.Log(r.ctx, lvl, "post to peer failed; resending", "node", l.key.node, "queue", l.key.queue, "addr", addr, "messages", len(items), "attempt", attempt+1, "err", err)
		if !r.sleep(r.ctx, attempt) {
			return unicastClosed
		}
	}
}

// forwardOnce makes one unary Forward attempt for a forward item and
// hands its outcome to the caller, who tries again as a new item if it
// was transient.
func (l *deliveryStream) forwardOnce(it *item) {
	r := l.r
	if err := it.ctx.Err(); err != nil {
		it.finish(nil, err)
		return
	}
	if len(l.fresh([]*item{it})) == 0 {
		return
	}
	addr, ok := r.cfg.Addr(l.key.node)
	if !ok {
		it.finish(nil, ErrUnknownNode)
		return
	}
	cc, err := r.client.Conn(l.key.node, addr)
	if err != nil {
		it.finish(nil, err)
		return
	}
	// The forward's context, which Close does not end (Forward watches
	// both), ended by Close too: the call does not outlive the router.
	ctx, cancel := context.WithTimeout(it.ctx, r.cfg.AttemptTimeout)
	defer cancel()
	defer context.AfterFunc(r.ctx, cancel)()
	res, err := pb.NewPeerServiceClient(cc).Forward(ctx, &pb.ForwardRequest{
		Delivery: it.fwd, Session: r.session, Lane: &pb.PeerLane{Queue: l.key.queue}, Seq: it.seq,
	})
	if err != nil {
		if r.ctx.Err() == nil {
			r.m.sendFailures.Inc()
		}
		it.finish(nil, err)
		return
	}
	r.m.messages.WithLabelValues(it.kind).Inc()
	it.finish(res, nil)
}
