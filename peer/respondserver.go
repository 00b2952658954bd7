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

// The response leg, ingress side: the Respond handler and what the server
// remembers of each reply leg. The host side is respond.go.

// LegWatcher is an optional interface of a Server's Handler (checked with
// a type assertion; *core.Engine has it): ReplyLegSilent is called when the
// reply leg of binding (job, gen) from node from went silent: nothing, not
// even a heartbeat, arrived on its stream for three heartbeat intervals
// while the connection stayed open (a host paused, partitioned, or
// swapping). The stream is ended first; the handler fails the job (silence
// is not proof of death, so the job does not run again).
//
// Bound: the handler is told within three heartbeat intervals of the last
// frame the host's stream delivered, plus one interval (the check runs
// every half interval, and scheduling); the host heartbeats every interval
// while it has nothing else to send. A pause of this node itself (its
// check finds it ran more than two intervals late) restarts the count
// rather than blame the host for it.
type LegWatcher interface {
	ReplyLegSilent(from, job string, gen uint64)
}

// LegOpenWatcher is another optional interface of a Handler: ReplyLegOpened
// is called when a consumer host opens the reply leg of binding (job, gen),
// which it does when it offers the job to its worker, so the ingress learns
// where the job runs before its first output.
type LegOpenWatcher interface {
	ReplyLegOpened(from, job string, gen uint64)
}

// Respond bounds on the receiving side.
const (
	// maxLegMemory caps how long a leg's state is kept for a host to
	// re-open it, whatever TTL its open frame claims.
	maxLegMemory = time.Hour
	// inLegSweep: legs no stream has held past their memory are swept at
	// most this often.
	inLegSweep = time.Minute
)

// Errors a Respond stream ends with.
var (
	errRespondOpen        = status.Error(codes.InvalidArgument, "a Respond stream must open with its job, once")
	errRespondFrame       = status.Error(codes.InvalidArgument, "a Respond frame must be an item or a heartbeat")
	errRespondSilent      = status.Errorf(codes.Unavailable, "the consumer host sent nothing on the reply leg for %d heartbeat intervals", silentIntervals)
	errRespondSuperseded  = status.Error(codes.Aborted, "the host opened the reply leg again: this stream is replaced")
	errRespondOpenTimeout = status.Error(codes.DeadlineExceeded, "the host did not open its Respond stream in time")
)

// inLegKey names a reply leg as the ingress sees it.
type inLegKey struct {
	from, job string
	gen       uint64
}

// inLeg is what the server knows of one reply leg, across the streams
// that carry it (a host re-opens a failed one): the numbers it handled,
// the stream that holds it now, and the job's cancel once there is one.
type inLeg struct {
	key inLegKey

	// mu serialises handling: dedup and the Handler call. Never held while
	// Server.mu is wanted by the same goroutine.
	mu      sync.Mutex
	session string
	next    uint64

	// Under Server.mu.
	cur           *respondStream
	cancel        *pb.PeerMessage // written on every stream that holds the leg until it ends
	cancelCounted bool
	forget        time.Time // while no stream holds it: dropped after
}

// respondStream is one Respond call. Two goroutines share it: a reader,
// which reads every frame and handles each item as it reads it (in order,
// under the leg's mu), and the handler's, which writes (acks, heartbeats,
// the cancel) and decides when the stream ends. Handling as it reads costs
// no hand-off per reply; it is safe because the Handler never blocks (the
// engine queues what it is given), and time spent in it does not count as
// the host's silence. A slow ingress therefore reads slowly, and HTTP/2
// flow control and the host's in-flight bound push back on the worker
// (respond.go). Silence is watched by a timer, not a goroutine. The reader
// is the only Recv caller: it ends once the handler returned, which is
// what ends a Recv on a server stream; Server.Stop waits for it.
type respondStream struct {
	s      *Server
	st     pb.PeerService_RespondServer
	from   string
	ctx    context.Context
	cancel context.CancelCauseFunc
	hb     time.Duration
	leg    *inLeg

	opened  chan *pb.RespondOpen // the open frame, once
	ready   chan struct{}        // closed once the leg is attached: items may be handled
	last    atomic.Int64         // when a frame last arrived (or an item was handled), UnixNano
	busy    atomic.Bool          // the reader is in the Handler
	acked   atomic.Int64         // the highest seq handled; -1: none
	kick    chan struct{}        // capacity 1: an ack or a cancel to write
	finish  chan struct{}        // closed once every item is handled (clean end)
	silence *time.Timer          // watchSilence
	due     time.Time            // when silence was due to fire; watchSilence's own
}

