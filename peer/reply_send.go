package peer

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchyard/switchyard/internal/chans"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// The response leg's stream, sending end: the consumer host's reply stream
// to each ingress, on which its response legs (leg_send.go) travel. The
// receiving end is reply_recv.go.

// kindRespond is the switchyard_peer_streams_open kind of a reply stream.
const kindRespond = "respond"

var (
	errLegSilent  = errors.New("peer: nothing received on the reply stream for three heartbeat intervals")
	errLegDropped = errors.New("peer: reply stream dropped")
)

// respondCall is one Respond call: a reply stream's stream.
type respondCall struct {
	ctx     context.Context
	cancel  context.CancelCauseFunc
	cs      pb.PeerService_RespondClient
	silence *time.Timer // fails the stream after three silent intervals
	done    chan struct{}
	err     error
	once    sync.Once
	heard   atomic.Bool // something arrived: the stream works
	wg      sync.WaitGroup
}

func (st *respondCall) fail(err error) {
	st.once.Do(func() {
		st.err = err
		close(st.done)
	})
	st.cancel(err)
}

func (st *respondCall) isDone() bool { return chans.Closed(st.done) }

// A replyStream is the one Respond stream this node holds to an ingress
// node: every response leg to that node is multiplexed on it, each as its
// open and its numbered items (why not a stream per leg: docs/cluster.md,
// "Legs ride a reply stream"). The node's leg sender (leg_sender.go) sends
// the legs' frames on it, and its own goroutine its heartbeats, under
// sendMu, one frame at a time; its reader hands each ack and cancel to the
// leg it names; its own goroutine heartbeats while nothing else went out
// for half an interval, and closes it once no leg used it for
// Config.StreamIdle. It fails as a whole (a send or receive error, or three
// silent intervals), and its legs move to the next one.
type replyStream struct {
	r      *router
	node   string
	st     *respondCall
	sendMu sync.Mutex
	// frame and items are the frame legs' items go out in (sendItems),
	// under sendMu: reused, as a frame is encoded before Send returns and
	// nothing keeps it after.
	frame pb.RespondFrame
	items pb.RespondItems
	// lastSend is when a frame last went out, UnixNano.
	lastSend atomic.Int64
	// idled: closed for idleness (the reader's EOF is not a failure).
	idled atomic.Bool

	// Under r.mu.
	users     int       // legs open on it (legSender.join)
	idleSince time.Time // when users last fell to 0
	closing   bool      // idle: no leg may join it
}

// replyStreamFor is node's reply stream, opened if it has none (or only a
// failed or closing one). Its caller, node's leg sender, joins its legs to
// it; it is the only one to open node's reply stream.
func (r *router) replyStreamFor(node, addr string) (*replyStream, error) {
	r.mu.Lock()
	if t := r.replyStreams[node]; t != nil && !t.closing && !t.st.isDone() {
		r.mu.Unlock()
		return t, nil
	}
	r.mu.Unlock()
	return r.openReplyStream(node, addr)
}

// openReplyStream opens a reply stream to node, with no leg yet, and starts
// its reader and its goroutine. It does not wait for the ingress: the first
// open frame and items go out with the call's headers.
func (r *router) openReplyStream(node, addr string) (*replyStream, error) {
	cc, err := r.client.Conn(node, addr)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancelCause(r.ctx)
	st := &respondCall{ctx: ctx, cancel: cancel, done: make(chan struct{})}
	// Armed before the call: a connection being made holds it up.
	st.silence = time.AfterFunc(silentIntervals*r.cfg.Heartbeat, func() { st.fail(errLegSilent) })
	cs, err := pb.NewPeerServiceClient(cc).Respond(ctx)
	if err != nil {
		st.silence.Stop()
		if errors.Is(context.Cause(ctx), errLegSilent) {
			err = errLegSilent
		}
		cancel(err)
		return nil, err
	}
	st.cs = cs
	t := &replyStream{r: r, node: node, st: st, idleSince: time.Now()}
	t.lastSend.Store(time.Now().UnixNano())
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		st.silence.Stop()
		cancel(ErrClosed)
		return nil, ErrClosed
	}
	r.replyStreams[node] = t
	r.wg.Add(1)
	r.mu.Unlock()
	r.m.streamsOpen.WithLabelValues(kindRespond).Inc()
	r.m.streamsOpened.WithLabelValues(kindRespond).Inc()
	st.wg.Add(1)
	go t.read()
	go t.run()
	return t, nil
}

// leave takes a leg off t; the last one starts its idle time.
func (t *replyStream) leave() {
	r := t.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if t.users--; t.users == 0 {
		t.idleSince = time.Now()
	}
}

// send sends f on the reply stream: false when the reply stream failed (its
// legs then see st.done).
func (t *replyStream) send(f *pb.RespondFrame) bool {
	st := t.st
	if st.isDone() {
		return false
	}
	t.sendMu.Lock()
	err := st.cs.Send(f)
	t.sendMu.Unlock()
	return t.sent(err)
}

