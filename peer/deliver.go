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

// The receiving side of lanes: the Deliver stream handler, and the lane
// state Deliver, Post and Forward share.

// Receiver bounds.
const (
	// openTimeout bounds the wait for a stream's open frame.
	openTimeout = 10 * time.Second
	// silentIntervals heartbeat intervals without a frame end a stream, on
	// either side.
	silentIntervals = 3
	// verdictMemory is how many forward verdicts a lane remembers, so a
	// forward resent on the unary path after its stream ack was lost is
	// answered as it was the first time.
	verdictMemory = 64
	// laneForget: lane state unused this long is dropped (swept at most
	// every laneSweep). Nothing is in flight on a lane by then: its sender
	// closes an idle stream after tens of seconds and gives up on a Post
	// long before.
	laneForget = 10 * time.Minute
	laneSweep  = time.Minute
)

// Heartbeat interval bounds a receiver accepts from an open frame.
const (
	minHeartbeat     = time.Millisecond
	maxHeartbeat     = time.Minute
	defaultHeartbeat = time.Second
)

// laneKey names a lane: the messages of one queue between two nodes (on
// the sending side node is the receiver, on the receiving side the
// sender).
type laneKey struct{ node, queue string }

// laneInbox is what a server knows of one sender's lane: the next sequence
// number it expects and the verdicts of its recent forwards. Its mutex
// serialises everything that handles the lane's items (Deliver streams, an
// old one still draining beside a new one, and Post and Forward resends),
// so the lane's items are handled one at a time in sequence order and each
// at most once, whichever call carried it.
type laneInbox struct {
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
// first call on the lane): the last one's numbers say nothing about it.
func (l *laneInbox) syncLocked(session string) {
	if session != l.session {
		l.session, l.next, l.nv = session, 0, 0
		clear(l.verdicts[:])
	}
}

// seenLocked reports whether item seq was handled already (or skipped
// past: a sender never sends a lower number after a higher one).
func (l *laneInbox) seenLocked(seq uint64) bool { return seq < l.next }

// doneLocked records that every item up to seq was handled.
func (l *laneInbox) doneLocked(seq uint64) { l.next = max(l.next, seq+1) }

func (l *laneInbox) rememberLocked(seq uint64, res *pb.ForwardResponse) {
	l.verdicts[l.nv%verdictMemory] = verdict{seq: seq, res: res}
	l.nv++
}

func (l *laneInbox) verdictLocked(seq uint64) (*pb.ForwardResponse, bool) {
	for i := range min(l.nv, verdictMemory) {
		if v := l.verdicts[i]; v.seq == seq && v.res != nil {
			return v.res, true
		}
	}
	return nil, false
}

// acquireLane returns the sender from's lane for queue, held until
// releaseLane.
func (s *server) acquireLane(from, queue string) *laneInbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if now.Sub(s.swept) >= laneSweep {
		s.swept = now
		for k, l := range s.lanes {
			if l.users == 0 && now.Sub(l.used) >= laneForget {
				delete(s.lanes, k)
			}
		}
	}
	k := laneKey{from, queue}
	l := s.lanes[k]
	if l == nil {
		l = &laneInbox{}
		s.lanes[k] = l
	}
	l.users++
	l.used = now
	return l
}

func (s *server) releaseLane(l *laneInbox) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l.users--
	l.used = time.Now()
}

// forwardLocked is a forward item of lane l numbered seq: the verdict it
// got the first time when it was handled already, else the receiver's. A
// forward seen before whose verdict is no longer remembered (or that got
// none: the dispatcher could not decide) is handed to the receiver again,
// which the core.Receiver contract makes safe: a dispatcher takes a (job,
// generation) once. The error is the gRPC status Forward answers with when
// there is no verdict.
func (s *server) forwardLocked(from string, rcv core.Receiver, l *laneInbox, seq uint64, p *pb.PeerDelivery) (*pb.ForwardResponse, error) {
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

// messageLocked handles a message item of lane l numbered seq, unless it
// was handled already.
func (s *server) messageLocked(from string, rcv core.Receiver, l *laneInbox, seq uint64, p *pb.PeerMessage) {
	if l.seenLocked(seq) {
		return
	}
	l.doneLocked(seq)
	m, err := MessageFromPB(p)
	if err != nil {
		s.cfg.Metrics.invalid.Inc()
		s.cfg.Logger.Warn("skipped an invalid peer message", "from", from, "err", err)
		return
	}
	s.handleMessage(rcv, from, m)
}

// Errors a Deliver stream ends with.
var (
	errNoOpen       = status.Error(codes.InvalidArgument, "a Deliver stream must open with its lane, once")
	errDeliverFrame = status.Error(codes.InvalidArgument, "a Deliver frame must be an item or a heartbeat")
	errClientSilent = status.Errorf(codes.Unavailable, "the sender sent nothing for %d heartbeat intervals", silentIntervals)
	errOpenTimeout  = status.Error(codes.DeadlineExceeded, "the sender did not open its Deliver stream in time")
)

// deliverStream is one Deliver call on the server. Two goroutines share
// it: a reader, which reads every frame and handles each item as it reads
// it (in order, under the lane's lock; the receiver never blocks, and time
// spent in it does not count as the sender's silence), and the handler's,
// which writes acks and heartbeats and decides when the stream ends. The
// reader is the only Recv caller: it ends once the handler returned, which
// is what ends a Recv on a server stream; server.stop waits for it.
type deliverStream struct {
	s      *server
	st     pb.PeerService_DeliverServer
	from   string
	ctx    context.Context
	cancel context.CancelCauseFunc

	opened  chan *pb.DeliverOpen    // the open frame, once
	ready   chan *laneInbox         // the lane, once the handler acquired it
	acks    chan *pb.DeliverHandled // handled, not yet acked; closed when the sender closed its side
	silence *time.Timer             // cancels ctx when the sender goes silent
	isOpen  atomic.Bool             // the open frame came
	busy    atomic.Bool             // the reader is in the receiver
}

// Deliver receives one lane's stream: it handles items in order, once each
// across every call of the lane (see laneInbox), acks each after the
// handler returns, heartbeats at the sender's interval, and ends the stream
// when the sender is silent for three intervals.
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
	var hb atomic.Int64
	ds.silence = time.AfterFunc(openTimeout, func() {
		switch {
		case !ds.isOpen.Load():
			cancel(errOpenTimeout)
		case ds.busy.Load():
			// Handling an item is this node's time, not the sender's
			// silence: look again later.
			ds.silence.Reset(silentIntervals * time.Duration(hb.Load()))
		default:
			cancel(errClientSilent)
		}
	})
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
	hb.Store(int64(heartbeatOf(open)))
	l := s.acquireLane(from, open.GetLane().GetQueue())
	defer s.releaseLane(l)
	ds.ready <- l
	err = ds.write(time.Duration(hb.Load()))
	cancel(err)
	return err
}

