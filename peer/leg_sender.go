package peer

import (
	"errors"
	"time"

	"github.com/switchyard/switchyard/internal/chans"

	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// The response legs' sender on the consumer host: one goroutine per ingress
// node, which does the work of every leg to that node (leg_send.go) when
// something changed for it — a message queued, an ack, a cancel, its
// timer — and owns the node's reply stream for them: it opens it, after a
// backoff when the last attempt failed, and moves the legs to the next one
// when it fails. A leg's items go in the frame the sender is filling, with
// those of the other legs it handles in the same pass, so that what a
// node's legs queued together shares a frame, a Send and a wake-up of the
// sender.

// A legSender sends the response legs to one ingress node. It runs while
// the node has a leg, or a reply stream that is open (a next leg then
// wakes it rather than start another); r.legSenders names it meanwhile.
type legSender struct {
	r    *router
	node string
	// wake (capacity 1) says ready has legs.
	wake chan struct{}

	// Under r.mu.
	legs  map[*responseLeg]struct{} // the node's open legs
	ready []*responseLeg            // legs with something to look at, each once (responseLeg.ready)

	// The goroutine's own.
	t         *replyStream // the node's reply stream, nil while none
	failures  int          // reply stream attempts failed in a row
	retryAt   time.Time    // no reply stream is tried before it
	needT     bool         // a leg waits for a reply stream
	frame     []*legItem   // items to go in the next frame (add, flush)
	frameSize int
	todo      []*responseLeg // the pass's legs, reused
}

// legSenderLocked is node's leg sender, started if it has none.
func (r *router) legSenderLocked(node string) *legSender {
	s := r.legSenders[node]
	if s == nil {
		s = &legSender{r: r, node: node, wake: make(chan struct{}, 1), legs: map[*responseLeg]struct{}{}}
		r.legSenders[node] = s
		r.wg.Add(1)
		go s.run()
	}
	return s
}

// readyLocked marks l as having something for its sender to look at, and
// wakes the sender if it is the first. Called with r.mu held.
func (s *legSender) readyLocked(l *responseLeg) {
	if l.removed || l.ready {
		return
	}
	l.ready = true
	s.ready = append(s.ready, l)
	if len(s.ready) == 1 {
		chans.Notify(s.wake)
	}
}

// run is the sender's goroutine: each pass looks at the legs marked ready,
// then at the reply stream, and sends what the pass framed.
func (s *legSender) run() {
	r := s.r
	defer r.wg.Done()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		if r.ctx.Err() != nil {
			// No leg opens after close: every leg ends here, and the sender
			// with them.
			clear(s.takeReady())
			s.endAll(legEndClosed)
			if s.exit() {
				return
			}
		}
		if s.t != nil && s.t.st.isDone() {
			s.dropReplyStream()
		}
		s.pass(s.takeReady())
		if s.needT && s.t == nil && !time.Now().Before(s.retryAt) {
			s.connect()
		}
		if s.needT && s.t == nil {
			retry.Reset(time.Until(s.retryAt))
		}
		s.flush()
		if s.exit() {
			return
		}
		var done <-chan struct{}
		if s.t != nil {
			done = s.t.st.done
		}
		select {
		case <-s.wake:
		case <-done:
		case <-retry.C:
		case <-r.ctx.Done():
		}
	}
}

// takeReady takes the legs marked ready, in the order they were marked.
func (s *legSender) takeReady() []*responseLeg {
	r := s.r
	r.mu.Lock()
	todo := s.ready
	s.ready = s.todo[:0]
	for _, l := range todo {
		l.ready = false
	}
	r.mu.Unlock()
	s.todo = todo
	return todo
}

// all is every open leg of the node, in no order.
func (s *legSender) all() []*responseLeg {
	r := s.r
	r.mu.Lock()
	defer r.mu.Unlock()
	legs := make([]*responseLeg, 0, len(s.legs))
	for l := range s.legs {
		legs = append(legs, l)
	}
	return legs
}

// exit ends the sender when the node has no leg and no open reply stream:
// true then, and r.legSenders forgets it, so the next leg starts another.
func (s *legSender) exit() bool {
	r := s.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(s.legs) > 0 || len(s.ready) > 0 {
		return false
	}
	if s.t != nil && !s.t.st.isDone() && r.ctx.Err() == nil {
		return false
	}
	delete(r.legSenders, s.node)
	return true
}

// pass does what each of legs needs: the end it is due, else sending what
// it can. legs are unique.
func (s *legSender) pass(legs []*responseLeg) {
	now := time.Now()
	for _, l := range legs {
		s.step(l, now)
	}
	clear(legs)
}

