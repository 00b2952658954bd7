package peer

import (
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// A delivery stream's acks: what an ack settles (the messages it covers are
// counted sent, a forward gets its verdict), and the ack deadline of the
// oldest unacked item, whose passing is a stall (delivery_stall.go).

// acked applies an ack: every unacked item up to its number is handled.
func (l *deliveryStream) acked(a *pb.DeliverHandled) {
	r := l.r
	n := 0
	for n < len(l.unacked) && l.unacked[n].seq <= a.GetSeq() {
		n++
	}
	if n == 0 {
		return
	}
	var sent int
	for _, it := range l.unacked[:n] {
		if it.fwd == nil {
			r.m.messages.WithLabelValues(it.kind).Inc()
			r.m.streamed.Inc()
			sent++
			continue
		}
		switch {
		case it.seq != a.GetSeq():
			// Never: a forward's ack is its own.
			it.finish(nil, status.Error(codes.Unavailable, "the forward's ack carried no verdict"))
		case a.GetErrorCode() != 0:
			r.m.sendFailures.Inc()
			it.finish(nil, status.Error(codes.Code(a.GetErrorCode()), a.GetError()))
		default:
			r.m.messages.WithLabelValues(it.kind).Inc()
			r.m.streamed.Inc()
			res := a.GetVerdict()
			if res == nil {
				res = &pb.ForwardResponse{}
			}
			it.finish(res, nil)
		}
	}
	if sent > 0 {
		r.m.queue.WithLabelValues(l.key.node).Sub(float64(sent))
	}
	clear(l.unacked[:n])
	l.unacked = l.unacked[n:]
	if len(l.unacked) == 0 {
		l.unacked = nil
	}
	now := time.Now()
	l.headSince = now
	l.armAck(now)
}

// deadline is when the oldest unacked item's ack is due: its ack timeout
// after it was sent or became the oldest, whichever is later (the
// receiver handles a delivery stream's items one at a time).
func (l *deliveryStream) deadline() time.Time {
	head := l.unacked[0]
	since := head.sentAt
	if l.headSince.After(since) {
		since = l.headSince
	}
	return since.Add(head.timeout)
}

// armAck sets the ack timer to the oldest unacked item's deadline.
func (l *deliveryStream) armAck(now time.Time) {
	if len(l.unacked) == 0 {
		l.ackTimer.Stop()
		return
	}
	l.ackTimer.Reset(l.deadline().Sub(now))
}

// drainAcks applies the acks the stream's reader has already read.
func (l *deliveryStream) drainAcks() {
	if l.st == nil {
		return
	}
	for {
		select {
		case a := <-l.st.acks:
			l.acked(a)
		default:
			return
		}
	}
}
