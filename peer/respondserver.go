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

// Respond bounds on the receiving side.
const (
	// maxLegMemory caps how long a leg's state is kept for a host to
	// re-open it, whatever TTL its open frame claims.
	maxLegMemory = time.Hour
	// inLegSweep: legs no stream has held past their memory are swept at
	// most this often.
	inLegSweep = time.Minute
	// finishedLegMemory is how long a leg is remembered after its last
	// item was handled: a host whose trunk failed before that item's ack
	// reached it resends the leg's unacked tail on its next trunk (after
	// up to three heartbeat intervals to notice, and its backoff), and
	// finds the leg's numbers here, so nothing is handled twice. A resend
	// later than that is handled again, and is stale at the engine (the
	// job ended, or moved to a new generation).
	finishedLegMemory = 10 * time.Second
)

// Errors a Respond stream ends with.
var (
	errRespondOpen        = status.Error(codes.InvalidArgument, "a Respond stream must open with a leg, and a leg must name its job")
	errRespondFrame       = status.Error(codes.InvalidArgument, "a Respond frame must be an open, an item, an end or a heartbeat")
	errRespondSilent      = status.Errorf(codes.Unavailable, "the consumer host sent nothing on the reply trunk for %d heartbeat intervals", silentIntervals)
	errRespondOpenTimeout = status.Error(codes.DeadlineExceeded, "the host did not open its Respond stream in time")
)

// inLegKey names a reply leg as the ingress sees it.
type inLegKey struct {
	from, job string
	gen       uint64
}

// inLeg is what the server knows of one reply leg, across the trunks that
// carry it (a host opens the leg again on its next trunk when one fails):
// the numbers it handled, the trunk that holds it now, and the job's
// cancel once there is one. Once its last item (an end or a release) is
// handled, or the host ended it without one (an end frame), it is done:
// kept for finishedLegMemory, so a host that resends the last item (its
// ack was lost with a trunk) opens it again with its numbers and nothing
// is handled twice, then forgotten. It is also forgotten when its trunk
// went silent, or when no trunk held it for its memory (attachLeg
// sweeps).
type inLeg struct {
	key inLegKey

	// mu serialises handling: dedup and the receiver call. Never held while
	// Server.mu is wanted by the same goroutine.
	mu      sync.Mutex
	session string
	next    uint64

	// Under server.mu.
	cur           *respondStream
	cancel        *pb.PeerMessage // written on every trunk that holds the leg until it ends
	cancelOn      *respondStream  // the trunk the cancel was last written on
	cancelCounted bool
	forget        time.Time // while no trunk holds it: dropped after
	done          bool      // its last item was handled (see finishLeg)
}

// finishedLeg is an entry of server.finished: a done leg, to forget once
// until has passed (unless it was opened again since).
type finishedLeg struct {
	l     *inLeg
	until time.Time
}

// respondStream is one Respond call: a reply trunk from one host, which
// carries any number of its legs to this node. Two goroutines share it: a
// reader, which reads every frame and handles each item as it reads it (in
// order, under its leg's mu), and the handler's, which writes (acks,
// heartbeats, cancels) and decides when the stream ends. Handling as it
// reads costs no hand-off per reply; it is safe because the receiver never
// blocks (the engine queues what it is given), and time spent in it does
// not count as the host's silence. A slow ingress therefore reads slowly,
// and HTTP/2 flow control and the host's in-flight bound push back on the
// worker (respond.go). Silence is watched by a timer, not a goroutine. The
// reader is the only Recv caller: it ends once the handler returned, which
// is what ends a Recv on a server stream; server.stop waits for it.
type respondStream struct {
	s       *server
	st      pb.PeerService_RespondServer
	from    string
	ctx     context.Context
	cancel  context.CancelCauseFunc
	hb      time.Duration
	session string // the host's session, from the first open
	// epoch orders the server's streams by when they started: a leg held
	// by a newer trunk is never taken back by an older one still reading
	// frames the host sent before it gave up on it.
	epoch uint64

	opened  chan *pb.RespondOpen // the first open frame, once
	ready   chan struct{}        // closed once the stream is set up: legs may open
	last    atomic.Int64         // when a frame last arrived (or an item was handled), UnixNano
	busy    atomic.Bool          // the reader is in the receiver
	kick    chan struct{}        // capacity 1: an ack or a cancel to write
	finish  chan struct{}        // closed once every item is handled (clean end)
	silence *time.Timer          // watchSilence
	due     time.Time            // when silence was due to fire; watchSilence's own

	// ackMu guards acks: per leg, the highest seq handled and not yet
	// acked; unsent and unsentBytes count the items and the output bytes
	// handled since acks were last written.
	ackMu       sync.Mutex
	acks        map[inLegKey]uint64
	unsent      int
	unsentBytes int

	// Under server.mu.
	held    map[inLegKey]*inLeg // the legs this trunk holds
	cancels []*inLeg            // legs whose cancel is to be written on it
}

