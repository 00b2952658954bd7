package peer

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/switchyard/switchyard/core"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// The request leg's stream, receiving end: the Deliver handler. The
// sending end is deliver_send.go; the lane memory it shares with the unary
// calls is lane_recv.go.

// Errors a Deliver stream ends with.
var (
	errNoOpen       = status.Error(codes.InvalidArgument, "a Deliver stream must open with its lane, once")
	errDeliverFrame = status.Error(codes.InvalidArgument, "a Deliver frame must be an item or a heartbeat")
	errClientSilent = status.Errorf(codes.Unavailable, "the sender sent nothing for %d heartbeat intervals", silentIntervals)
	errOpenTimeout  = status.Error(codes.DeadlineExceeded, "the sender did not open its Deliver stream in time")
)

// deliverStream is one Deliver call: the receiving end of a lane's
// stream. Its reader goroutine reads every frame and handles each item as
// it reads it, under the lane's lock (the receiver never blocks; time in it
// is not the sender's silence); the handler's goroutine writes acks and
// heartbeats and decides when the stream ends. The reader is the only Recv
// caller and ends once the handler returned; server.stop waits for it.
type deliverStream struct {
	s      *server
	st     pb.PeerService_DeliverServer
	from   string
	ctx    context.Context
	cancel context.CancelCauseFunc

	hb      atomic.Int64            // the sender's heartbeat interval (ns), once its open came
	opened  chan *pb.DeliverOpen    // the open frame, once
	ready   chan *laneInbox         // the lane, once the handler acquired it
	acks    chan *pb.DeliverHandled // handled, not yet acked; closed when the sender closed its side
	silence *time.Timer             // watchSilence
	busy    atomic.Bool             // the reader is in the receiver
}

// Deliver receives one lane's stream: it handles items in order, once each
// across every call of the lane (see laneInbox), acks each after the
// receiver returns, heartbeats at the sender's interval, and ends the
// stream when the sender is silent for three intervals.
func (s *server) Deliver(st pb.PeerService_DeliverServer) error {
	from, ok := Caller(st.Context())
	if !ok {
		return errUnauthenticated
	}
	rcv, err := s.receiver()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(st.Context())
	defer cancel(nil)
	ds := &deliverStream{
		s: s, st: st, from: from, ctx: ctx, cancel: cancel,
		opened: make(chan *pb.DeliverOpen, 1),
		ready:  make(chan *laneInbox, 1),
		acks:   make(chan *pb.DeliverHandled, laneWindow),
	}
	ds.silence = time.AfterFunc(openTimeout, ds.watchSilence)
	defer ds.silence.Stop()
	if !s.goStream(func() { ds.read(rcv) }) {
		return status.Error(codes.Unavailable, "peer server stopping")
	}

	var open *pb.DeliverOpen
	select {
	case open = <-ds.opened:
	case <-ctx.Done():
		return ds.end()
	}
	l := s.acquireLane(from, open.GetLane().GetQueue())
	defer s.releaseLane(l)
	ds.ready <- l
	err = ds.write(heartbeatOf(open.GetHeartbeatIntervalNs()))
	cancel(err)
	return err
}

// end is the status the stream ends with once ds.ctx is done.
func (ds *deliverStream) end() error { return endStatus(ds.st.Context(), ds.ctx) }

// watchSilence ends the stream when its open did not come in time, or when
// the sender was silent for three intervals; time the reader spends in the
// receiver is this node's, not the sender's silence: it looks again later.
func (ds *deliverStream) watchSilence() {
	hb := time.Duration(ds.hb.Load())
	switch {
	case hb == 0:
		ds.cancel(errOpenTimeout)
	case ds.busy.Load():
		ds.silence.Reset(silentIntervals * hb)
	default:
		ds.cancel(errClientSilent)
	}
}

// heard restarts the silence count: something came from the sender.
func (ds *deliverStream) heard() {
	ds.silence.Reset(silentIntervals * time.Duration(ds.hb.Load()))
}

// read reads every frame: the open first, then items, each handled as it
// is read, and heartbeats. It closes acks once the sender closed its side
// with every item handled, and cancels the stream on anything wrong.
func (ds *deliverStream) read(rcv core.Receiver) {
	l, session, ok := ds.readOpen()
	if !ok {
		return
	}
	for {
		f, err := ds.st.Recv()
		if errors.Is(err, io.EOF) {
			// The sender closed its side: it is done, not silent.
			ds.silence.Stop()
			close(ds.acks)
			return
		}
		if err != nil {
			ds.cancel(err)
			return
		}
		ds.heard()
		switch b := f.GetBody().(type) {
		case *pb.DeliverFrame_Item:
			if !ds.handle(rcv, l, session, b.Item) {
				return
			}
		case *pb.DeliverFrame_Heartbeat:
		case *pb.DeliverFrame_Open:
			ds.cancel(errNoOpen)
			return
		default:
			ds.cancel(errDeliverFrame)
			return
		}
	}
}

