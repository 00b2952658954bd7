package peer

import (
	"context"
	"errors"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchyard/switchyard/internal/chans"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/switchyard/switchyard/core"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// The response leg's stream, receiving end: the Respond handler, one per
// reply stream from a consumer host. The sending end is reply_send.go; what
// the ingress remembers of each leg across reply streams is leg_recv.go.

// Errors a Respond stream ends with.
var (
	errRespondOpen        = status.Error(codes.InvalidArgument, "a Respond stream must open with a leg, and a leg must name its job")
	errRespondFrame       = status.Error(codes.InvalidArgument, "a Respond frame must be an open, items, an end or a heartbeat")
	errRespondSilent      = status.Errorf(codes.Unavailable, "the consumer host sent nothing on the reply stream for %d heartbeat intervals", silentIntervals)
	errRespondOpenTimeout = status.Error(codes.DeadlineExceeded, "the host did not open its Respond stream in time")
)

// ackEvery and ackBytes are how many items, or bytes of output, a reply
// reply stream handles between the acks it sends at once; they must stay well
// under the host's in-flight window per leg (256 items, 4 MiB).
const (
	ackEvery = 32
	ackBytes = 1 << 20
)

// respondIn is one Respond call: a reply stream from one host, which
// carries any number of its legs to this node. Its reader goroutine
// (respondReader) reads every frame and hands each item to the receiver as
// it reads it, under its leg's mu: no hand-off per reply, which is safe
// because the receiver never blocks, and time in it is not the host's
// silence. The handler's goroutine (respondWriter) writes acks, heartbeats
// and cancels, and decides when the stream ends. Silence is watched by a
// timer. The reader is the only Recv caller and ends once the handler
// returned; server.stop waits for it.
type respondIn struct {
	inCall
	st      pb.PeerService_RespondServer
	hb      time.Duration
	session string // the host's session, from the first open
	// epoch orders the server's streams by when they started: a leg held
	// by a newer reply stream is never taken back by an older one still reading
	// frames the host sent before it gave up on it.
	epoch uint64

	opened  chan *pb.RespondOpen // the first open frame, once
	ready   chan struct{}        // closed once the stream is set up: legs may open
	last    atomic.Int64         // when a frame last arrived (or an item was handled), UnixNano
	busy    atomic.Bool          // the reader is in the receiver
	kick    chan struct{}        // capacity 1: an ack, a cancel or a grant to write
	finish  chan struct{}        // closed once every item is handled (clean end)
	silence *time.Timer          // watchSilence
	due     atomic.Int64         // when silence is due to fire, UnixNano: set by watchSilence, read by release

	// ackMu guards acks: per leg, the highest seq handled and not yet
	// acked; unsent and unsentBytes count the items and the output bytes
	// handled since acks were last written.
	ackMu       sync.Mutex
	acks        map[inLegKey]uint64
	unsent      int
	unsentBytes int

	// Under server.mu.
	held    map[inLegKey]*inLeg // the legs this reply stream holds
	pending [nControls][]*inLeg // by control: legs whose control is to be written on it
}

// Respond receives one host's reply stream: it handles each leg's replies
// and release in order, once each across the reply streams that carry the leg
// (see inLeg), acks them per leg after the receiver returns, heartbeats at
// the host's interval, writes each leg's cancel when there is one
// (cancelOnLeg), and ends the stream when the host is silent for three
// intervals, failing the jobs of the legs it held (ResponseLegSilent).
func (s *server) Respond(st pb.PeerService_RespondServer) error {
	c, rcv, err := s.accept(st)
	if err != nil {
		return err
	}
	defer c.cancel(nil)
	rs := &respondIn{
		inCall: c, st: st,
		opened: make(chan *pb.RespondOpen, 1),
		ready:  make(chan struct{}),
		kick:   make(chan struct{}, 1),
		finish: make(chan struct{}),
		acks:   map[inLegKey]uint64{},
		held:   map[inLegKey]*inLeg{},
		epoch:  s.epochs.Add(1),
	}
	if !s.goStream(func() { rs.read(rcv) }) {
		return errStopping
	}
	open := rs.awaitOpen()
	if open == nil {
		return rs.end()
	}
	rs.start(open)
	err = (&respondWriter{rs: rs}).run()
	rs.silence.Stop()
	c.cancel(err)
	rs.release(rcv)
	return err
}

// awaitOpen waits, at most openTimeout, for the reader to hand over the
// reply stream's first open: nil when the stream ended first.
func (rs *respondIn) awaitOpen() *pb.RespondOpen {
	t := time.AfterFunc(openTimeout, func() { rs.cancel(errRespondOpenTimeout) })
	defer t.Stop()
	select {
	case open := <-rs.opened:
		return open
	case <-rs.ctx.Done():
		return nil
	}
}

// start sets the reply stream up from its first open (the host's heartbeat
// interval and session) and arms the silence watch: legs may open now.
func (rs *respondIn) start(open *pb.RespondOpen) {
	rs.hb = heartbeatOf(open.GetHeartbeatIntervalNs())
	rs.session = open.GetSession()
	now := time.Now()
	rs.last.Store(now.UnixNano())
	rs.due.Store(now.Add(silentIntervals * rs.hb).UnixNano())
	rs.silence = time.AfterFunc(silentIntervals*rs.hb, rs.watchSilence)
	close(rs.ready)
}

// release ends the reply stream's hold on its legs once it ended. After the
// host went silent (and not the call itself), the receiver is told of each
// leg (ResponseLegSilent). After the reply stream broke (the host's connection
// closed or reset: a host killed, or a network fault), its legs wait for
// the host to take them up on a new reply stream; those it has not taken up
// once the host has been silent for as long — three intervals since its
// last frame — are reported the same way (watchOrphans): a crash and a
// pause end the same jobs in the same bound.
func (rs *respondIn) release(rcv core.Receiver) {
	silent := errors.Is(context.Cause(rs.ctx), errRespondSilent) && rs.st.Context().Err() == nil
	legs := rs.s.detachAll(rs)
	if len(legs) == 0 {
		return
	}
	if !silent {
		// Three intervals since the host's last frame. When that is past
		// already, this node is the one that did not read (it stalled:
		// its own silence watch would have fired otherwise): the host
		// gets one interval from now, and answering a ping proves it
		// alive (it may be in its backoff before a new reply stream).
		// So too when this node stalled in the last three intervals: the
		// frames it read since may have waited in its buffers, sent
		// before the host gave up on the stream for this node's silence
		// (rs.last is when this node read them, not when the host sent
		// them), and the host may still be in its backoff. A silence
		// check that is overdue now is such a stall, seen here first.
		now := time.Now()
		if now.Sub(time.Unix(0, rs.due.Load())) > 2*rs.hb {
			rs.s.noteStall(now)
		}
		last := time.Unix(0, rs.last.Load())
		due, stalled := last.Add(silentIntervals*rs.hb), false
		if soon := now.Add(rs.hb); due.Before(soon) || rs.s.stalledSince(now.Add(-silentIntervals*rs.hb)) {
			due, stalled = soon, true
		}
		rs.s.watchOrphans(rcv, rs.from, legs, due, rs.hb, stalled)
		if !stalled {
			rs.s.suspectAfterBreak(rs.from, legs, rs.hb)
		}
		return
	}
	rs.s.reportSilent(rcv, rs.from, legs, rs.hb)
}

// suspectAfterBreak tells Config.Suspect of host if, one heartbeat after
// its reply stream broke, one of the reply stream's legs (not done) is
// still on no reply stream: a live host reopens a failed reply stream
// within milliseconds, so the host is suspected (offered nothing new, its
// queues taken over) long before its legs are reported silent.
func (s *server) suspectAfterBreak(from string, legs []inLegKey, hb time.Duration) {
	if s.cfg.Suspect == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return
	}
	var t *time.Timer
	t = time.AfterFunc(hb, func() {
		s.mu.Lock()
		delete(s.orphanWatches, t)
		orphaned := false
		for _, k := range legs {
			if l := s.inLegs[k]; l != nil && l.cur == nil && !l.done {
				orphaned = true
				break
			}
		}
		s.mu.Unlock()
		if orphaned {
			s.cfg.Suspect(from)
		}
	})
	s.orphanWatches[t] = struct{}{}
}