// Respond receives one host's reply trunk: it handles each leg's replies
// and release in order, once each across the trunks that carry the leg
// (see inLeg), acks them per leg after the receiver returns, heartbeats at
// the host's interval, writes each leg's cancel when there is one
// (cancelOnLeg), and ends the stream when the host is silent for three
// intervals, failing the jobs of the legs it held (ReplyLegSilent).
func (s *server) Respond(st pb.PeerService_RespondServer) error {
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
	rs := &respondStream{
		s: s, st: st, from: from, ctx: ctx, cancel: cancel,
		opened: make(chan *pb.RespondOpen, 1),
		ready:  make(chan struct{}),
		kick:   make(chan struct{}, 1),
		finish: make(chan struct{}),
		acks:   map[inLegKey]uint64{},
		held:   map[inLegKey]*inLeg{},
		epoch:  s.epochs.Add(1),
	}
	if !s.goStream(func() { rs.read(rcv) }) {
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
	rs.session = open.GetSession()
	rs.last.Store(time.Now().UnixNano())
	rs.due = time.Now().Add(silentIntervals * rs.hb)
	rs.silence = time.AfterFunc(silentIntervals*rs.hb, rs.watchSilence)
	close(rs.ready)

	err = rs.write()
	rs.silence.Stop()
	cancel(err)
	silent := errors.Is(context.Cause(ctx), errRespondSilent) && st.Context().Err() == nil
	if legs := s.detachAll(rs, silent); silent && len(legs) > 0 {
		s.cfg.Metrics.legSilences.WithLabelValues("ingress").Add(float64(len(legs)))
		s.cfg.Logger.Warn("a consumer host went silent on its reply trunk; failing the jobs of its legs",
			"from", from, "legs", len(legs), "heartbeat", rs.hb)
		for _, k := range legs {
			rcv.ReplyLegSilent(from, k.job, k.gen)
		}
	}
	return err
}

// attachLeg makes rs the trunk that holds the leg o opens: a host opens a
// leg on a new trunk only once it gave up on the last.
func (s *server) attachLeg(from string, o *pb.RespondOpen, rs *respondStream) *inLeg {
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
	if rs.held == nil {
		// rs ended: its reader handles nothing more. The leg is kept for
		// the host's next trunk like any other.
		if l.cur == nil && l.forget.IsZero() {
			l.forget = now.Add(min(max(time.Duration(o.GetTtlNs()), 0), maxLegMemory) + 2*legTTLSlack)
		}
		return l
	}
	if old := l.cur; old != nil && old != rs {
		if old.epoch > rs.epoch {
			return l // a stale frame of an older trunk: the newer one holds the leg
		}
		delete(old.held, k)
	}
	// A done leg opened again is a resend of its tail: skipped by number.
	l.cur, l.done = rs, false
	rs.held[k] = l
	l.forget = now.Add(min(max(time.Duration(o.GetTtlNs()), 0), maxLegMemory) + 2*legTTLSlack)
	if l.cancel != nil {
		rs.cancels = append(rs.cancels, l)
		select {
		case rs.kick <- struct{}{}:
		default:
		}
	}
	return l
}

// finishLeg marks done a leg whose last item rs handled, or that the host
// ended on rs without one: rs no longer holds it, and it is forgotten
// after finishedLegMemory unless the host opens it again meanwhile.
func (s *server) finishLeg(rs *respondStream, l *inLeg) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.cur != rs {
		return
	}
	l.cur = nil
	delete(rs.held, l.key)
	now := time.Now()
	if s.inLegs[l.key] == l {
		l.done, l.forget = true, now.Add(finishedLegMemory)
		s.finished = append(s.finished, finishedLeg{l, l.forget})
	}
	s.pruneFinishedLocked(now)
}

