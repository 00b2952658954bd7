package peer

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/switchyard/switchyard/core"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// The request leg, receiving side: the Deliver handler, which receives a
// delivery stream's Deliver stream, and what the server remembers of each
// sender's delivery stream (deliveryInbox), which the stream shares with
// the unary calls that carry a delivery stream's items (Forward, and Post
// naming a delivery stream) so each item is handled once and in order
// whichever call carried it. The sending side is delivery_send.go.

// Errors a Deliver stream ends with.
var (
	errNoOpen       = status.Error(codes.InvalidArgument, "a Deliver stream must open with its delivery stream, once")
	errDeliverFrame = status.Error(codes.InvalidArgument, "a Deliver frame must be an item or a heartbeat")
	errClientSilent = status.Errorf(codes.Unavailable, "the sender sent nothing for %d heartbeat intervals", silentIntervals)
	errOpenTimeout  = status.Error(codes.DeadlineExceeded, "the sender did not open its Deliver stream in time")
)

// deliverIn is one Deliver call: the receiving end of a delivery stream's
// stream. Its reader goroutine reads every frame and handles each item as
// it reads it, under the delivery stream's lock (the receiver never blocks;
// time in it is not the sender's silence); the handler's goroutine writes
// acks and heartbeats and decides when the stream ends. The reader is the
// only Recv caller and ends once the handler returned; server.stop waits
// for it.
type deliverIn struct {
	inCall
	st pb.PeerService_DeliverServer

	hb      atomic.Int64            // the sender's heartbeat interval (ns), once its open came
	opened  chan *pb.DeliverOpen    // the open frame, once
	ready   chan *deliveryInbox     // the delivery stream, once the handler acquired it
	acks    chan *pb.DeliverHandled // handled, not yet acked; closed when the sender closed its side
	silence *time.Timer             // watchSilence
	busy    atomic.Bool             // the reader is in the receiver
}

// Deliver receives one Deliver stream of a delivery stream: it handles
// items in order, once each across every call of the delivery stream (see
// deliveryInbox), acks each after the receiver returns, heartbeats at the
// sender's interval, and ends the stream when the sender is silent for
// three intervals.
func (s *server) Deliver(st pb.PeerService_DeliverServer) error {
	c, rcv, err := s.accept(st)
	if err != nil {
		return err
	}
	defer c.cancel(nil)
	ds := &deliverIn{
		inCall: c, st: st,
		opened: make(chan *pb.DeliverOpen, 1),
		ready:  make(chan *deliveryInbox, 1),
		acks:   make(chan *pb.DeliverHandled, deliveryWindow),
	}
	ds.silence = time.AfterFunc(openTimeout, ds.watchSilence)
	defer ds.silence.Stop()
	if !s.goStream(func() { ds.read(rcv) }) {
		return errStopping
	}

	var open *pb.DeliverOpen
	select {
	case open = <-ds.opened:
	case <-c.ctx.Done():
		return ds.end()
	}
	l := s.acquireDelivery(c.from, open.GetLane().GetQueue())
	defer s.releaseDelivery(l)
	ds.ready <- l
	err = ds.write(heartbeatOf(open.GetHeartbeatIntervalNs()))
	c.cancel(err)
	return err
}