// reportSilent tells the receiver that the legs from host went silent,
// and Config.Suspect that host is suspected.
func (s *server) reportSilent(rcv core.Receiver, from string, legs []inLegKey, hb time.Duration) {
	if s.cfg.Suspect != nil {
		s.cfg.Suspect(from)
	}
	s.cfg.Metrics.legSilences.WithLabelValues("ingress").Add(float64(len(legs)))
	s.cfg.Logger.Warn("a consumer host went silent on its reply stream; reporting the jobs of its legs",
		"from", from, "legs", len(legs), "heartbeat", hb)
	for _, k := range legs {
		rcv.ResponseLegSilent(from, k.job, k.gen)
	}
}

// watchOrphans looks, at due, at the legs of a broken reply stream from
// host that no reply stream has taken up since and that are not done, and
// reports them: their host has been silent for three intervals. After this
// node stalled (ping), it pings the host first: one that answers is alive
// (in its backoff before opening a new reply stream) and is given three
// more intervals. Not otherwise: a reply stream that broke while this node
// was reading is a host that crashed or lost its link, and a host restarted
// under the same name would answer the ping for the old process. A server
// that stops reports nothing.
func (s *server) watchOrphans(rcv core.Receiver, from string, legs []inLegKey, due time.Time, hb time.Duration, ping bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return
	}
	var t *time.Timer
	t = time.AfterFunc(time.Until(due), func() {
		// A watch that fires more than two intervals late is this node's
		// own stall: the host's new reply stream may be waiting unread.
		if now := time.Now(); now.Sub(due) > 2*hb {
			s.noteStall(now)
			ping = true
		}
		s.mu.Lock()
		delete(s.orphanWatches, t)
		var orphans []inLegKey
		for _, k := range legs {
			if l := s.inLegs[k]; l != nil && l.cur == nil && !l.done {
				orphans = append(orphans, k)
			}
		}
		s.mu.Unlock()
		if len(orphans) > 0 {
			// On a goroutine stop waits for: the ping and the receiver
			// may take a while.
			s.goStream(func() {
				if ping && s.answers(from, hb) {
					s.watchOrphans(rcv, from, orphans, time.Now().Add(silentIntervals*hb), hb, true)
					return
				}
				s.reportSilent(rcv, from, orphans, hb)
			})
		}
	})
	s.orphanWatches[t] = struct{}{}
}