// pruneFinishedLocked forgets the done legs whose memory ran out. Entries
// are in the order they were added, each with the same memory, so only
// the front is looked at.
func (s *server) pruneFinishedLocked(now time.Time) {
	n := 0
	for n < len(s.finished) && now.After(s.finished[n].until) {
		l := s.finished[n].l
		if l.done && l.cur == nil && now.After(l.forget) && s.inLegs[l.key] == l {
			delete(s.inLegs, l.key)
		}
		n++
	}
	if n > 0 {
		clear(s.finished[:n])
		s.finished = s.finished[n:]
	}
}

// detachAll ends rs's hold on its legs and returns them. Silent forgets
// them (their jobs fail); otherwise they are kept until their memory runs
// out for the host to open them again on its next trunk.
func (s *server) detachAll(rs *respondStream, silent bool) []inLegKey {
	s.mu.Lock()
	defer s.mu.Unlock()
	var keys []inLegKey
	for k, l := range rs.held {
		if l.cur != rs {
			continue
		}
		l.cur = nil
		keys = append(keys, k)
		if silent && s.inLegs[k] == l {
			delete(s.inLegs, k)
		}
	}
	rs.held = nil
	return keys
}

// cancelOnLeg puts the cancel p of binding (job, gen) on its reply leg
// from node from, when a trunk holds it now: written at once, and again
// on any trunk that opens the leg again. False when no trunk holds such a
// leg: the caller sends the cancel by its lane. It never blocks.
func (s *server) cancelOnLeg(from, job string, gen uint64, p *pb.PeerMessage) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.inLegs[inLegKey{from, job, gen}]
	if l == nil || l.cur == nil {
		return false
	}
	if l.cancel == nil {
		l.cancel = p
	}
	l.cur.cancels = append(l.cur.cancels, l)
	select {
	case l.cur.kick <- struct{}{}:
	default:
	}
	return true
}

// cancelsFor takes the cancels to write on rs: each leg's once per trunk,
// while rs holds it.
func (s *server) cancelsFor(rs *respondStream) []*pb.PeerMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ps []*pb.PeerMessage
	for _, l := range rs.cancels {
		if l.cur == rs && l.cancelOn != rs && l.cancel != nil {
			l.cancelOn = rs
			ps = append(ps, l.cancel)
			if !l.cancelCounted {
				l.cancelCounted = true
				s.cfg.Metrics.messages.WithLabelValues(string(core.MsgCancel)).Inc()
			}
		}
	}
	rs.cancels = nil
	return ps
}

// handleMessage hands m to rcv; a cancel then ends the job's reply leg on
// this node, if it has one (the engine has marked the binding cancelling,
// so it sends nothing more on it).
func (s *server) handleMessage(rcv core.Receiver, from string, m core.Message) {
	rcv.HandleMessage(from, m)
	if m.Kind == core.MsgCancel {
		s.router.legCancelled(m.JobID, m.Gen)
	}
}

// end is the status the stream ends with once rs.ctx is done.
func (rs *respondStream) end() error { return endStatus(rs.st.Context(), rs.ctx) }