// Respond receives one job's reply leg: it handles the replies and release
// in order, once each across the streams of the leg (see inLeg), acks each
// after the Handler returns, heartbeats at the host's interval, writes the
// job's cancel when there is one (cancelOnLeg), and ends the stream when
// the host is silent for three intervals, telling the Handler if it is a
// LegWatcher.
func (s *Server) Respond(st pb.PeerService_RespondServer) error {
	from, ok := Caller(st.Context())
	if !ok {
		return errUnauthenticated
	}
	h, err := s.getHandler()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(st.Context())
	defer cancel(nil)
	rs := &respondStream{
		s: s, st: st, from: from, ctx: ctx, cancel: cancel,
		opened: make(chan *pb.RespondOpen, 1),
		ready:  make(chan struct{}),
		kick:   make(chan struct{}, 1),
		finish: make(chan struct{}),
	}
	rs.acked.Store(-1)
	if !s.goStream(func() { rs.read(h) }) {
		return status.Error(codes.Unavailable, "peer server stopping")
	}
	openTimer := time.AfterFunc(openTimeout, func() { cancel(errRespondOpenTimeout) })
	var open *pb.RespondOpen
	select {
	case open = <-rs.opened:
	case <-ctx.Done():
	}
	openTimer.Stop()
	if open == nil {
		return rs.end()
	}
	rs.hb = defaultHeartbeat
	if hb := time.Duration(open.GetHeartbeatIntervalNs()); hb > 0 {
		rs.hb = min(max(hb, minHeartbeat), maxHeartbeat)
	}
	rs.last.Store(time.Now().UnixNano())
	leg := s.attachLeg(from, open, rs)
	if w, ok := h.(LegOpenWatcher); ok {
		w.ReplyLegOpened(from, leg.key.job, leg.key.gen)
	}
	rs.due = time.Now().Add(silentIntervals * rs.hb)
	rs.silence = time.AfterFunc(silentIntervals*rs.hb, rs.watchSilence)
	close(rs.ready)

	err = rs.write()
	rs.silence.Stop()
	cancel(err)
	silent := errors.Is(context.Cause(ctx), errRespondSilent) && st.Context().Err() == nil
	if current := s.detachLeg(rs, err == nil || silent); current && silent {
		s.cfg.Metrics.legSilences.WithLabelValues("ingress").Inc()
		s.cfg.Logger.Warn("a consumer host went silent on a job's reply leg; failing the job",
			"from", from, "job", leg.key.job, "gen", leg.key.gen, "heartbeat", rs.hb)
		if w, ok := h.(LegWatcher); ok {
			w.ReplyLegSilent(from, leg.key.job, leg.key.gen)
		}
	}
	return err
}

// attachLeg makes rs the stream that holds its leg, replacing (ending) any
// earlier one: the host opens a stream again only once it gave up on the
// last.
func (s *Server) attachLeg(from string, o *pb.RespondOpen, rs *respondStream) *inLeg {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if now.Sub(s.legsSwept) >= inLegSweep {
		s.legsSwept = now
		for k, l := range s.inLegs {
			if l.cur == nil && now.After(l.forget) {
				delete(s.inLegs, k)
			}
		}
	}
	k := inLegKey{from, o.GetJobId(), o.GetGeneration()}
	l := s.inLegs[k]
	if l == nil {
		l = &inLeg{key: k}
		s.inLegs[k] = l
	}
	if old := l.cur; old != nil {
		old.cancel(errRespondSuperseded)
	}
	l.cur = rs
	l.forget = now.Add(min(max(time.Duration(o.GetTtlNs()), 0), maxLegMemory) + 2*legTTLSlack)
	rs.leg = l
	return l
}