// noteStall records that this process was seen, at now, not to have run
// for a while (paused, starved): see stalledSince.
func (s *server) noteStall(now time.Time) {
	s.stalledAt.Store(now.UnixNano())
}

// stalledSince reports whether this process was seen to stall after t.
// Frames read soon after a stall may have waited unread through it, so
// how recent they look says nothing of when the host sent them.
func (s *server) stalledSince(t time.Time) bool {
	at := s.stalledAt.Load()
	return at != 0 && time.Unix(0, at).After(t)
}

// answers reports whether node answers a ping within timeout.
func (s *server) answers(node string, timeout time.Duration) bool {
	addr, ok := s.cfg.Addr(node)
	if !ok || s.router == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(s.router.ctx, timeout)
	defer cancel()
	got, err := s.router.client.Ping(ctx, node, addr)
	return err == nil && got == node
}

// read reads every frame: up to the first open, then legs' opens, items
// (each handled as it is read), ends and heartbeats. It closes finish once
// the host closed its side with every item handled, and cancels the
// stream on anything wrong.
//
// Each frame is decoded into one reused frameIn, handled, and only then
// is the next one read: nothing of a frame's messages is kept past its
// handling but what frameIn allocates fresh.
func (rs *respondIn) read(rcv core.Receiver) {
	var in frameIn
	f, ok := rs.readFirst(&in)
	if !ok {
		return
	}
	rd := &respondReader{rs: rs, rcv: rcv, legs: map[inLegKey]*inLeg{}}
	rd.load, _ = rcv.(core.IngressLoad)
	for rd.frame(f) {
		var err error
		if f, err = rs.recv(&in); errors.Is(err, io.EOF) {
			close(rs.finish)
			return
		} else if err != nil {
			rs.cancel(err)
			return
		}
		rs.last.Store(time.Now().UnixNano())
	}
}

