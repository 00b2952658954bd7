package peer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/internal/grpctest"
	"github.com/switchyard/switchyard/peer"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// Tests of delivery streams: per-(node, queue) Deliver streams, their unary
// fallback, and the receiver's dedup shared by both paths. Real servers
// over loopback, real authentication.

// deliverMsg is the i-th deliver of job on queue.
func deliverMsg(queue, job string, i int) core.Message {
	return core.Message{Kind: core.MsgDeliver, JobID: job, Gen: uint64(i), Queue: queue, Consumer: "c",
		Delivery: &core.Delivery{JobID: job, Gen: uint64(i), Queue: queue, Ingress: "a", TTL: time.Minute}}
}

// gatedRecorder is a recorder whose block func may hold a message up.
type gatedRecorder struct {
	recorder
	block func(m core.Message)
	fwd   func(d core.Delivery)
}

func (g *gatedRecorder) HandleMessage(from string, m core.Message) {
	if g.block != nil {
		g.block(m)
	}
	g.recorder.HandleMessage(from, m)
}

func (g *gatedRecorder) HandleForward(from string, d core.Delivery) error {
	if g.fwd != nil {
		g.fwd(d)
	}
	return g.recorder.HandleForward(from, d)
}

// holdUntil is a gatedRecorder's block that holds up each message held
// reports until release is closed.
func holdUntil(release <-chan struct{}, held func(core.Message) bool) func(core.Message) {
	return func(m core.Message) {
		if held(m) {
			<-release
		}
	}
}

// checkOnceInOrder fails unless got holds gens 0..n-1 of job, once each,
// in order.
func checkOnceInOrder(t *testing.T, got []received, job string, n int) {
	t.Helper()
	var gens []uint64
	for _, r := range got {
		if r.m.JobID == job {
			gens = append(gens, r.m.Gen)
		}
	}
	if len(gens) != n {
		t.Fatalf("job %s: %d messages handled, want %d: %v", job, len(gens), n, gens)
	}
	for i, g := range gens {
		if g != uint64(i) {
			t.Fatalf("job %s: message %d is gen %d: %v", job, i, g, gens)
		}
	}
}

// fastDeliveries shortens a router's stream timings for tests.
func fastDeliveries(ack, idle, hb time.Duration) func(*peer.Config) {
	return func(c *peer.Config) {
		c.AckTimeoutCeiling, c.StreamIdle, c.Heartbeat = ack, idle, hb
	}
}

// A stream whose receiver holds one message past its ack deadline is
// dropped; its unacked messages are resent by unary Post, in order, and
// each is handled exactly once (the receiver skips the stream's copy, or
// the Post's); the next message opens a new stream.
func TestDeliveryStallFallsBackInOrder(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	h := &gatedRecorder{block: func(m core.Message) {
		if m.Gen == 5 {
			once.Do(func() { <-release })
		}
	}}
	b := startServerOn(t, "127.0.0.1:0", "b", h)
	const ack = 200 * time.Millisecond
	var asked atomic.Int64
	r := newRouter(t, "a", secret, newBook("b", b.addr).Addr, func(c *peer.Config) {
		fastDeliveries(ack, 10*ack, 50*time.Millisecond)(c)
		c.AckTimeout = func(m core.Message) time.Duration {
			asked.Add(1)
			if m.Delivery == nil || m.Delivery.TTL != time.Minute {
				t.Errorf("AckTimeout got %+v", m)
			}
			return ack
		}
	})

	const n = 20
	for i := range n {
		r.Send("b", deliverMsg("q", "j", i))
	}
	waitFor(t, 5*time.Second, "the fallback", func() bool {
		return counter(t, r.reg, "switchyard_peer_unary_fallbacks_total", nil) == 1
	})
	// The held message is past its deadline: let it go, and the resend
	// with it.
	time.Sleep(ack)
	close(release)
	waitFor(t, 10*time.Second, "every message", func() bool { return len(h.messages()) >= n })
	waitSent(t, r, "b")

	for i := n; i < 2*n; i++ {
		r.Send("b", deliverMsg("q", "j", i))
	}
	waitFor(t, 10*time.Second, "every message", func() bool { return len(h.messages()) >= 2*n })
	waitSent(t, r, "b")
	time.Sleep(100 * time.Millisecond) // a duplicate would land now
	checkOnceInOrder(t, h.messages(), "j", 2*n)

	if got := asked.Load(); got != 2*n {
		t.Errorf("AckTimeout asked %d times, want %d", got, 2*n)
	}
	wantCounters(t, r.reg, map[string]float64{
		"switchyard_peer_unary_fallbacks_total":       1,
		"switchyard_peer_ack_deadline_expiries_total": 1,
		"switchyard_peer_streams_opened_total":        2, // re-opened by the next message
		"switchyard_peer_stream_idle_closes_total":    0,
	})
	// Each message counted once, by whichever path carried it.
	streamed := counter(t, r.reg, "switchyard_peer_deliveries_streamed_total", nil)
	if got := counter(t, r.reg, "switchyard_peer_messages_total", map[string]string{"kind": "deliver"}); got != 2*n {
		t.Errorf("deliver messages = %v, want %d", got, 2*n)
	}
	if streamed < n || streamed > 2*n-1 {
		t.Errorf("streamed = %v: want the second burst streamed and the stalled one's tail by Post", streamed)
	}
}