// detachLeg ends rs's hold on its leg; done forgets the leg (it ended
// cleanly, or went silent), else it is kept until its memory runs out for
// the host to re-open it. It reports whether rs still held the leg.
func (s *Server) detachLeg(rs *respondStream, done bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := rs.leg
	if l.cur != rs {
		return false
	}
	l.cur = nil
	if done && s.inLegs[l.key] == l {
		delete(s.inLegs, l.key)
	}
	return true
}

// cancelOnLeg puts the cancel p of binding (job, gen) on its reply leg
// from node from, when a stream holds it now: written at once, and again
// on any stream that re-opens the leg. False when no stream holds such a
// leg: the caller sends the cancel by its lane. It never blocks.
func (s *Server) cancelOnLeg(from, job string, gen uint64, p *pb.PeerMessage) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.inLegs[inLegKey{from, job, gen}]
	if l == nil || l.cur == nil {
		return false
	}
	if l.cancel == nil {
		l.cancel = p
	}
	select {
	case l.cur.kick <- struct{}{}:
	default:
	}
	return true
}

// legCancel is the cancel to write on rs, if its leg has one.
func (s *Server) legCancel(rs *respondStream) *pb.PeerMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	return rs.leg.cancel
}

// cancelWritten counts a leg's cancel as sent, once however many streams
// carried it.
func (s *Server) cancelWritten(rs *respondStream) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !rs.leg.cancelCounted {
		rs.leg.cancelCounted = true
		s.cfg.Metrics.messages.WithLabelValues(string(core.MsgCancel)).Inc()
	}
}

// setLegCancelled installs the router's hook: told of every cancel the
// Handler took by another path than a reply leg.
func (s *Server) setLegCancelled(f func(job string, gen uint64)) { s.legCancelled.Store(&f) }

// handleMessage hands m to h; a cancel is then passed to the router's hook,
// which ends the job's reply leg on this node (the engine has marked the
// binding cancelling).
func (s *Server) handleMessage(h Handler, from string, m core.Message) {
	h.HandleMessage(from, m)
	if m.Kind == core.MsgCancel {
		if f := s.legCancelled.Load(); f != nil {
			(*f)(m.JobID, m.Gen)
		}
	}
}

// end is the status the stream ends with once rs.ctx is done.
func (rs *respondStream) end() error { return endStatus(rs.st.Context(), rs.ctx) }

// read reads every frame: the open first, then items, each handled as it
// is read, and heartbeats. It closes finish once the host closed its side
// with every item handled, and cancels the stream on anything wrong.
func (rs *respondStream) read(h Handler) {
	f, err := rs.st.Recv()
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = errRespondOpen
		}
		rs.cancel(err)
		return
	}
	open := f.GetOpen()
	if open == nil || open.GetJobId() == "" {
		rs.cancel(errRespondOpen)
		return
	}
	rs.opened <- open
	select {
	case <-rs.ready:
	case <-rs.ctx.Done():
		return
	}
	leg, session := rs.leg, open.GetSession()
	lastKick := int64(-1)
	for {
		f, err := rs.st.Recv()
		if errors.Is(err, io.EOF) {
			close(rs.finish)
			return
		}
		if err != nil {
			rs.cancel(err)
			return
		}
		rs.last.Store(time.Now().UnixNano())
		switch b := f.GetBody().(type) {
		case *pb.RespondFrame_Item:
			if rs.ctx.Err() != nil {
				// Not handled: the host resends it on its next stream.
				return
			}
			// Time spent in the Handler is this node's, not the host's
			// silence: watchSilence does not count it.
			rs.busy.Store(true)
			rs.handleItem(h, leg, session, b.Item)
			rs.last.Store(time.Now().UnixNano())
			rs.busy.Store(false)
			s := int64(b.Item.GetSeq())
			if s > rs.acked.Load() {
				rs.acked.Store(s)
			}
			// Acks are cumulative, so most can wait: one ack per item would
			// double the frames (and write syscalls) of a streaming job. Ack
			// at once what ends the leg (the host closes on it), and every
			// ackEvery items so the host's in-flight window keeps moving;
			// the rest goes with the next heartbeat tick.
			if m := b.Item.GetMessage(); m.GetKind() == pb.PeerMessage_KIND_RELEASE || m.GetEnd() != nil || s-lastKick >= ackEvery {
				lastKick = s
				select {
				case rs.kick <- struct{}{}:
				default:
				}
			}
		case *pb.RespondFrame_Heartbeat:
		case *pb.RespondFrame_Open:
			rs.cancel(errRespondOpen)
			return
		default:
			rs.cancel(errRespondFrame)
			return
		}
	}
}