// recv reads the next frame into in.
func (rs *respondIn) recv(in *frameIn) (*pb.RespondFrame, error) {
	if err := rs.st.RecvMsg(in); err != nil {
		return nil, err
	}
	return in.get(), nil
}

// readFirst reads up to the frame that opens the reply stream's first leg (an
// open, or items whose first carries one), hands the open to the handler
// and waits until the stream is set up: that frame, or false when the
// stream is to end. A heartbeat may come first (a host whose first leg was
// slow to send): it says the host is alive, nothing more.
func (rs *respondIn) readFirst(in *frameIn) (*pb.RespondFrame, bool) {
	f, err := rs.recv(in)
	for err == nil && f.GetHeartbeat() != nil {
		f, err = rs.recv(in)
	}
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = errRespondOpen
		}
		rs.cancel(err)
		return nil, false
	}
	open := f.GetOpen()
	if its := f.GetItems().GetItems(); open == nil && len(its) > 0 {
		open = its[0].GetOpen()
	}
	if open == nil || open.GetJobId() == "" {
		rs.cancel(errRespondOpen)
		return nil, false
	}
	rs.opened <- open
	select {
	case <-rs.ready:
		return f, true
	case <-rs.ctx.Done():
		return nil, false
	}
}

// noteHandled records that item seq of leg k was handled, with its output
// bytes: true when acks are to be written at once. Acks are cumulative
// per leg, so most can wait: one ack per item would double the frames
// (and write syscalls) of a streaming job. They go at once for what ends a
// leg (the host ends it on that), and whenever ackEvery items or ackBytes
// of output went unacked, so every leg's in-flight window keeps moving (a
// few large outputs fill it long before 32 items); the rest go with the
// next heartbeat tick.
func (rs *respondIn) noteHandled(k inLegKey, seq uint64, bytes int, final bool) bool {
	rs.ackMu.Lock()
	defer rs.ackMu.Unlock()
	if seq >= rs.acks[k] {
		rs.acks[k] = seq
	}
	rs.unsent++
	rs.unsentBytes += bytes
	now := final || rs.unsent >= ackEvery || rs.unsentBytes >= ackBytes
	if now {
		rs.unsent, rs.unsentBytes = 0, 0
	}
	return now
}

// wake asks the writer to write what is due (acks, cancels).
func (rs *respondIn) wake() {
	chans.Notify(rs.kick)
}

// respondReader is the reader goroutine's own state of a reply stream: the legs
// opened on it.
type respondReader struct {
	rs  *respondIn
	rcv core.Receiver
	// load is rcv's count of its ingress jobs; nil: never yield for one.
	load core.IngressLoad
	legs map[inLegKey]*inLeg
}

// frame acts on one frame: false when the reader must stop.
func (rd *respondReader) frame(f *pb.RespondFrame) bool {
	switch b := f.GetBody().(type) {
	case *pb.RespondFrame_Items:
		for _, it := range b.Items.GetItems() {
			if !rd.item(it) {
				return false
			}
		}
	case *pb.RespondFrame_Open:
		if rd.rs.ctx.Err() != nil {
			return false
		}
		return rd.open(b.Open)
	case *pb.RespondFrame_End:
		rd.end(b.End)
	case *pb.RespondFrame_Heartbeat:
	default:
		rd.rs.cancel(errRespondFrame)
		return false
	}
	return true
}