// goStream runs f on a goroutine Stop waits for: false once Stop began.
func (s *server) goStream(f func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return false
	}
	s.wg.Go(f)
	return true
}

// heartbeatOf is the interval an open frame announces, clamped.
func heartbeatOf(o *pb.DeliverOpen) time.Duration {
	hb := time.Duration(o.GetHeartbeatIntervalNs())
	if hb <= 0 {
		return defaultHeartbeat
	}
	return min(max(hb, minHeartbeat), maxHeartbeat)
}

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

// end is the status the stream ends with once ds.ctx is done.
func (ds *deliverStream) end() error { return endStatus(ds.st.Context(), ds.ctx) }

// endStatus is the status a server stream ends with once ctx, derived from
// the call's context call, is done: the call's own end (the client went
// away), else why ctx was cancelled, as a status (Unavailable unless it is
// one already).
func endStatus(call, ctx context.Context) error {
	if err := call.Err(); err != nil {
		return status.FromContextError(err).Err()
	}
	err := context.Cause(ctx)
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codes.Unavailable, err.Error())
}

// read reads every frame: the open first, then items, each handled as it
// is read, and heartbeats. Any frame proves the sender alive. It closes
// acks once the sender closed its side with every item handled, and
// cancels the stream on anything wrong.
func (ds *deliverStream) read(rcv core.Receiver) {
	var (
		hb      time.Duration
		l       *laneInbox
		session string
	)
	for {
		f, err := ds.st.Recv()
		if errors.Is(err, io.EOF) {
			if hb == 0 {
				ds.cancel(errNoOpen)
				return
			}
			// The sender closed its side: it is done, not silent.
			ds.silence.Stop()
			close(ds.acks)
			return
		}
		if err != nil {
			ds.cancel(err)
			return
		}
		if hb > 0 {
			ds.silence.Reset(silentIntervals * hb)
		}
		switch b := f.GetBody().(type) {
		case *pb.DeliverFrame_Open:
			if hb > 0 {
				ds.cancel(errNoOpen)
				return
			}
			hb = heartbeatOf(b.Open)
			session = b.Open.GetSession()
			ds.isOpen.Store(true)
			ds.silence.Reset(silentIntervals * hb)
			ds.opened <- b.Open
			select {
			case l = <-ds.ready:
			case <-ds.ctx.Done():
				return
			}
		case *pb.DeliverFrame_Item:
			if hb == 0 {
				ds.cancel(errNoOpen)
				return
			}
			if ds.ctx.Err() != nil {
				// Not handled: its sender resends it by a unary call.
				return
			}
			ds.busy.Store(true)
			a := ds.handleItem(rcv, l, session, b.Item)
			ds.silence.Reset(silentIntervals * hb)
			ds.busy.Store(false)
			select {
			case ds.acks <- a:
			case <-ds.ctx.Done():
				return
			}
		case *pb.DeliverFrame_Heartbeat:
			if hb == 0 {
				ds.cancel(errNoOpen)
				return
			}
		default:
			ds.cancel(errDeliverFrame)
			return
		}
	}
}

// write sends acks as items are handled, and a heartbeat every interval,
// until the stream ends (its status) or acks is closed and drained (nil).
// Acks are cumulative, so a
// run of message acks waiting together goes as its last one; a forward's
// ack is always sent, for its verdict.
//
// A send blocks only when the sender stops reading while it keeps the
// connection open; the handler then waits here until the connection's
// keepalive gives up on it.
func (ds *deliverStream) write(hb time.Duration) error {
	tick := time.NewTicker(hb)
	defer tick.Stop()
	heartbeat := &pb.DeliverAck{Body: &pb.DeliverAck_Heartbeat{Heartbeat: &pb.DeliverHeartbeat{}}}
	send := func(m *pb.DeliverAck) bool {
		if err := ds.st.Send(m); err != nil {
			ds.cancel(err)
			return false
		}
		return true
	}
	handled := func(a *pb.DeliverHandled) *pb.DeliverAck {
		return &pb.DeliverAck{Body: &pb.DeliverAck_Handled{Handled: a}}
	}
	for {
		select {
		case <-ds.ctx.Done():
			return ds.end()
		case <-tick.C:
			if !send(heartbeat) {
				return ds.end()
			}
		case a, open := <-ds.acks:
			var plain *pb.DeliverHandled
			for a != nil {
				if a.GetVerdict() != nil || a.GetErrorCode() != 0 {
					if !send(handled(a)) {
						return ds.end()
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
			if plain != nil && !send(handled(plain)) {
				return ds.end()
			}
			if !open {
				return nil
			}
		}
	}
}