// handleItem hands one item to the Handler unless the leg handled it
// already.
func (rs *respondStream) handleItem(h Handler, leg *inLeg, session string, it *pb.RespondItem) {
	s := rs.s
	leg.mu.Lock()
	defer leg.mu.Unlock()
	if session != leg.session {
		// A new host process (or the leg's first stream).
		leg.session, leg.next = session, 0
	}
	seq := it.GetSeq()
	if seq < leg.next {
		return
	}
	leg.next = seq + 1
	m, err := MessageFromPB(it.GetMessage())
	if err == nil && (m.Kind != core.MsgReply && m.Kind != core.MsgRelease || m.JobID != leg.key.job || m.Gen != leg.key.gen) {
		err = errors.New("a reply leg carries its own job's replies and release only")
	}
	if err != nil {
		s.cfg.Metrics.invalid.Inc()
		s.cfg.Logger.Warn("skipped an invalid message on a reply leg", "from", rs.from, "job", leg.key.job, "err", err)
		return
	}
	s.handleMessage(h, rs.from, m)
}

// ackEvery is how many items a reply leg handles between acks it sends at
// once; it must stay well under the host's in-flight window (256).
const ackEvery = 32

// write sends acks as items are handled (cumulative: the latest covers
// the rest), the leg's cancel once per stream, and a heartbeat when
// nothing else went out for half an interval, until the stream ends (its
// status) or the host closed its side with every item handled (nil, after
// the last ack).
func (rs *respondStream) write() error {
	tick := time.NewTicker(rs.hb)
	defer tick.Stop()
	var lastSend time.Time
	lastAck := int64(-1)
	cancelSent := false
	send := func(c *pb.RespondControl) bool {
		if err := rs.st.Send(c); err != nil {
			rs.cancel(err)
			return false
		}
		lastSend = time.Now()
		return true
	}
	flush := func() bool {
		if !cancelSent {
			if p := rs.s.legCancel(rs); p != nil {
				if !send(&pb.RespondControl{Body: &pb.RespondControl_Cancel{Cancel: p}}) {
					return false
				}
				cancelSent = true
				rs.s.cancelWritten(rs)
			}
		}
		if a := rs.acked.Load(); a > lastAck {
			if !send(&pb.RespondControl{Body: &pb.RespondControl_Ack{Ack: &pb.RespondAck{Seq: uint64(a)}}}) {
				return false
			}
			lastAck = a
		}
		return true
	}
	heartbeat := &pb.RespondControl{Body: &pb.RespondControl_Heartbeat{Heartbeat: &pb.DeliverHeartbeat{}}}
	if !flush() {
		return rs.end()
	}
	for {
		select {
		case <-rs.ctx.Done():
			return rs.end()
		case <-rs.finish:
			if !flush() {
				return rs.end()
			}
			return nil
		case <-rs.kick:
			if !flush() {
				return rs.end()
			}
		case <-tick.C:
			if !flush() {
				return rs.end()
			}
			if time.Since(lastSend) >= rs.hb/2 && !send(heartbeat) {
				return rs.end()
			}
		}
	}
}

// watchSilence ends the stream once nothing arrived for three intervals:
// it runs when that would be the case if nothing arrived since the last
// check, and looks again. A check that runs more than two intervals after
// it was due means this process did not run meanwhile (paused, starved):
// the host's frames may be waiting unread, so its count starts again
// rather than the job fail for this node's own stall; so does a check
// that finds the reader in the Handler.
func (rs *respondStream) watchSilence() {
	if rs.ctx.Err() != nil {
		return
	}
	now := time.Now()
	if now.Sub(rs.due) > 2*rs.hb || rs.busy.Load() {
		rs.last.Store(now.UnixNano())
	}
	last := time.Unix(0, rs.last.Load())
	if now.Sub(last) >= silentIntervals*rs.hb {
		rs.cancel(errRespondSilent)
		return
	}
	rs.due = last.Add(silentIntervals * rs.hb)
	rs.silence.Reset(rs.due.Sub(now))
}