// One queue's delivery stream held up by a slow receiver does not hold up
// another queue's.
func TestDeliveriesOfUnrelatedQueuesDoNotWait(t *testing.T) {
	release := make(chan struct{})
	h := &gatedRecorder{block: holdUntil(release, func(m core.Message) bool { return m.Queue == "slow" })}
	b := startServerOn(t, "127.0.0.1:0", "b", h)
	t.Cleanup(func() { close(release) })
	r := newRouter(t, "a", secret, newBook("b", b.addr).Addr, fastDeliveries(5*time.Second, 15*time.Second, 50*time.Millisecond))

	r.Send("b", deliverMsg("slow", "s", 0))
	for i := range 10 {
		r.Send("b", deliverMsg("fast", "f", i))
	}
	waitFor(t, 5*time.Second, "the fast queue's messages", func() bool { return len(h.messages()) == 10 })
	checkOnceInOrder(t, h.messages(), "f", 10)
	waitFor(t, 5*time.Second, "one stream per delivery stream", func() bool {
		return counter(t, r.reg, "switchyard_peer_streams_open", map[string]string{"kind": "deliver"}) == 2
	})
}

// A message larger than the peer message limit, or without a valid wire
// form, is sent on no transport and not retried: Undeliverable is told
// (from a router goroutine), no fallback is counted, and the messages
// around it go. A Forward that cannot be carried fails with
// ErrUndeliverable.
func TestDeliveryUndeliverableIsNotSentNorRetried(t *testing.T) {
	h := &recorder{}
	b := startServerOn(t, "127.0.0.1:0", "b", h)
	type report struct {
		node, job, reason string
		kind              core.MessageKind
	}
	var mu sync.Mutex
	var reports []report
	r := newRouter(t, "a", secret, newBook("b", b.addr).Addr, func(c *peer.Config) { c.MaxMessageBytes = 8 << 10 })
	r.Start(&recorder{undeliverable: func(node string, m core.Message, reason string) {
		mu.Lock()
		defer mu.Unlock()
		reports = append(reports, report{node, m.JobID, reason, m.Kind})
	}})

	huge := deliverMsg("q", "huge", 0)
	huge.Delivery.Input = json.RawMessage(`"` + strings.Repeat("x", 10<<10) + `"`)
	bad := core.Message{Kind: core.MsgCancel, JobID: "bad", Queue: "q", Reason: "\xff not utf-8"}
	unknown := core.Message{Kind: "teleport", JobID: "unknown", Queue: "q"}
	r.Send("b", deliverMsg("q", "j", 0))
	r.Send("b", huge)
	r.Send("b", bad)
	r.Send("b", unknown)
	r.Send("b", deliverMsg("q", "j", 1))
	reply := core.Message{Kind: core.MsgReply, JobID: "big-output", Queue: "q", Output: json.RawMessage(`"` + strings.Repeat("y", 10<<10) + `"`)}
	r.Send("b", reply)

	waitFor(t, 5*time.Second, "the good messages", func() bool { return len(h.messages()) == 2 })
	waitFor(t, 5*time.Second, "the reports", func() bool { mu.Lock(); defer mu.Unlock(); return len(reports) == 4 })
	waitSent(t, r, "b")
	checkOnceInOrder(t, h.messages(), "j", 2)
	// The delivery stream's reports in its order; the reply's, which goes
	// by its response leg, at any point.
	mu.Lock()
	var onDelivery, onLeg []report
	for _, rp := range reports {
		if rp.kind == core.MsgReply {
			onLeg = append(onLeg, rp)
		} else {
			onDelivery = append(onDelivery, rp)
		}
	}
	mu.Unlock()
	if got, want := fmt.Sprint(onDelivery), fmt.Sprint([]report{
		{"b", "huge", peer.ReasonTooLarge, core.MsgDeliver},
		{"b", "bad", peer.ReasonEncoding, core.MsgCancel},
		{"b", "unknown", peer.ReasonEncoding, "teleport"},
	}); got != want {
		t.Errorf("delivery stream reports = %v, want %v", got, want)
	}
	if got, want := fmt.Sprint(onLeg), fmt.Sprint([]report{{"b", "big-output", peer.ReasonTooLarge, core.MsgReply}}); got != want {
		t.Errorf("response reports = %v, want %v", got, want)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d := *huge.Delivery
	if err := r.Forward(ctx, "b", d); !errors.Is(err, peer.ErrUndeliverable) {
		t.Errorf("forward of a job over the limit: got %v, want ErrUndeliverable", err)
	}
	if len(h.forwarded()) != 0 {
		t.Errorf("the dispatcher got %d forwards", len(h.forwarded()))
	}
	wantCounters(t, r.reg, map[string]float64{
		"switchyard_peer_unary_fallbacks_total": 0,
		"switchyard_peer_send_failures_total":   0,
	})
	for _, c := range []struct {
		kind, reason string
		want         float64
	}{{"deliver", "too_large", 1}, {"cancel", "encoding", 1}, {"teleport", "encoding", 1}, {"reply", "too_large", 1}, {"forward", "too_large", 1}} {
		if got := counter(t, r.reg, "switchyard_peer_messages_undeliverable_total", map[string]string{"kind": c.kind, "reason": c.reason}); got != c.want {
			t.Errorf("undeliverable{%s,%s} = %v, want %v", c.kind, c.reason, got, c.want)
		}
	}
	if got := sum(t, r.reg, "switchyard_peer_messages_dropped_total"); got != 0 {
		t.Errorf("dropped = %v, want 0", got)
	}
	if got := sum(t, r.reg, "switchyard_peer_messages_total"); got != 2 {
		t.Errorf("messages sent = %v, want 2", got)
	}
}

// A delivery stream's Deliver stream closes after the idle interval with
// nothing unacked, and the delivery stream's goroutine exits; the next
// message opens a new one.
func TestDeliveryStreamClosesWhenIdleAndReopens(t *testing.T) {
	h := &recorder{}
	b := startServerOn(t, "127.0.0.1:0", "b", h)
	// Only the idle close is under test. The ack ceiling (at most idle/3)
	// and the silence limit (3 heartbeats) are stall detectors: at a
	// 300 ms idle (a 100 ms ceiling, 60 ms of silence) they dropped the
	// stream to unary after 88 ms in 1 of 30 runs on a loaded machine
	// (2 CPUs, load 5), so the stream gets room for pauses of hundreds
	// of milliseconds, as in TestBurstyDeliveryStreamDoesNotChurn.
	const idle = 1200 * time.Millisecond
	r := newRouter(t, "a", secret, newBook("b", b.addr).Addr, fastDeliveries(idle/3, idle, idle/4))
	open := func() float64 {
		return counter(t, r.reg, "switchyard_peer_streams_open", map[string]string{"kind": "deliver"})
	}
	for round := range 2 {
		start := time.Now()
		r.Send("b", deliverMsg("q", "j", round))
		waitFor(t, 5*time.Second, "delivery", func() bool { return len(h.messages()) == round+1 })
		if got := open(); got != 1 {
			t.Fatalf("round %d: streams open = %v, want 1", round, got)
		}
		waitFor(t, 5*time.Second, "the idle close", func() bool { return open() == 0 })
		if took := time.Since(start); took < idle {
			t.Errorf("round %d: closed after %s, before the idle interval %s", round, took, idle)
		}
		waitFor(t, 5*time.Second, "the delivery stream gone", func() bool { return series(t, r.reg, "switchyard_peer_queue_messages") == 0 })
	}
	wantCounters(t, r.reg, map[string]float64{
		"switchyard_peer_streams_opened_total":      2,
		"switchyard_peer_stream_idle_closes_total":  2,
		"switchyard_peer_unary_fallbacks_total":     0,
		"switchyard_peer_deliveries_streamed_total": 2,
	})
	checkOnceInOrder(t, h.messages(), "j", 2)
}

// A delivery stream bursty at a period below the idle interval keeps one
// stream: the idle timer restarts with every message.
func TestBurstyDeliveryStreamDoesNotChurn(t *testing.T) {
	h := &recorder{}
	b := startServerOn(t, "127.0.0.1:0", "b", h)
	// Only the idle timer is under test. The ack ceiling (at most idle/3)
	// and the silence limit (3 heartbeats) are stall detectors: kept tight
	// (a 100 ms ceiling, 60 ms of silence) they fired on a loaded machine
	// (2 CPUs, another go test running), so this delivery stream has room
	// for pauses of hundreds of milliseconds. A burst still comes every
	// idle/2, so a timer that did not restart would close the stream every
	// idle.
	const idle = 1200 * time.Millisecond
	r := newRouter(t, "a", secret, newBook("b", b.addr).Addr, fastDeliveries(idle/3, idle, idle/4))
	const bursts = 8 // over 4 idle intervals in all
	for i := range bursts {
		for k := range 5 {
			r.Send("b", deliverMsg("q", "j", 5*i+k))
		}
		time.Sleep(idle / 2)
	}
	waitFor(t, 5*time.Second, "every message", func() bool { return len(h.messages()) == 5*bursts })
	checkOnceInOrder(t, h.messages(), "j", 5*bursts)
	wantCounters(t, r.reg, map[string]float64{
		"switchyard_peer_streams_opened_total":     1,
		"switchyard_peer_stream_idle_closes_total": 0,
		"switchyard_peer_unary_fallbacks_total":    0,
	})
}

// Heartbeats keep a delivery stream's Deliver stream alive while its
// receiver is busy with a message for many heartbeat intervals (within the
// ack deadline), and while the delivery stream has nothing to send.
func TestHeartbeatsKeepABusyDeliveryStreamAlive(t *testing.T) {
	// The receiver is busy for 10 intervals, over three times the
	// silence bound (3 intervals), so only heartbeats keep the stream. At
	// a 20 ms interval (60 ms of silence) scheduling delays alone dropped
	// it in 16 of 30 runs on a loaded machine (2 CPUs, load 8), at 100 ms
	// in 1 of 20; 150 ms (450 ms of silence) leaves room for such pauses.
	// The ack ceiling (5s) stays well above the 1.5s a message is held.
	const hb = 150 * time.Millisecond
	h := &gatedRecorder{block: func(core.Message) { time.Sleep(10 * hb) }}
	b := startServerOn(t, "127.0.0.1:0", "b", h)
	r := newRouter(t, "a", secret, newBook("b", b.addr).Addr, fastDeliveries(5*time.Second, 15*time.Second, hb))
	for i := range 3 {
		r.Send("b", deliverMsg("q", "j", i))
	}
	waitFor(t, 5*time.Second, "every message", func() bool { return len(h.messages()) == 3 })
	time.Sleep(10 * hb) // idle, stream open
	r.Send("b", deliverMsg("q", "j", 3))
	waitFor(t, 5*time.Second, "every message", func() bool { return len(h.messages()) == 4 })
	waitSent(t, r, "b")
	checkOnceInOrder(t, h.messages(), "j", 4)
	wantCounters(t, r.reg, map[string]float64{
		"switchyard_peer_streams_opened_total":      1,
		"switchyard_peer_unary_fallbacks_total":     0,
		"switchyard_peer_deliveries_streamed_total": 4,
	})
}

// proxy forwards TCP connections to target until paused: then it holds
// what it reads, keeping every connection open (a peer that went silent
// without closing anything).
type proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cond   *sync.Cond
	paused bool
	closed bool
	conns  []net.Conn
	wg     sync.WaitGroup
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(u, c) })
		p.wg.Go(func() { p.pipe(c, u) })
	}
}