// open opens a leg on the reply stream and tells the receiver where the job
// runs: false (the stream cancelled) when it names no job.
func (rd *respondReader) open(o *pb.RespondOpen) bool {
	rs := rd.rs
	if o.GetJobId() == "" {
		rs.cancel(errRespondOpen)
		return false
	}
	l := rs.s.attachLeg(rs.from, o, rs)
	rd.legs[l.key] = l
	rs.busy.Store(true) // the receiver's time is not the host's silence
	rd.rcv.ResponseLegOpened(rs.from, l.key.job, l.key.gen)
	rs.last.Store(time.Now().UnixNano())
	rs.busy.Store(false)
	return true
}

// item handles one item, after the open it carries: false when the reader
// must stop.
func (rd *respondReader) item(it *pb.RespondItem) bool {
	rs := rd.rs
	if rs.ctx.Err() != nil {
		// Not handled: the host resends it on its next reply stream.
		return false
	}
	if o := it.GetOpen(); o != nil && !rd.open(o) {
		return false
	}
	m := it.GetMessage()
	k := inLegKey{rs.from, m.GetJobId(), m.GetGeneration()}
	leg := rd.legs[k]
	if leg == nil {
		rs.s.cfg.Metrics.invalid.Inc()
		rs.s.cfg.Logger.Warn("skipped an item of a leg not open on the reply stream", "from", rs.from, "job", k.job, "gen", k.gen)
		return true
	}
	rs.busy.Store(true)
	latest, firstOutput := rs.handleItem(rd.rcv, leg, it)
	rs.last.Store(time.Now().UnixNano())
	rs.busy.Store(false)
	if firstOutput && rd.alone() {
		yieldToWriter()
	}
	final := m.GetKind() == pb.PeerMessage_KIND_RELEASE || m.GetEnd() != nil
	ackNow := rs.noteHandled(k, it.GetSeq(), len(m.GetOutput()), final)
	// A final seen again (resent after its ack was lost) ends the leg only
	// if nothing came after it: what did is a newer opening of the leg.
	if final && latest {
		// Nothing of the leg comes after its last item (a host with more
		// sends a new open first): it is done on this reply stream. Its ack
		// is on its way.
		delete(rd.legs, k)
		rs.s.finishLeg(rs, leg)
	}
	if ackNow {
		rs.wake()
	}
	return true
}

// alone reports whether the reader may yield for a leg's first output: the
// leg is the only one open on the stream and its job the only one this
// node holds as their ingress. The stream's legs alone are no sign of
// rest: under load the ingress is the bottleneck and its reply stream from
// one host often holds one leg at a time, while many more jobs wait here
// for their turn (docs/perf.md, "First output at c = 1, fifth round").
func (rd *respondReader) alone() bool {
	return len(rd.legs) == 1 && rd.load != nil && rd.load.IngressJobs() == 1
}

// yieldToWriter lets the goroutines woken for a lone leg's first output
// run before the reader handles the leg's next items, which a host whose
// worker answered at once sent right behind it. It yields twice: once for
// the job's stream writer, which writes the output (an SSE stream also
// flushes it) and parks; once more for the gRPC connection writer a
// JobService stream's Send woke, which itself yields the processor once,
// while it holds under 1,000 bytes, before it writes (grpc-go's
// loopyWriter, as of v1.85: its minBatchSize). This leans on how the
// runtime and grpc-go schedule, not on any contract of theirs: if either
// changes, the yields cost two trips through the run queue for one job in
// flight and nothing else. The reader carries every leg from its host, so
// it yields only for a leg alone on the stream and at its ingress
// (respondReader.alone): with other jobs in flight, their items are what
// it reads next, and yielding would delay them.
func yieldToWriter() {
	runtime.Gosched()
	runtime.Gosched()
}

// end forgets a leg the host ended without its last item.
func (rd *respondReader) end(e *pb.RespondLegEnd) {
	k := inLegKey{rd.rs.from, e.GetJobId(), e.GetGeneration()}
	if leg := rd.legs[k]; leg != nil {
		delete(rd.legs, k)
		rd.rs.s.finishLeg(rd.rs, leg)
	}
}

