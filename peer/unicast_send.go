package peer

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/switchyard/switchyard/internal/chans"

	"google.golang.org/protobuf/encoding/protowire"

	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// The per-node unicast queue, sending side: a binding's only message (an end
// or a release with no response leg open: nothing of it went before, so it
// overtakes nothing) goes to its node in order with the others, as batched
// Posts, one in flight per node, a failed batch resent unchanged before
// anything behind it. The receiving side is unicast_recv.go.

// unicastQueue is one node's queue, first in first out, and its sender's
// wake-up.
type unicastQueue struct {
	node string
	msgs []*pb.PeerMessage
	wake chan struct{} // capacity 1: "something was queued"
}

// unicastLocked queues p on node's unicast queue.
func (r *router) unicastLocked(node string, p *pb.PeerMessage) {
	ob := r.unicastQueue[node]
	if ob == nil {
		ob = &unicastQueue{node: node, wake: make(chan struct{}, 1)}
		r.unicastQueue[node] = ob
		r.refLocked(node)
		r.wg.Add(1)
		go r.run(ob)
	}
	ob.msgs = append(ob.msgs, p)
	r.m.queue.WithLabelValues(node).Inc()
	chans.Notify(ob.wake)
}

// run is one node's unicast queue sender: it posts what is queued, batch by
// batch, and exits when the queue stayed empty for IdleTimeout or at
// Close.
func (r *router) run(ob *unicastQueue) {
	defer r.wg.Done()
	idle := time.NewTimer(r.cfg.IdleTimeout)
	defer idle.Stop()
	for {
		r.mu.Lock()
		if r.closed {
			r.dropLocked(ob, ob.msgs)
			ob.msgs = nil
			r.removeLocked(ob)
			r.mu.Unlock()
			return
		}
		if len(ob.msgs) == 0 {
			r.mu.Unlock()
			idle.Reset(r.cfg.IdleTimeout)
			select {
			case <-ob.wake:
			case <-r.ctx.Done():
			case <-idle.C:
				r.mu.Lock()
				if len(ob.msgs) == 0 {
					r.removeLocked(ob)
					r.mu.Unlock()
					return
				}
				r.mu.Unlock()
			}
			continue
		}
		req, bad := r.takeLocked(ob)
		r.mu.Unlock()
		for _, u := range bad {
			r.undeliverable(ob.node, u.p, nil, u.reason, u.err)
		}
		if req != nil {
			r.unicast(ob, req)
		}
	}
}

// rejected is a queued message no transport can carry.
type rejected struct {
	p      *pb.PeerMessage
	reason string
	err    error
}

// takeLocked removes the next batch from ob: every queued message, up to
// maxUnicast bytes, numbered from the router's counter. A message that alone
// exceeds maxUnicast, or has no valid wire form, can never be sent: it is
// taken out and returned in bad, to be reported. Nil when only such
// messages were queued.
func (r *router) takeLocked(ob *unicastQueue) (req *pb.PostRequest, bad []rejected) {
	var size, n int
	for n < len(ob.msgs) {
		p := ob.msgs[n]
		cost := protowire.SizeTag(3) + protowire.SizeBytes(p.SizeVT())
		reason, err := "", error(nil)
		if cost > r.maxUnicast {
			reason, err = ReasonTooLarge, fmt.Errorf("%d bytes, over the peer message limit of %d", cost, r.maxUnicast)
		} else if err = wireValid(p); err != nil {
			reason = ReasonEncoding
		}
		if err != nil {
			if n > 0 {
				break // send what precedes it first, in order
			}
			bad = append(bad, rejected{p, reason, err})
			ob.msgs[0] = nil
			ob.msgs = ob.msgs[1:]
			continue
		}
		if size+cost > r.maxUnicast {
			break
		}
		size += cost
		n++
	}
	if n == 0 {
		return nil, bad
	}
	req = &pb.PostRequest{Session: r.session, FirstSeq: r.seq, Messages: make([]*pb.PeerMessage, n)}
	copy(req.Messages, ob.msgs[:n])
	clear(ob.msgs[:n])
	ob.msgs = ob.msgs[n:]
	if len(ob.msgs) == 0 {
		ob.msgs = nil // let the backing array go
	}
	r.seq += uint64(n)
	return req, bad
}

// unicast sends one batch to ob's node, resending it unchanged until it is
// handed over, the node leaves the catalog, the peer refuses it for good,
// or the router closes. The batch counts in the queue gauge until then.
func (r *router) unicast(ob *unicastQueue, req *pb.PostRequest) {
	for attempt := 0; ; attempt++ {
		addr, ok := r.cfg.Addr(ob.node)
		if !ok {
			r.mu.Lock()
			n := len(req.Messages) + len(ob.msgs)
			r.dropLocked(ob, req.Messages)
			r.dropLocked(ob, ob.msgs)
			ob.msgs = nil
			r.mu.Unlock()
			r.log.Warn("dropped routing messages to a node that left the catalog", "node", ob.node, "messages", n)
			return
		}
		err := r.unicastOnce(ob.node, addr, req)
		if err == nil {
			r.mu.Lock()
			for _, p := range req.Messages {
				r.m.messages.WithLabelValues(kindOf(p)).Inc()
			}
			r.m.queue.WithLabelValues(ob.node).Sub(float64(len(req.Messages)))
			r.mu.Unlock()
			return
		}
		if r.ctx.Err() == nil {
			r.m.sendFailures.Inc()
		}
		if r.ctx.Err() != nil || permanent(err) {
			r.mu.Lock()
			r.dropLocked(ob, req.Messages)
			r.mu.Unlock()
			if r.ctx.Err() == nil {
				r.log.Error("dropped routing messages the peer refused", "node", ob.node, "addr", addr, "messages", len(req.Messages), "err", err)
			}
			return
		}
		lvl := slog.LevelDebug
		if attempt == 0 {
			lvl = slog.LevelWarn
		}
		r.log.Log(r.ctx, lvl, "post to peer failed; resending", "node", ob.node, "addr", addr, "messages", len(req.Messages), "attempt", attempt+1, "err", err)
		if !r.sleep(r.ctx, attempt) {
			r.mu.Lock()
			r.dropLocked(ob, req.Messages)
			r.mu.Unlock()
			return
		}
	}
}

func (r *router) unicastOnce(node, addr string, req *pb.PostRequest) error {
	cc, err := r.client.Conn(node, addr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(r.ctx, r.cfg.AttemptTimeout)
	defer cancel()
	_, err = pb.NewPeerServiceClient(cc).Post(ctx, req)
	return err
}

// dropLocked counts msgs, no longer queued for ob's node, as dropped.
func (r *router) dropLocked(ob *unicastQueue, msgs []*pb.PeerMessage) {
	for _, p := range msgs {
		r.m.dropped.WithLabelValues(kindOf(p)).Inc()
	}
	if len(msgs) > 0 {
		r.m.queue.WithLabelValues(ob.node).Sub(float64(len(msgs)))
	}
}

// removeLocked forgets ob, whose queue is empty and whose sender exits.
func (r *router) removeLocked(ob *unicastQueue) {
	delete(r.unicastQueue, ob.node)
	r.unrefLocked(ob.node)
}