// step does one leg's work: it ends it if it must, else joins it to the
// reply stream, applies its acks and sends what is queued, as the in-flight
// bounds allow, and ends it once its last message is acked.
func (s *legSender) step(l *responseLeg, now time.Time) {
	if l.removed { // read by its only writer, the sender
		return
	}
	if why := l.stopped(now); why != "" {
		l.end(why)
		return
	}
	if l.awaitingFirstReply(now) {
		return
	}
	if l.t == nil && !s.join(l) {
		s.needT = true
		return
	}
	l.applyAcks()
	l.fill()
	l.sendOpen()
	if l.finish() {
		return
	}
	if l.t == nil {
		// It left its reply stream at its last item with more queued
		// behind it (finish): it joins again with an open.
		s.step(l, now)
	}
}

// join opens l on the node's reply stream, if there is one not closing,
// and resends what l has unacked: false when there is none.
func (s *legSender) join(l *responseLeg) bool {
	t := s.t
	if t == nil {
		return false
	}
	r := s.r
	r.mu.Lock()
	if t.closing {
		r.mu.Unlock()
		s.t = nil
		return false
	}
	t.users++
	r.mu.Unlock()
	l.t = t
	l.held, l.openDue = false, true
	l.sendRun(l.unacked)
	return true
}

// connect opens the node's reply stream (or takes the one open) for the
// legs that wait for it, and joins them to it; if it fails, they wait for
// the backoff, or end if the failure is for good.
func (s *legSender) connect() {
	r := s.r
	s.needT = false
	r.mu.Lock()
	idle := len(s.legs) == 0
	r.mu.Unlock()
	if idle {
		return // the legs that waited for it ended meanwhile
	}
	addr, ok := r.cfg.Addr(s.node)
	if !ok {
		s.endAll(legEndGone)
		return
	}
	t, err := r.replyStreamFor(s.node, addr)
	if err != nil {
		s.failed(err)
		return
	}
	s.t = t
	now := time.Now()
	for _, l := range s.all() {
		if l.t == nil {
			s.step(l, now)
		}
	}
}

// dropReplyStream takes the legs off the node's failed reply stream,
// applies the acks read before it ended (which may have covered a leg's
// last message: that leg is done), and decides for the others: open the
// next one after a backoff, or end them.
func (s *legSender) dropReplyStream() {
	r := s.r
	t := s.t
	s.t = nil
	clear(s.frame)
	s.frame, s.frameSize = s.frame[:0], 0
	for _, l := range s.all() {
		if l.t != t {
			continue
		}
		l.t = nil
		t.leave()
		l.applyAcks()
		if !l.finish() {
			s.needT = true
		}
	}
	if t.idled.Load() {
		return // closed for idleness, with no leg on it: not a failure
	}
	if t.st.heard.Load() {
		s.failures = 0
	}
	if r.ctx.Err() != nil {
		return
	}
	s.failed(t.st.err)
}

// failed counts a failed reply stream (or attempt to open one) and
// decides: the legs try again after a backoff, or end if the failure is
// for good.
func (s *legSender) failed(err error) {
	r := s.r
	s.failures++
	if r.ctx.Err() != nil {
		return
	}
	r.m.sendFailures.Inc()
	switch {
	case errors.Is(err, ErrClosed):
		s.endAll(legEndClosed)
	case permanent(err):
		r.log.Error("the ingress refused its response legs; dropping their messages", "node", s.node, "err", err)
		s.endAll(legEndRefuse)
	default:
		r.log.Debug("response legs lost their reply stream; opening it again", "node", s.node, "attempt", s.failures, "err", err)
		s.needT = true
		s.retryAt = time.Now().Add(r.backoff(s.failures - 1))
	}
}

// endAll ends every open leg of the node for why.
func (s *legSender) endAll(why string) {
	for _, l := range s.all() {
		l.end(why)
	}
}

// add puts item it of a leg in the frame being filled, after sending that
// frame if it would grow past the peer message limit.
func (s *legSender) add(it *legItem) {
	n := it.size + respondOverhead
	if len(s.frame) > 0 && s.frameSize+n > s.r.maxUnicast {
		s.flush()
	}
	s.frame = append(s.frame, it)
	s.frameSize += n
}

// flush sends the frame being filled, if it has items. If the reply stream
// failed, its items are still their legs' unacked: they go again on the
// next one.
func (s *legSender) flush() {
	if len(s.frame) == 0 {
		return
	}
	if s.t != nil && s.t.sendItems(s.frame) {
		s.r.m.replyFrames.Inc()
	}
	clear(s.frame)
	s.frame, s.frameSize = s.frame[:0], 0
}

// sendEnd tells the ingress to forget leg l, after what the frame being
// filled holds (l's items among it).
func (s *legSender) sendEnd(t *replyStream, l *responseLeg) {
	s.flush()
	t.send(&pb.RespondFrame{Body: &pb.RespondFrame_End{End: &pb.RespondLegEnd{JobId: l.key.job, Generation: l.key.gen}}})
}