func (p *proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		p.mu.Lock()
		for p.paused && !p.closed {
			p.cond.Wait()
		}
		closed := p.closed
		p.mu.Unlock()
		if closed {
			return
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if tc, ok := dst.(*net.TCPConn); ok && errors.Is(err, io.EOF) {
				_ = tc.CloseWrite()
			}
			return
		}
	}
}

func (p *proxy) pause(on bool) {
	p.mu.Lock()
	p.paused = on
	p.cond.Broadcast()
	p.mu.Unlock()
}

func (p *proxy) close() {
	p.mu.Lock()
	p.closed = true
	p.cond.Broadcast()
	conns := p.conns
	p.mu.Unlock()
	p.ln.Close()
	for _, c := range conns {
		c.Close()
	}
	p.wg.Wait()
}

// A receiver that goes silent without closing anything (a proxy that stops
// forwarding) is noticed within about three heartbeat intervals, long
// before the ack deadline: the stream is dropped for the unary path, and
// what it held is handled once when the path clears.
func TestSilentPeerFallsBackWithinThreeHeartbeats(t *testing.T) {
	h := &recorder{}
	b := startServerOn(t, "127.0.0.1:0", "b", h)
	px := startProxy(t, b.addr)
	const hb = 50 * time.Millisecond
	r := newRouter(t, "a", secret, newBook("b", px.addr()).Addr, fastDeliveries(5*time.Second, 15*time.Second, hb))

	r.Send("b", deliverMsg("q", "j", 0))
	waitFor(t, 5*time.Second, "the first delivery", func() bool { return len(h.messages()) == 1 })
	waitSent(t, r, "b")

	px.pause(true)
	start := time.Now()
	r.Send("b", deliverMsg("q", "j", 1))
	waitFor(t, 5*time.Second, "the fallback", func() bool {
		return counter(t, r.reg, "switchyard_peer_unary_fallbacks_total", nil) == 1
	})
	took := time.Since(start)
	// Silent for 3 intervals, checked every interval: 3–4 intervals after
	// the last frame, which came at most one interval before the pause.
	if took > 8*hb {
		t.Errorf("fallback after %s, want about 3 heartbeat intervals (%s)", took, hb)
	}
	if got := counter(t, r.reg, "switchyard_peer_ack_deadline_expiries_total", nil); got != 0 {
		t.Errorf("ack deadline expiries = %v: the silence should have been noticed first", got)
	}
	if got := counter(t, r.reg, "switchyard_peer_streams_open", map[string]string{"kind": "deliver"}); got != 0 {
		t.Errorf("streams open = %v after the fallback", got)
	}

	px.pause(false)
	r.Send("b", deliverMsg("q", "j", 2))
	waitFor(t, 10*time.Second, "every message", func() bool { return len(h.messages()) == 3 })
	waitSent(t, r, "b")
	time.Sleep(100 * time.Millisecond) // a duplicate would land now
	checkOnceInOrder(t, h.messages(), "j", 3)
}