// readOpen reads the first frame, which must be the open, hands it to the
// handler and waits for the lane it acquires: the lane and the sender's
// session, or false when the stream is to end.
func (ds *deliverStream) readOpen() (*laneInbox, string, bool) {
	f, err := ds.st.Recv()
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = errNoOpen
		}
		ds.cancel(err)
		return nil, "", false
	}
	open := f.GetOpen()
	if open == nil {
		if f.GetItem() != nil || f.GetHeartbeat() != nil {
			ds.cancel(errNoOpen)
		} else {
			ds.cancel(errDeliverFrame)
		}
		return nil, "", false
	}
	ds.hb.Store(int64(heartbeatOf(open.GetHeartbeatIntervalNs())))
	ds.heard()
	ds.opened <- open
	select {
	case l := <-ds.ready:
		return l, open.GetSession(), true
	case <-ds.ctx.Done():
		return nil, "", false
	}
}

// handle handles one item and queues its ack: false once the stream ended.
func (ds *deliverStream) handle(rcv core.Receiver, l *laneInbox, session string, it *pb.DeliverItem) bool {
	if ds.ctx.Err() != nil {
		// Not handled: its sender resends it by a unary call.
		return false
	}
	ds.busy.Store(true)
	a := ds.handleItem(rcv, l, session, it)
	ds.heard()
	ds.busy.Store(false)
	select {
	case ds.acks <- a:
		return true
	case <-ds.ctx.Done():
		return false
	}
}

// handleItem hands one item to the receiver, unless the lane handled it
// already, and returns its ack.
func (ds *deliverStream) handleItem(rcv core.Receiver, l *laneInbox, session string, it *pb.DeliverItem) *pb.DeliverHandled {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.syncLocked(session)
	seq := it.GetSeq()
	a := &pb.DeliverHandled{Seq: seq}
	switch b := it.GetBody().(type) {
	case *pb.DeliverItem_Message:
		ds.s.messageLocked(ds.from, rcv, l, seq, b.Message)
	case *pb.DeliverItem_Forward:
		res, err := ds.s.forwardLocked(ds.from, rcv, l, seq, b.Forward)
		if err != nil {
			st := status.Convert(err)
			a.ErrorCode, a.Error = uint32(st.Code()), st.Message()
		} else {
			a.Verdict = res
		}
	default:
		ds.s.cfg.Metrics.invalid.Inc()
		l.doneLocked(seq)
	}
	return a
}

// write sends acks as items are handled, and a heartbeat every interval,
// until the stream ends (its status) or acks is closed and drained (nil).
//
// A send blocks only when the sender stops reading while it keeps the
// connection open; the handler then waits here until the connection's
// keepalive gives up on it.
func (ds *deliverStream) write(hb time.Duration) error {
	tick := time.NewTicker(hb)
	defer tick.Stop()
	heartbeat := &pb.DeliverAck{Body: &pb.DeliverAck_Heartbeat{Heartbeat: &pb.DeliverHeartbeat{}}}
	for {
		select {
		case <-ds.ctx.Done():
			return ds.end()
		case <-tick.C:
			if !ds.send(heartbeat) {
				return ds.end()
			}
		case a, open := <-ds.acks:
			open, ok := ds.sendAcks(a, open)
			if !ok {
				return ds.end()
			}
			if !open {
				return nil
			}
		}
	}
}

// sendAcks sends a and the acks queued behind it. Acks are cumulative, so
// a run of message acks goes as its last one; a forward's ack is always
// sent, for its verdict. It returns whether acks is still open, and false
// once a send failed.
func (ds *deliverStream) sendAcks(a *pb.DeliverHandled, open bool) (stillOpen, ok bool) {
	var plain *pb.DeliverHandled
	for a != nil {
		if a.GetVerdict() != nil || a.GetErrorCode() != 0 {
			if !ds.sendAck(a) {
				return open, false
			}
			plain = nil
		} else {
			plain = a
		}
		a = nil
		if open {
			select {
			case a, open = <-ds.acks:
			default:
			}
		}
	}
	if plain != nil && !ds.sendAck(plain) {
		return open, false
	}
	return open, true
}

func (ds *deliverStream) sendAck(a *pb.DeliverHandled) bool {
	return ds.send(&pb.DeliverAck{Body: &pb.DeliverAck_Handled{Handled: a}})
}

// send sends m: false (the stream cancelled) when that failed.
func (ds *deliverStream) send(m *pb.DeliverAck) bool {
	if err := ds.st.Send(m); err != nil {
		ds.cancel(err)
		return false
	}
	return true
}