// watchSilence ends the stream when its open did not come in time, or when
// the sender was silent for three intervals; time the reader spends in the
// receiver is this node's, not the sender's silence: it looks again later.
func (ds *deliverIn) watchSilence() {
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
func (ds *deliverIn) heard() {
	ds.silence.Reset(silentIntervals * time.Duration(ds.hb.Load()))
}

// read reads every frame: the open first, then items, each handled as it
// is read, and heartbeats. It closes acks once the sender closed its side
// with every item handled, and cancels the stream on anything wrong.
func (ds *deliverIn) read(rcv core.Receiver) {
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
// handler and waits for the delivery stream it acquires: the delivery
// stream and the sender's session, or false when the stream is to end.
func (ds *deliverIn) readOpen() (*deliveryInbox, string, bool) {
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
func (ds *deliverIn) handle(rcv core.Receiver, l *deliveryInbox, session string, it *pb.DeliverItem) bool {
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

// handleItem hands one item to the receiver, unless the delivery stream
// handled it already, and returns its ack.
func (ds *deliverIn) handleItem(rcv core.Receiver, l *deliveryInbox, session string, it *pb.DeliverItem) *pb.DeliverHandled {
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
func (ds *deliverIn) write(hb time.Duration) error {
	tick := time.NewTicker(hb)
	defer tick.Stop()
	heartbeat := &pb.DeliverAck{Body: &pb.DeliverAck_Heartbeat{Heartbeat: &pb.Heartbeat{}}}
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
func (ds *deliverIn) sendAcks(a *pb.DeliverHandled, open bool) (stillOpen, ok bool) {
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

func (ds *deliverIn) sendAck(a *pb.DeliverHandled) bool {
	return ds.send(&pb.DeliverAck{Body: &pb.DeliverAck_Handled{Handled: a}})
}

// send sends m: false (the stream cancelled) when that failed.
func (ds *deliverIn) send(m *pb.DeliverAck) bool {
	if err := ds.st.Send(m); err != nil {
		ds.cancel(err)
		return false
	}
	return true
}

// What a receiver remembers of each delivery stream.
const (
	// verdictMemory is how many forward verdicts a delivery stream
	// remembers, so a forward resent on the unary path after its stream ack
	// was lost is answered as it was the first time.
	verdictMemory = 64
	// deliveryForget: delivery stream state unused this long is dropped
	// (swept at most every deliverySweep). Nothing is in flight on a
	// delivery stream by then: its sender closes an idle stream after tens
	// of seconds and gives up on a Post long before.
	deliveryForget = 10 * time.Minute
	deliverySweep  = time.Minute
)

// deliveryKey names a delivery stream: the messages of one queue between
// two nodes (on the sending side node is the receiver, on the receiving
// side the sender).
type deliveryKey struct{ node, queue string }

// deliveryInbox is what a server knows of one sender's delivery stream: the
// next sequence number it expects and the verdicts of its recent forwards.
// Its mutex serialises everything that handles the delivery stream's items
// (Deliver streams, an old one still draining beside a new one, and Post
// and Forward resends), so the delivery stream's items are handled one at a
// time in sequence order and each at most once, whichever call carried it.
type deliveryInbox struct {
	mu       sync.Mutex
	session  string
	next     uint64
	verdicts [verdictMemory]verdict
	nv       int // verdicts written so far; the ring's next slot is nv % verdictMemory

	// Under server.mu.
	users int       // calls holding it; never forgotten while > 0
	used  time.Time // last acquired
}

type verdict struct {
	seq uint64
	res *pb.ForwardResponse
}

// syncLocked starts afresh when session is a new sender process (or the
// first call on the delivery stream): the last one's numbers say nothing
// about it.
func (l *deliveryInbox) syncLocked(session string) {
	if session != l.session {
		l.session, l.next, l.nv = session, 0, 0
		clear(l.verdicts[:])
	}
}

// seenLocked reports whether item seq was handled already (or skipped
// past: a sender never sends a lower number after a higher one).
func (l *deliveryInbox) seenLocked(seq uint64) bool { return seq < l.next }

// doneLocked records that every item up to seq was handled.
func (l *deliveryInbox) doneLocked(seq uint64) { l.next = max(l.next, seq+1) }

func (l *deliveryInbox) rememberLocked(seq uint64, res *pb.ForwardResponse) {
	l.verdicts[l.nv%verdictMemory] = verdict{seq: seq, res: res}
	l.nv++
}

func (l *deliveryInbox) verdictLocked(seq uint64) (*pb.ForwardResponse, bool) {
	for i := range min(l.nv, verdictMemory) {
		if v := l.verdicts[i]; v.seq == seq && v.res != nil {
			return v.res, true
		}
	}
	return nil, false
}

// acquireDelivery returns the sender from's delivery stream for queue, held
// until releaseDelivery.
func (s *server) acquireDelivery(from, queue string) *deliveryInbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	sweep(s.deliveries, &s.swept, deliverySweep, now, func(l *deliveryInbox) bool {
		return l.users == 0 && now.Sub(l.used) >= deliveryForget
	})
	k := deliveryKey{from, queue}
	l := s.deliveries[k]
	if l == nil {
		l = &deliveryInbox{}
		s.deliveries[k] = l
	}
	l.users++
	l.used = now
	return l
}

func (s *server) releaseDelivery(l *deliveryInbox) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l.users--
	l.used = time.Now()
}

// forwardLocked is a forward item of delivery stream l numbered seq: the
// verdict it got the first time when it was handled already, else the
// receiver's; NotFound when it was meant for another incarnation of this
// node. A forward seen before whose verdict is no longer remembered (or
// that got none: the dispatcher could not decide) is handed to the receiver
// again, which the core.Receiver contract makes safe: a dispatcher takes a
// (job, generation) once. The error is the gRPC status Forward answers with
// when there is no verdict.
func (s *server) forwardLocked(from string, rcv core.Receiver, l *deliveryInbox, seq uint64, p *pb.PeerDelivery) (*pb.ForwardResponse, error) {
	if s.stale(from, string(core.MsgForward), p) {
		// Checked first: a verdict this process gave under the incarnation
		// the forward was meant for no longer holds (it fenced since).
		l.doneLocked(seq)
		return nil, staleForward(p, s.cfg.Self())
	}
	if l.seenLocked(seq) {
		if res, ok := l.verdictLocked(seq); ok {
			return res, nil
		}
	}
	defer l.doneLocked(seq)
	d, err := DeliveryFromPB(p)
	if err != nil {
		s.cfg.Metrics.invalid.Inc()
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	err = rcv.HandleForward(from, d)
	res, ok := ForwardResponse(err)
	if !ok {
		return nil, status.Errorf(codes.Unavailable, "dispatcher could not take job %s: %v", d.JobID, err)
	}
	l.rememberLocked(seq, res)
	return res, nil
}

// messageLocked handles a message item of delivery stream l numbered seq,
// unless it was handled already.
func (s *server) messageLocked(from string, rcv core.Receiver, l *deliveryInbox, seq uint64, p *pb.PeerMessage) {
	if l.seenLocked(seq) {
		return
	}
	l.doneLocked(seq)
	s.takeMessage(from, rcv, p)
}

// takeMessage hands p to the receiver, unless it is invalid (skipped,
// logged and counted) or a job meant for another incarnation of this node
// (dropped and counted: the incarnation it was meant for is dead, and
// its sender releases what that one held).
func (s *server) takeMessage(from string, rcv core.Receiver, p *pb.PeerMessage) {
	m, err := MessageFromPB(p)
	if err != nil {
		s.cfg.Metrics.invalid.Inc()
		s.cfg.Logger.Warn("skipped an invalid peer message", "from", from, "err", err)
		return
	}
	if s.stale(from, string(m.Kind), p.GetDelivery()) {
		return
	}
	s.handleMessage(rcv, from, m)
}

// Forward hands one job to the receiver and answers with its verdict. A
// refusal is an answer; an error the receiver could not classify is
// Unavailable, which the caller retries.
func (s *server) Forward(ctx context.Context, req *pb.ForwardRequest) (*pb.ForwardResponse, error) {
	from, ok := Caller(ctx)
	if !ok {
		return nil, errUnauthenticated
	}
	d, err := DeliveryFromPB(req.GetDelivery())
	if err != nil {
		s.cfg.Metrics.invalid.Inc()
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	rcv, err := s.receiver()
	if err != nil {
		return nil, err
	}
	if req.GetLane() != nil && req.GetSession() != "" {
		// A delivery stream's item: checked against the delivery stream's
		// numbers, in its order.
		l := s.acquireDelivery(from, req.GetLane().GetQueue())
		defer s.releaseDelivery(l)
		l.mu.Lock()
		defer l.mu.Unlock()
		l.syncLocked(req.GetSession())
		return s.forwardLocked(from, rcv, l, req.GetSeq(), req.GetDelivery())
	}
	if s.stale(from, string(core.MsgForward), req.GetDelivery()) {
		return nil, staleForward(req.GetDelivery(), s.cfg.Self())
	}
	err = rcv.HandleForward(from, d)
	res, ok := ForwardResponse(err)
	if !ok {
		return nil, status.Errorf(codes.Unavailable, "dispatcher could not take job %s: %v", d.JobID, err)
	}
	return res, nil
}

// unaryDelivery is Post for a delivery stream's unary path: each message is
// checked against the delivery stream's numbers, shared with its Deliver
// streams and Forwards.
func (s *server) unaryDelivery(from string, rcv core.Receiver, req *pb.PostRequest) (*pb.PostResponse, error) {
	msgs, seqs, session := req.GetMessages(), req.GetSeqs(), req.GetSession()
	if len(seqs) != len(msgs) {
		return nil, status.Errorf(codes.InvalidArgument, "a delivery stream's Post numbers each message: %d numbers for %d messages", len(seqs), len(msgs))
	}
	l := s.acquireDelivery(from, req.GetLane().GetQueue())
	defer s.releaseDelivery(l)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.syncLocked(session)
	for i, p := range msgs {
		if session == "" {
			// No numbers to check against: handled as it comes.
			s.takeMessage(from, rcv, p)
			continue
		}
		s.messageLocked(from, rcv, l, seqs[i], p)
	}
	return &pb.PostResponse{}, nil
}