// read reads every frame: the first open, then legs' opens, items (each
// handled as it is read), ends and heartbeats. It closes finish once the
// host closed its side with every item handled, and cancels the stream on
// anything wrong.
func (rs *respondStream) read(rcv core.Receiver) {
	f, err := rs.st.Recv()
	// A heartbeat may come before the first open (a host whose first leg
	// was slow to send): it says the host is alive, nothing more.
	for err == nil && f.GetHeartbeat() != nil {
		f, err = rs.st.Recv()
	}
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = errRespondOpen
		}
		rs.cancel(err)
		return
	}
	// The first frame opens a leg: an open, or items whose first carries
	// one.
	open := f.GetOpen()
	if its := f.GetItems().GetItems(); open == nil && len(its) > 0 {
		open = its[0].GetOpen()
	}
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
	legs := map[inLegKey]*inLeg{} // the legs opened on this trunk, by key
	openLeg := func(o *pb.RespondOpen) {
		l := rs.s.attachLeg(rs.from, o, rs)
		legs[l.key] = l
		rs.busy.Store(true) // the receiver's time is not the host's silence
		rcv.ReplyLegOpened(rs.from, l.key.job, l.key.gen)
		rs.last.Store(time.Now().UnixNano())
		rs.busy.Store(false)
	}
	// item handles one item of a frame: false when the reader must stop.
	item := func(it *pb.RespondItem) bool {
		if rs.ctx.Err() != nil {
			// Not handled: the host resends it on its next trunk.
			return false
		}
		if o := it.GetOpen(); o != nil {
			if o.GetJobId() == "" {
				rs.cancel(errRespondOpen)
				return false
			}
			openLeg(o)
		}
		m := it.GetMessage()
		k := inLegKey{rs.from, m.GetJobId(), m.GetGeneration()}
		leg := legs[k]
		if leg == nil {
			rs.s.cfg.Metrics.invalid.Inc()
			rs.s.cfg.Logger.Warn("skipped an item of a leg not open on the reply trunk", "from", rs.from, "job", k.job, "gen", k.gen)
			return true
		}
		// Time spent in the receiver is this node's, not the host's
		// silence: watchSilence does not count it.
		rs.busy.Store(true)
		latest := rs.handleItem(rcv, leg, it)
		rs.last.Store(time.Now().UnixNano())
		rs.busy.Store(false)
		// Acks are cumulative per leg, so most can wait: one ack per item
		// would double the frames (and write syscalls) of a streaming job.
		// Ack at once what ends a leg (the host ends it on that), and
		// whenever ackEvery items or ackBytes of output went unacked, so
		// every leg's in-flight window keeps moving (a few large outputs
		// fill it long before 32 items); the rest goes with the next
		// heartbeat tick.
		final := m.GetKind() == pb.PeerMessage_KIND_RELEASE || m.GetEnd() != nil
		rs.ackMu.Lock()
		if s := it.GetSeq(); s >= rs.acks[k] {
			rs.acks[k] = s
		}
		rs.unsent++
		rs.unsentBytes += len(m.GetOutput())
		now := final || rs.unsent >= ackEvery || rs.unsentBytes >= ackBytes
		if now {
			rs.unsent, rs.unsentBytes = 0, 0
		}
		rs.ackMu.Unlock()
		// A final seen again (resent after its ack was lost) ends the leg
		// only if nothing came after it: what did is a newer opening of
		// the leg.
		if final && latest {
			// Nothing of the leg comes after its last item (a host with
			// more sends a new open first): it is done on this trunk. Its
			// ack is on its way.
			delete(legs, k)
			rs.s.finishLeg(rs, leg)
		}
		if now {
			select {
			case rs.kick <- struct{}{}:
			default:
			}
		}
		return true
	}
	for first := true; ; first = false {
		if !first { // the first frame was read above
			if f, err = rs.st.Recv(); errors.Is(err, io.EOF) {
				close(rs.finish)
				return
			} else if err != nil {
				rs.cancel(err)
				return
			}
			rs.last.Store(time.Now().UnixNano())
		}
		switch b := f.GetBody().(type) {
		case *pb.RespondFrame_Items:
			for _, it := range b.Items.GetItems() {
				if !item(it) {
					return
				}
			}
		case *pb.RespondFrame_Open:
			if rs.ctx.Err() != nil {
				return
			}
			if b.Open.GetJobId() == "" {
				rs.cancel(errRespondOpen)
				return
			}
			openLeg(b.Open)
		case *pb.RespondFrame_End:
			k := inLegKey{rs.from, b.End.GetJobId(), b.End.GetGeneration()}
			if leg := legs[k]; leg != nil {
				delete(legs, k)
				rs.s.finishLeg(rs, leg)
			}
		case *pb.RespondFrame_Heartbeat:
		default:
			rs.cancel(errRespondFrame)
			return
		}
	}
}