// sendItems sends one frame of response legs' items, in the reply
// stream's reused frame (under sendMu); as send.
func (t *replyStream) sendItems(items []*legItem) bool {
	if t.st.isDone() {
		return false
	}
	t.sendMu.Lock()
	fs := t.items.Items[:0]
	for _, it := range items {
		fs = append(fs, &it.wire)
	}
	t.items.Items = fs
	if t.frame.Body == nil {
		t.frame.Body = &pb.RespondFrame_Items{Items: &t.items}
	}
	err := t.st.cs.Send(&t.frame)
	clear(fs)
	t.sendMu.Unlock()
	return t.sent(err)
}

// sent is what send returns after a Send that returned err.
func (t *replyStream) sent(err error) bool {
	st := t.st
	if err != nil {
		// Send reports io.EOF for a stream the ingress ended: the reader
		// gets the real status. Wait for it, a bounded while.
		tm := time.NewTimer(silentIntervals * t.r.cfg.Heartbeat)
		select {
		case <-st.done:
		case <-tm.C:
			st.fail(err)
		case <-t.r.ctx.Done():
			st.fail(ErrClosed)
		}
		tm.Stop()
		return false
	}
	t.lastSend.Store(time.Now().UnixNano())
	return true
}

// run heartbeats while nothing else went out for half an interval, closes
// the reply stream once no leg used it for StreamIdle, and cleans up after it
// failed.
func (t *replyStream) run() {
	r := t.r
	defer r.wg.Done()
	hb := r.cfg.Heartbeat
	tick := time.NewTicker(hb)
	defer tick.Stop()
	heartbeat := &pb.RespondFrame{Body: &pb.RespondFrame_Heartbeat{Heartbeat: &pb.Heartbeat{}}}
	for {
		select {
		case <-r.ctx.Done():
			t.st.fail(ErrClosed)
			t.retire()
			return
		case <-t.st.done:
			t.retire()
			return
		case <-tick.C:
		}
		if time.Since(time.Unix(0, t.lastSend.Load())) >= hb/2 {
			t.send(heartbeat)
		}
		r.mu.Lock()
		idle := t.users == 0 && time.Since(t.idleSince) >= r.cfg.StreamIdle
		if idle {
			t.closing = true
		}
		r.mu.Unlock()
		if idle {
			t.close()
			return
		}
	}
}

// close ends an idle reply stream cleanly: it half-closes, waits a bounded
// while for the ingress to end the stream, then drops it.
func (t *replyStream) close() {
	st := t.st
	t.idled.Store(true)
	t.sendMu.Lock()
	err := st.cs.CloseSend()
	t.sendMu.Unlock()
	if err == nil {
		t.r.awaitEnd(st.done)
	}
	t.r.m.replyStreamIdle.Inc()
	st.fail(errLegDropped)
	t.retire()
}

// retire forgets a reply stream that ended: it waits for its reader and
// stops its timer.
func (t *replyStream) retire() {
	r := t.r
	r.mu.Lock()
	if r.replyStreams[t.node] == t {
		delete(r.replyStreams, t.node)
	}
	r.mu.Unlock()
	t.st.wg.Wait()
	t.st.silence.Stop()
	r.m.streamsOpen.WithLabelValues(kindRespond).Dec()
	if err := t.st.err; !t.idled.Load() && !errors.Is(err, errLegDropped) && !errors.Is(err, ErrClosed) && r.ctx.Err() == nil {
		if errors.Is(err, errLegSilent) {
			r.m.legSilences.WithLabelValues("host").Inc()
		}
		r.log.Warn("reply stream failed; its legs open the next one", "node", t.node, "err", err)
	}
}

// ack applies an ack to the leg it names, if it is still open, and marks
// the leg ready for its sender.
func (t *replyStream) ack(a *pb.RespondAck) {
	r := t.r
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.legs[legKey{t.node, a.GetJobId(), a.GetGeneration()}]
	if l == nil {
		return // it ended meanwhile
	}
	// A failed reply stream's reader may still apply an older ack.
	if s := int64(a.GetSeq()); s > l.acked.Load() {
		l.acked.Store(s)
		l.s.readyLocked(l)
	}
}

// leg is the open leg of binding (job, gen) to t's node, nil if none.
func (t *replyStream) leg(job string, gen uint64) *responseLeg {
	t.r.mu.Lock()
	defer t.r.mu.Unlock()
	return t.r.legs[legKey{t.node, job, gen}]
}

// read reads the ingress's frames: each ack to its leg, a cancel or a
// grant to the node's receiver (at once: the legs may be blocked in Send).
// Every frame proves the ingress alive.
func (t *replyStream) read() {
	st := t.st
	defer st.wg.Done()
	r := t.r
	hb := r.cfg.Heartbeat
	for {
		c, err := st.cs.Recv()
		if err != nil {
			st.fail(err)
			return
		}
		st.heard.Store(true)
		st.silence.Reset(silentIntervals * hb)
		switch b := c.GetBody().(type) {
		case *pb.RespondControl_Ack:
			t.ack(b.Ack)
		case *pb.RespondControl_Cancel:
			if l := t.leg(b.Cancel.GetJobId(), b.Cancel.GetGeneration()); l != nil {
				l.takeCancel(b.Cancel)
			}
		case *pb.RespondControl_Grant:
			t.takeGrant(b.Grant)
		}
	}
}