// respondWriter is the handler goroutine's own state of a reply stream: it
// writes acks as items are handled (per leg, cumulative: the latest covers
// the rest), each leg's cancel once per reply stream, and a heartbeat when
// nothing else went out for half an interval.
type respondWriter struct {
	rs       *respondIn
	lastSend time.Time
	acks     []pendingAck // reused between flushes
	// ack is the frame every ack is written in, set anew for each: Send
	// encodes a message before it returns.
	ack     pb.RespondAck
	ackBody pb.RespondControl_Ack
	ackCtl  pb.RespondControl
}

type pendingAck struct {
	k   inLegKey
	seq uint64
}

// run writes until the stream ends (its status) or the host closed its
// side with every item handled (nil, after the last acks).
func (w *respondWriter) run() error {
	rs := w.rs
	tick := time.NewTicker(rs.hb)
	defer tick.Stop()
	heartbeat := &pb.RespondControl{Body: &pb.RespondControl_Heartbeat{Heartbeat: &pb.Heartbeat{}}}
	if !w.flush() {
		return rs.end()
	}
	for {
		select {
		case <-rs.ctx.Done():
			return rs.end()
		case <-rs.finish:
			if !w.flush() {
				return rs.end()
			}
			return nil
		case <-rs.kick:
			if !w.flush() {
				return rs.end()
			}
		case <-tick.C:
			if !w.flush() {
				return rs.end()
			}
			if time.Since(w.lastSend) >= rs.hb/2 && !w.send(heartbeat) {
				return rs.end()
			}
		}
	}
}

// controlFrame is the frame that writes p, a control c.
func controlFrame(c control, p *pb.PeerMessage) *pb.RespondControl {
	if c == ctlGrant {
		return &pb.RespondControl{Body: &pb.RespondControl_Grant{Grant: p}}
	}
	return &pb.RespondControl{Body: &pb.RespondControl_Cancel{Cancel: p}}
}

// flush writes the controls due on the reply stream (cancels, then grants),
// then every leg's ack: false once a send failed.
func (w *respondWriter) flush() bool {
	rs := w.rs
	for c := range nControls {
		for _, p := range rs.s.controlsFor(rs, c) {
			if !w.send(controlFrame(c, p)) {
				return false
			}
		}
	}
	rs.ackMu.Lock()
	for k, seq := range rs.acks {
		w.acks = append(w.acks, pendingAck{k, seq})
	}
	clear(rs.acks)
	rs.unsent, rs.unsentBytes = 0, 0
	rs.ackMu.Unlock()
	for i, a := range w.acks {
		w.ack.Seq, w.ack.JobId, w.ack.Generation = a.seq, a.k.job, a.k.gen
		w.ackBody.Ack = &w.ack
		w.ackCtl.Body = &w.ackBody
		if !w.send(&w.ackCtl) {
			return false
		}
		w.acks[i] = pendingAck{}
	}
	w.acks = w.acks[:0]
	return true
}

// send sends c: false (the stream cancelled) when that failed.
func (w *respondWriter) send(c *pb.RespondControl) bool {
	if err := w.rs.st.Send(c); err != nil {
		w.rs.cancel(err)
		return false
	}
	w.lastSend = time.Now()
	return true
}

// watchSilence ends the stream once nothing arrived for three intervals:
// it runs when that would be the case if nothing arrived since the last
// check, and looks again. A check that runs more than two intervals after
// it was due means this process did not run meanwhile (paused, starved):
// the host's frames may be waiting unread, so its count starts again
// rather than the job fail for this node's own stall; so does a check
// that finds the reader in the receiver.
func (rs *respondIn) watchSilence() {
	if rs.ctx.Err() != nil {
		return
	}
	now := time.Now()
	late := now.Sub(time.Unix(0, rs.due.Load())) > 2*rs.hb
	if late {
		rs.s.noteStall(now)
	}
	if late || rs.busy.Load() {
		rs.last.Store(now.UnixNano())
	}
	last := time.Unix(0, rs.last.Load())
	if now.Sub(last) >= silentIntervals*rs.hb {
		rs.cancel(errRespondSilent)
		return
	}
	due := last.Add(silentIntervals * rs.hb)
	rs.due.Store(due.UnixNano())
	rs.silence.Reset(due.Sub(now))
}