// The receiver ends a stream whose sender goes silent for three heartbeat
// intervals, and one that does not open with its delivery stream.
func TestReceiverEndsASilentStream(t *testing.T) {
	h := &recorder{}
	b := startServerOn(t, "127.0.0.1:0", "b", h)
	cl, ctx := rawClient(t, b)

	const hb = 20 * time.Millisecond
	st, err := cl.Deliver(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&pb.DeliverFrame{Body: &pb.DeliverFrame_Open{Open: &pb.DeliverOpen{
		Session: "s", Lane: &pb.PeerLane{Queue: "q"}, HeartbeatIntervalNs: int64(hb),
	}}}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	heartbeats := 0
	for {
		a, err := st.Recv()
		if err != nil {
			if status.Code(err) != codes.Unavailable {
				t.Errorf("silent stream ended with %v, want Unavailable", err)
			}
			break
		}
		if a.GetHeartbeat() != nil {
			heartbeats++
		}
	}
	if took := time.Since(start); took < 3*hb || took > 20*hb {
		t.Errorf("silent stream ended after %s, want about 3 × %s", took, hb)
	}
	if heartbeats < 2 {
		t.Errorf("receiver sent %d heartbeats, want one per interval", heartbeats)
	}

	st, err = cl.Deliver(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&pb.DeliverFrame{Body: &pb.DeliverFrame_Heartbeat{Heartbeat: &pb.Heartbeat{}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Errorf("stream without an open: got %v, want InvalidArgument", err)
	}
}

// The receiver's dedup is per (sender, session, delivery stream), shared by
// Deliver, Post and Forward: an item handled on one path is skipped on
// another, a resent forward gets the verdict it got first without the
// dispatcher being asked again, and a new session starts afresh.
func TestReceiverDedupIsSharedByEveryPath(t *testing.T) {
	h := &recorder{verdict: func(d core.Delivery) error {
		return &core.Error{Code: core.CodeQueueFull, Detail: "full " + d.JobID}
	}}
	b := startServerOn(t, "127.0.0.1:0", "b", h)
	cl, ctx := rawClient(t, b)
	item := func(seq uint64, m core.Message) *pb.DeliverFrame {
		p, _ := peer.MessageToPB(m)
		return &pb.DeliverFrame{Body: &pb.DeliverFrame_Item{Item: &pb.DeliverItem{Seq: seq, Body: &pb.DeliverItem_Message{Message: p}}}}
	}
	pl := &pb.PeerLane{Queue: "q"}

	// Stream: items 0..4 of delivery stream q, 2 of them a forward.
	st, err := cl.Deliver(ctx)
	if err != nil {
		t.Fatal(err)
	}
	frames := []*pb.DeliverFrame{{Body: &pb.DeliverFrame_Open{Open: &pb.DeliverOpen{Session: "s1", Lane: pl}}}}
	for i := range 5 {
		if i == 2 {
			frames = append(frames, &pb.DeliverFrame{Body: &pb.DeliverFrame_Item{Item: &pb.DeliverItem{Seq: 2,
				Body: &pb.DeliverItem_Forward{Forward: peer.DeliveryToPB(core.Delivery{JobID: "f", Queue: "q"})}}}})
			continue
		}
		frames = append(frames, item(uint64(i), deliverMsg("q", "j", i)))
	}
	for _, f := range frames {
		if err := st.Send(f); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	var acked uint64
	var verdict *pb.ForwardResponse
	grpctest.RecvEach(t, st.Recv, func(a *pb.DeliverAck) {
		if hd := a.GetHandled(); hd != nil {
			acked = hd.GetSeq()
			if hd.GetSeq() == 2 {
				verdict = hd.GetVerdict()
			}
		}
	})
	if acked != 4 || verdict.GetRefusal().GetCode() != string(core.CodeQueueFull) {
		t.Fatalf("acked through %d with forward verdict %v, want 4 and queue_full", acked, verdict)
	}

	// Post on the same delivery stream: 3 and 4 were handled by the stream.
	post := func(session string, q string, seqs ...uint64) {
		t.Helper()
		req := &pb.PostRequest{Session: session, Lane: &pb.PeerLane{Queue: q}, Seqs: seqs}
		for _, s := range seqs {
			p, _ := peer.MessageToPB(deliverMsg(q, "j", int(s)))
			req.Messages = append(req.Messages, p)
		}
		if _, err := cl.Post(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	post("s1", "q", 3, 4, 7, 9)
	// Forward resent by the unary path: the first verdict, no second ask.
	res, err := cl.Forward(ctx, &pb.ForwardRequest{Session: "s1", Lane: pl, Seq: 2,
		Delivery: peer.DeliveryToPB(core.Delivery{JobID: "f", Queue: "q"})})
	if err != nil || res.GetRefusal().GetDetail() != "full f" {
		t.Fatalf("resent forward: %v, %v; want the first verdict", res, err)
	}
	if got := len(h.forwarded()); got != 1 {
		t.Errorf("dispatcher asked %d times, want once", got)
	}
	post("s1", "other", 3) // another delivery stream has its own numbers
	post("s2", "q", 0)     // a new session starts afresh
	var got []string
	for _, r := range h.messages() {
		got = append(got, fmt.Sprintf("%s/%d", r.m.Queue, r.m.Gen))
	}
	if want := "q/0 q/1 q/3 q/4 q/7 q/9 other/3 q/0"; strings.Join(got, " ") != want {
		t.Errorf("handled %v, want %v", got, want)
	}

	// A delivery stream's Post must number each message.
	p, _ := peer.MessageToPB(deliverMsg("q", "j", 1))
	if _, err := cl.Post(ctx, &pb.PostRequest{Session: "s1", Lane: pl, Messages: []*pb.PeerMessage{p}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("delivery stream Post without numbers: got %v, want InvalidArgument", err)
	}
	// And a stream's connection needs the handshake like every other.
	bare, err := dialBare(t, b.addr).Deliver(ctx)
	if err == nil {
		_, err = bare.Recv()
	}
	if err == nil {
		t.Error("bare Deliver served")
	}
	if got := counter(t, b.reg, "switchyard_peer_auth_failures_total", nil); got < 1 {
		t.Errorf("auth failures = %v, want at least 1", got)
	}
}

// A forward travels its delivery stream's Deliver stream and comes back
// with the verdict in the ack; one whose ack is late falls back to a unary
// Forward, which returns the verdict of the first handling: the dispatcher
// is asked once.
func TestForwardOverTheDeliveryStream(t *testing.T) {
	slow := make(chan struct{})
	h := &gatedRecorder{fwd: func(d core.Delivery) {
		if d.JobID == "slow" {
			<-slow
		}
	}}
	h.verdict = func(d core.Delivery) error {
		if d.Queue == "full" || d.JobID == "slow" {
			return &core.Error{Code: core.CodeQueueFull, Detail: "full", RetryAfter: time.Second}
		}
		return nil
	}
	b := startServerOn(t, "127.0.0.1:0", "b", h)
	const ack = 200 * time.Millisecond
	r := newRouter(t, "a", secret, newBook("b", b.addr).Addr, fastDeliveries(ack, 10*ack, 50*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	if err := r.Forward(ctx, "b", core.Delivery{JobID: "ok", Queue: "q", Ingress: "a"}); err != nil {
		t.Fatalf("accepted forward: %v", err)
	}
	if err := r.Forward(ctx, "b", core.Delivery{JobID: "no", Queue: "full", Ingress: "a"}); !errors.Is(err, core.ErrQueueFull) {
		t.Fatalf("refused forward: got %v, want queue_full", err)
	}
	if got := counter(t, r.reg, "switchyard_peer_deliveries_streamed_total", nil); got != 2 {
		t.Errorf("streamed = %v, want 2", got)
	}

	go func() { time.Sleep(3 * ack); close(slow) }()
	start := time.Now()
	err := r.Forward(ctx, "b", core.Delivery{JobID: "slow", Queue: "q", Ingress: "a"})
	var ce *core.Error
	if !errors.As(err, &ce) || ce.Code != core.CodeQueueFull || ce.RetryAfter != time.Second {
		t.Fatalf("slow forward: got %v, want the dispatcher's queue_full", err)
	}
	if took := time.Since(start); took < 3*ack {
		t.Errorf("slow forward answered after %s, before the dispatcher decided", took)
	}
	n := 0
	for _, f := range h.forwarded() {
		if f.d.JobID == "slow" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("dispatcher asked %d times about the slow job, want once", n)
	}
	wantCounters(t, r.reg, map[string]float64{
		"switchyard_peer_unary_fallbacks_total":       1,
		"switchyard_peer_ack_deadline_expiries_total": 1,
		"switchyard_peer_deliveries_streamed_total":   2,
	})
	if got := counter(t, r.reg, "switchyard_peer_messages_total", map[string]string{"kind": "forward"}); got != 3 {
		t.Errorf("forwards counted = %v, want 3", got)
	}
}

// With ForceUnary every delivery stream message and forward goes by unary
// calls, in order, and no stream is opened.
func TestForceUnary(t *testing.T) {
	h := &recorder{}
	b := startServerOn(t, "127.0.0.1:0", "b", h)
	r := newRouter(t, "a", secret, newBook("b", b.addr).Addr, func(c *peer.Config) { c.ForceUnary = true })
	const n = 50
	for i := range n {
		r.Send("b", msg("j", i))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.Forward(ctx, "b", core.Delivery{JobID: "f", Queue: "q", Ingress: "a"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "every message", func() bool { return len(h.messages()) == n })
	checkOrder(t, h.messages(), "a", n, "j")
	waitSent(t, r, "b")
	if got := counter(t, r.reg, "switchyard_peer_streams_opened_total", nil); got != 0 {
		t.Errorf("streams opened = %v, want 0", got)
	}
	if got := sum(t, r.reg, "switchyard_peer_messages_total"); got != n+1 {
		t.Errorf("messages = %v, want %d", got, n+1)
	}
}

// New refuses a stream idle interval not well above the ack timeout
// ceiling, and a heartbeat whose silence bound is not below gRPC's
// keepalive; the peer server accepts the pool's keepalive pings.
func TestDeliveryConfigIsValidated(t *testing.T) {
	cfg := peer.Config{Node: "a", Secret: secret, Addr: func(string) (string, bool) { return "", false }}
	var ce *core.ConfigError
	c := cfg
	c.AckTimeoutCeiling, c.StreamIdle = 5*time.Second, 10*time.Second
	_, err := peer.New(c)
	if !errors.Is(err, peer.ErrStreamIdleTooShort) || !errors.As(err, &ce) || ce.Field != "peer-stream-idle" {
		t.Errorf("idle 10s, ceiling 5s: got %v, want ErrStreamIdleTooShort", err)
	}
	c = cfg
	c.Heartbeat = 4 * time.Second
	_, err = peer.New(c)
	if !errors.Is(err, peer.ErrHeartbeatTooLong) {
		t.Errorf("heartbeat 4s: got %v, want ErrHeartbeatTooLong", err)
	}
	r, err := peer.New(cfg)
	if err != nil {
		t.Fatalf("defaults: %v", err)
	}
	_ = r.Close()
	if peer.ServerKeepaliveMinTime > peer.ClientKeepaliveTime {
		t.Errorf("server keepalive MinTime %s above the client's ping interval %s", peer.ServerKeepaliveMinTime, peer.ClientKeepaliveTime)
	}
}

// Close stops every delivery stream, stream and stream goroutine, with a
// stream mid-message, a forward waiting for its verdict and a delivery
// stream backing off from a peer that is down, and leaks nothing.
func TestDeliveryCloseLeaksNothing(t *testing.T) {
	before := goleak.IgnoreCurrent()
	release := make(chan struct{})
	h := &gatedRecorder{
		block: holdUntil(release, func(m core.Message) bool { return m.Queue == "held" }),
		fwd: func(d core.Delivery) {
			if d.Queue == "held" {
				<-release
			}
		},
	}
	b := startServerOn(t, "127.0.0.1:0", "b", h)
	r, err := peer.New(peer.Config{Node: "a", Secret: secret, MaxReconnectDelay: 50 * time.Millisecond,
		Addr:     newBook("b", b.addr, "down", freeAddr(t)).Addr,
		RetryMin: time.Minute, RetryMax: time.Minute, AckTimeoutCeiling: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		r.Send("b", deliverMsg("held", "h", i))
		r.Send("b", deliverMsg(fmt.Sprint("q", i), "j", i))
		r.Send("down", deliverMsg("q", "d", i))
	}
	ferr := make(chan error, 1)
	go func() {
		ferr <- r.Forward(context.Background(), "b", core.Delivery{JobID: "f", Queue: "held", Ingress: "a"})
	}()
	waitFor(t, 5*time.Second, "the open streams", func() bool { return len(h.messages()) == 3 })

	closeEndsTheForward(t, r, ferr)
	close(release)
	b.stop()
	goleak.VerifyNone(t, before)
}