// handleItem hands one item to the receiver unless the leg handled it
// already.
// It reports whether the item is the latest the leg handled: just now, or
// already (a resend whose ack was lost).
func (rs *respondStream) handleItem(rcv core.Receiver, leg *inLeg, it *pb.RespondItem) (latest bool) {
	s := rs.s
	leg.mu.Lock()
	defer leg.mu.Unlock()
	if rs.session != leg.session {
		// A new host process (or the leg's first trunk).
		leg.session, leg.next = rs.session, 0
	}
	seq := it.GetSeq()
	if seq < leg.next {
		return seq+1 == leg.next
	}
	leg.next = seq + 1
	m, err := MessageFromPB(it.GetMessage())
	if err == nil && (m.Kind != core.MsgReply && m.Kind != core.MsgRelease || m.JobID != leg.key.job || m.Gen != leg.key.gen) {
		err = errors.New("a reply leg carries its own job's replies and release only")
	}
	if err != nil {
		s.cfg.Metrics.invalid.Inc()
		s.cfg.Logger.Warn("skipped an invalid message on a reply leg", "from", rs.from, "job", leg.key.job, "err", err)
		return true
	}
	s.handleMessage(rcv, rs.from, m)
	return true
}

// ackEvery and ackBytes are how many items, or bytes of output, a reply
// trunk handles between the acks it sends at once; they must stay well
// under the host's in-flight window per leg (256 items, 4 MiB).
const (
	ackEvery = 32
	ackBytes = 1 << 20
)

// write sends acks as items are handled (per leg, cumulative: the latest
// covers the rest), each leg's cancel once per trunk, and a heartbeat
// when nothing else went out for half an interval, until the stream ends
// (its status) or the host closed its side with every item handled (nil,
// after the last acks).
func (rs *respondStream) write() error {
	tick := time.NewTicker(rs.hb)
	defer tick.Stop()
	var lastSend time.Time
	send := func(c *pb.RespondControl) bool {
		if err := rs.st.Send(c); err != nil {
			rs.cancel(err)
			return false
		}
		lastSend = time.Now()
		return true
	}
	type ack struct {
		k   inLegKey
		seq uint64
	}
	var acks []ack
	flush := func() bool {
		for _, p := range rs.s.cancelsFor(rs) {
			if !send(&pb.RespondControl{Body: &pb.RespondControl_Cancel{Cancel: p}}) {
				return false
			}
		}
		rs.ackMu.Lock()
		for k, seq := range rs.acks {
			acks = append(acks, ack{k, seq})
		}
		clear(rs.acks)
		rs.unsent, rs.unsentBytes = 0, 0
		rs.ackMu.Unlock()
		for i, a := range acks {
			if !send(&pb.RespondControl{Body: &pb.RespondControl_Ack{Ack: &pb.RespondAck{Seq: a.seq, JobId: a.k.job, Generation: a.k.gen}}}) {
				return false
			}
			acks[i] = ack{}
		}
		acks = acks[:0]
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
// that finds the reader in the receiver.
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
