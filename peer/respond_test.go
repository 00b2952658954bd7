package peer_test

import (
	"encoding/json"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/internal/syncbuf"
	"github.com/switchyard/switchyard/peer"
)

// Tests of response legs: one per binding, from the consumer host ("a" here)
// to the job's ingress ("b"), all multiplexed on a's reply stream to b (one
// Respond stream). Real servers over loopback, real authentication.

// out is the i-th output of binding (job, gen 1).
func out(job string, i int) core.Message {
	return core.Message{Kind: core.MsgReply, JobID: job, Gen: 1, Queue: "q", Consumer: "c", WorkerName: "w",
		Output: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i)), TTL: time.Minute}
}

func end(job string) core.Message {
	return core.Message{Kind: core.MsgReply, JobID: job, Gen: 1, Queue: "q", Consumer: "c", WorkerName: "w", End: &core.End{Result: json.RawMessage(`"done"`)}, TTL: time.Minute}
}

func release(job string) core.Message {
	return core.Message{Kind: core.MsgRelease, JobID: job, Gen: 1, Queue: "q", Consumer: "c", Reason: "the worker disconnected"}
}

func cancelOf(job string) core.Message {
	return core.Message{Kind: core.MsgCancel, JobID: job, Gen: 1, Queue: "q", Code: core.CodeCancelled}
}

// checkLeg fails unless got holds job's outputs 0..n-1 from from, once
// each, in order, then last (if not nil), and nothing else of job.
func checkLeg(t *testing.T, got []received, from, job string, n int, last *core.Message) {
	t.Helper()
	var ms []core.Message
	for _, r := range got {
		if r.m.JobID != job {
			continue
		}
		if r.from != from {
			t.Fatalf("message from %q, want %q", r.from, from)
		}
		ms = append(ms, r.m)
	}
	want := n
	if last != nil {
		want++
	}
	if len(ms) != want {
		t.Fatalf("job %s: %d messages handled, want %d", job, len(ms), want)
	}
	for i := range n {
		if w := out(job, i); !equalMessage(ms[i], w) {
			t.Fatalf("job %s: message %d is %+v, want %+v", job, i, ms[i], w)
		}
	}
	if last != nil && !equalMessage(ms[n], *last) {
		t.Fatalf("job %s: last message is %+v, want %+v", job, ms[n], *last)
	}
}

// legJobs names legs jobs: prefix00, prefix01, ...
func legJobs(prefix string, legs int) []string {
	jobs := make([]string, legs)
	for g := range jobs {
		jobs[g] = fmt.Sprintf("%s%02d", prefix, g)
	}
	return jobs
}

// sendLegs sends, from r to node to, n outputs of each job, each job's
// from a goroutine of its own, then the job's end when withEnd is set.
// wait returns once every goroutine has; call it before the test ends.
func sendLegs(r tnode, to string, jobs []string, n int, withEnd bool) (wait func()) {
	var wg sync.WaitGroup
	for _, job := range jobs {
		wg.Go(func() {
			for i := range n {
				r.Send(to, out(job, i))
			}
			if withEnd {
				r.Send(to, end(job))
			}
		})
	}
	return wg.Wait
}

// checkLegsEnded is checkLeg of each job, its n outputs then its end.
func checkLegsEnded(t *testing.T, got []received, from string, jobs []string, n int) {
	t.Helper()
	for _, job := range jobs {
		e := end(job)
		checkLeg(t, got, from, job, n, &e)
	}
}

// legPair is a consumer host "a" and an ingress "b", each one node's
// transport: a's receiver gets the cancels that come back on its legs,
// and b's router puts cancels on legs its server holds.
type legPair struct {
	ha, hb *gatedRecorder
	// a and b are the two nodes; ra and rb name them where a test uses
	// them as senders.
	a, b, ra, rb tnode
}

// startLegPair starts the pair with heartbeat hb; bAddr, when set, is how
// a reaches b (a proxy in front of it).
func startLegPair(t *testing.T, hb time.Duration, bAddr func(tnode) string, tweak func(*peer.Config)) *legPair {
	t.Helper()
	p := &legPair{ha: &gatedRecorder{}, hb: &gatedRecorder{}}
	bookA, bookB := newBook(), newBook()
	p.b = startNode(t, "b", "127.0.0.1:0", p.hb, func(c *peer.Config) {
		fastDeliveries(5*time.Second, 15*time.Second, hb)(c)
		c.Addr = bookB.Addr
	})
	p.a = startNode(t, "a", "127.0.0.1:0", p.ha, func(c *peer.Config) {
		fastDeliveries(5*time.Second, 15*time.Second, hb)(c)
		c.Addr = bookA.Addr
		if tweak != nil {
			tweak(c)
		}
	})
	addrB := p.b.addr
	if bAddr != nil {
		addrB = bAddr(p.b)
	}
	bookA.set("b", addrB)
	bookB.set("a", p.a.addr)
	p.ra, p.rb = p.a, p.b
	return p
}

// legsOpen is how many response legs r has open.
func legsOpen(t *testing.T, r tnode) float64 {
	return counter(t, r.reg, "switchyard_peer_reply_legs_open", nil)
}

// replyStreamsOpen is how many reply streams (Respond streams) r has open.
func replyStreamsOpen(t *testing.T, r tnode) float64 {
	return counter(t, r.reg, "switchyard_peer_streams_open", map[string]string{"kind": "respond"})
}

// replyStreamsOpened is how many reply streams r opened.
func replyStreamsOpened(t *testing.T, r tnode) float64 {
	return counter(t, r.reg, "switchyard_peer_streams_opened_total", map[string]string{"kind": "respond"})
}

// A job's outputs and its end travel on one leg, in order, each counted
// once; the leg closes once the end is acked.
func TestRespondOrderThenEnd(t *testing.T) {
	// A heartbeat far above a loaded machine's scheduling delays: these
	// tests count reply streams, and a reply stream taken for silent would
	// be another.
	p := startLegPair(t, time.Second, nil, nil)
	const n = 500
	for _, job := range []string{"j1", "j2"} {
		for i := range n {
			p.ra.Send("b", out(job, i))
		}
		p.ra.Send("b", end(job))
	}
	waitFor(t, 10*time.Second, "every message", func() bool { return len(p.hb.messages()) == 2*(n+1) })
	e1, e2 := end("j1"), end("j2")
	checkLeg(t, p.hb.messages(), "a", "j1", n, &e1)
	checkLeg(t, p.hb.messages(), "a", "j2", n, &e2)
	waitFor(t, 5*time.Second, "the legs closed", func() bool { return legsOpen(t, p.ra) == 0 })
	waitSent(t, p.ra, "b")
	wantCounters(t, p.ra.reg, map[string]float64{
		"switchyard_peer_reply_legs_ended_total": 2,
		"switchyard_peer_messages_dropped_total": 0,
		"switchyard_peer_send_failures_total":    0,
	})
	if got := counter(t, p.ra.reg, "switchyard_peer_reply_legs_ended_total", map[string]string{"reason": "end"}); got != 2 {
		t.Errorf("legs ended by their end = %v, want 2", got)
	}
	if got := replyStreamsOpened(t, p.ra); got != 1 {
		t.Errorf("reply streams opened = %v, want 1 (both legs on one)", got)
	}
	if got := replyStreamsOpen(t, p.ra); got != 1 {
		t.Errorf("reply streams open = %v, want 1 (a reply stream outlives its legs until idle)", got)
	}
	if got := counter(t, p.ra.reg, "switchyard_peer_messages_total", map[string]string{"kind": "reply"}); got != 2*(n+1) {
		t.Errorf("replies counted = %v, want %d", got, 2*(n+1))
	}
	// The ingress forgot both legs: a cancel for either goes by the
	// delivery stream.
	p.rb.Send("a", cancelOf("j1"))
	waitFor(t, 5*time.Second, "the cancel by the delivery stream", func() bool { return len(p.ha.messages()) == 1 })
	if got := counter(t, p.rb.reg, "switchyard_peer_streams_opened_total", map[string]string{"kind": "deliver"}); got != 1 {
		t.Errorf("deliver streams opened by the ingress = %v, want 1", got)
	}
}

// A release after outputs rides their leg, behind them, however slowly the
// ingress handles them; a release (or end) with no leg open goes by Post,
// opening no stream.
func TestRespondReleaseNeverOvertakesOutputs(t *testing.T) {
	// A heartbeat far above a loaded machine's scheduling delays: these
	// tests count reply streams, and a reply stream taken for silent would
	// be another.
	p := startLegPair(t, time.Second, nil, nil)
	p.hb.block = func(m core.Message) {
		if m.Output != nil {
			time.Sleep(200 * time.Microsecond)
		}
	}
	const n = 300
	for i := range n {
		p.ra.Send("b", out("j", i))
	}
	rel := release("j")
	p.ra.Send("b", rel)
	waitFor(t, 10*time.Second, "every message", func() bool { return len(p.hb.messages()) == n+1 })
	checkLeg(t, p.hb.messages(), "a", "j", n, &rel)
	waitFor(t, 5*time.Second, "the leg closed", func() bool { return legsOpen(t, p.ra) == 0 })

	p.ra.Send("b", release("alone"))
	p.ra.Send("b", end("alone too"))
	waitFor(t, 5*time.Second, "the lone release and end", func() bool { return len(p.hb.messages()) == n+3 })
	if got := replyStreamsOpened(t, p.ra); got != 1 {
		t.Errorf("respond streams opened = %v, want 1: a binding's only message goes by Post", got)
	}
	// Counted when the Post's answer is back, which may be just after the
	// ingress handled it.
	waitFor(t, 5*time.Second, "both releases counted", func() bool {
		return counter(t, p.ra.reg, "switchyard_peer_messages_total", map[string]string{"kind": "release"}) == 2
	})
}

// A cancel from the ingress for a job whose leg it holds goes back on the
// leg (not by a delivery stream): the host's Handler gets it from the
// ingress, and the leg ends, dropping the outputs nobody wants any more.
func TestRespondCancelTravelsBackOnTheLeg(t *testing.T) {
	p := startLegPair(t, 50*time.Millisecond, nil, nil)
	release := make(chan struct{})
	defer close(release)
	p.hb.block = func(m core.Message) {
		if m.JobID == "j" && string(m.Output) == `{"i":1}` {
			<-release
		}
	}
	for i := range 20 {
		p.ra.Send("b", out("j", i))
	}
	waitFor(t, 5*time.Second, "the first output", func() bool { return len(p.hb.messages()) == 1 })
	sent := time.Now()
	p.rb.Send("a", cancelOf("j"))
	waitFor(t, 5*time.Second, "the cancel at the host's handler", func() bool { return len(p.ha.messages()) == 1 })
	t.Logf("cancel reached the host's handler %s after the ingress sent it", time.Since(sent))
	got := p.ha.messages()[0]
	if got.from != "b" || !equalMessage(got.m, cancelOf("j")) {
		t.Fatalf("host handler got %+v from %s, want the cancel from b", got.m, got.from)
	}
	waitFor(t, 5*time.Second, "the leg ended", func() bool {
		return counter(t, p.ra.reg, "switchyard_peer_reply_legs_ended_total", map[string]string{"reason": "cancel"}) == 1 &&
			legsOpen(t, p.ra) == 0
	})
	if got := counter(t, p.rb.reg, "switchyard_peer_streams_opened_total", map[string]string{"kind": "deliver"}); got != 0 {
		t.Errorf("the ingress opened %v deliver streams: the cancel took the delivery stream", got)
	}
	if got := counter(t, p.b.reg, "switchyard_peer_messages_total", map[string]string{"kind": "cancel"}); got != 1 {
		t.Errorf("cancels counted at the ingress = %v, want 1", got)
	}
	if got := counter(t, p.ra.reg, "switchyard_peer_queue_messages", map[string]string{"node": "b"}); got != 0 {
		t.Errorf("queue gauge = %v after the leg ended, want 0", got)
	}
}

// A cancel that reaches the host's Handler by another path (a delivery
// stream) ends the job's leg there too: the engine sends nothing more on
// it.
func TestRespondCancelByDeliveryStreamEndsTheLeg(t *testing.T) {
	p := startLegPair(t, 50*time.Millisecond, nil, nil)
	p.ra.Send("b", out("j", 0))
	waitFor(t, 5*time.Second, "the output", func() bool { return len(p.hb.messages()) == 1 })
	// A third node (the dispatcher) passes a cancel on, by its delivery stream.
	rc := newRouter(t, "c", secret, newBook("a", p.a.addr).Addr, nil)
	rc.Send("a", cancelOf("j"))
	waitFor(t, 5*time.Second, "the leg ended", func() bool {
		return counter(t, p.ra.reg, "switchyard_peer_reply_legs_ended_total", map[string]string{"reason": "cancel"}) == 1 &&
			legsOpen(t, p.ra) == 0
	})
	if got := p.ha.messages(); len(got) != 1 || got[0].from != "c" {
		t.Errorf("host handler got %+v, want the cancel from c once", got)
	}
}

// A leg is never closed for being idle (a worker computing in silence is
// not dead): heartbeats keep it, however long; it ends with its end.
func TestRespondLegIdleIsNotClosed(t *testing.T) {
	const hb = 20 * time.Millisecond
	p := startLegPair(t, hb, nil, nil)
	p.ra.Send("b", out("j", 0))
	waitFor(t, 5*time.Second, "the first output", func() bool { return len(p.hb.messages()) == 1 })
	time.Sleep(40 * hb)
	if got := legsOpen(t, p.ra); got != 1 {
		t.Fatalf("legs open after %s idle = %v, want 1", 40*hb, got)
	}
	p.ra.Send("b", out("j", 1))
	p.ra.Send("b", end("j"))
	e := end("j")
	waitFor(t, 5*time.Second, "the rest", func() bool { return len(p.hb.messages()) == 3 })
	checkLeg(t, p.hb.messages(), "a", "j", 2, &e)
	waitFor(t, 5*time.Second, "the leg closed", func() bool { return legsOpen(t, p.ra) == 0 })
	if got := replyStreamsOpened(t, p.ra); got != 1 {
		t.Errorf("reply streams opened = %v, want 1 (none re-opened)", got)
	}
	if got := counter(t, p.ra.reg, "switchyard_peer_reply_leg_silences_total", map[string]string{"side": "host"}) +
		counter(t, p.b.reg, "switchyard_peer_reply_leg_silences_total", map[string]string{"side": "ingress"}); got != 0 {
		t.Errorf("silences = %v on an idle leg", got)
	}
}

// cut closes every connection the proxy holds (both sides see a reset);
// new ones are still accepted.
func (p *proxy) cut() {
	p.mu.Lock()
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

// proxiedLegPair is a leg pair (50ms heartbeat) whose host reaches the
// ingress through a proxy the test can pause and cut.
func proxiedLegPair(t *testing.T) (*legPair, *proxy) {
	var px *proxy
	p := startLegPair(t, 50*time.Millisecond, func(b tnode) string {
		px = startProxy(t, b.addr)
		return px.addr()
	}, nil)
	return p, px
}

// holdAt stops the ingress's handler at the first message match is true
// for: held is closed when it stops there, and it goes on once the test
// closes gate.
func holdAt(p *legPair, match func(core.Message) bool) (held, gate chan struct{}) {
	held, gate = make(chan struct{}), make(chan struct{})
	var once sync.Once
	p.hb.block = func(m core.Message) {
		if match(m) {
			once.Do(func() {
				close(held)
				<-gate
			})
		}
	}
	return held, gate
}

// A stream that fails mid-leg is opened again and what was unacked is
// resent with the same numbers: the ingress handles each message once, in
// order, even the one it was handling when the connection broke.
func TestRespondStreamFailureResends(t *testing.T) {
	p, px := proxiedLegPair(t)
	held, gate := holdAt(p, func(m core.Message) bool { return string(m.Output) == `{"i":10}` })
	const n = 100
	for i := range n {
		p.ra.Send("b", out("j", i))
	}
	<-held // output 10 is being handled; 11.. are in flight, unacked
	px.cut()
	waitFor(t, 5*time.Second, "the leg re-opened", func() bool { return replyStreamsOpened(t, p.ra) >= 2 })
	time.Sleep(100 * time.Millisecond) // the resend of 10.. waits behind the handler
	close(gate)
	p.ra.Send("b", end("j"))
	e := end("j")
	waitFor(t, 10*time.Second, "every message", func() bool { return len(p.hb.messages()) >= n+1 })
	time.Sleep(100 * time.Millisecond) // a duplicate would land now
	checkLeg(t, p.hb.messages(), "a", "j", n, &e)
	waitFor(t, 5*time.Second, "the leg closed", func() bool { return legsOpen(t, p.ra) == 0 })
	waitSent(t, p.ra, "b")
	if got := counter(t, p.ra.reg, "switchyard_peer_messages_total", map[string]string{"kind": "reply"}); got != n+1 {
		t.Errorf("replies counted = %v, want %d: a resent message counts once", got, n+1)
	}
	if got := sum(t, p.ra.reg, "switchyard_peer_messages_dropped_total"); got != 0 {
		t.Errorf("dropped = %v", got)
	}
	if got := counter(t, p.b.reg, "switchyard_peer_reply_leg_silences_total", nil); got != 0 {
		t.Errorf("the ingress took a broken stream for a silent host")
	}
}

// A leg whose last item the ingress handled, but whose ack the host never
// got (the reply stream failed with it on the way), is resent whole on the next
// reply stream: the ingress still knows the leg's numbers and handles nothing
// twice, and acks the resend, which ends the leg at the host.
func TestRespondResentLegAfterItsLastItemIsNotHandledAgain(t *testing.T) {
	p, px := proxiedLegPair(t)
	held, gate := holdAt(p, func(m core.Message) bool { return m.End != nil })
	const n = 10 // under the ingress's ack interval: nothing acked before the end
	for i := range n {
		p.ra.Send("b", out("j", i))
	}
	p.ra.Send("b", end("j"))
	<-held
	// Nothing more gets through: the end's ack is lost.
	px.pause(true)
	close(gate)
	e := end("j")
	waitFor(t, 5*time.Second, "the end handled", func() bool { return len(p.hb.messages()) == n+1 })
	waitFor(t, 5*time.Second, "the host gave up on the reply stream", func() bool {
		return counter(t, p.ra.reg, "switchyard_peer_reply_leg_silences_total", map[string]string{"side": "host"}) >= 1
	})
	px.cut()
	px.pause(false)
	waitFor(t, 5*time.Second, "the leg resent and ended", func() bool { return legsOpen(t, p.ra) == 0 })
	time.Sleep(100 * time.Millisecond) // a duplicate would land now
	checkLeg(t, p.hb.messages(), "a", "j", n, &e)
	if got := replyStreamsOpened(t, p.ra); got < 2 {
		t.Errorf("reply streams opened = %v: the leg was never resent", got)
	}
	if got := counter(t, p.ra.reg, "switchyard_peer_reply_legs_ended_total", map[string]string{"reason": "end"}); got != 1 {
		t.Errorf("legs ended by their end = %v, want 1", got)
	}
}

// silenceWatcher is a recorder that reports ResponseLegSilent.
type silenceWatcher struct {
	recorder
	silent chan string
}

func (w *silenceWatcher) ResponseLegSilent(from, job string, gen uint64) {
	w.silent <- fmt.Sprintf("%s/%s/%d", from, job, gen)
}

func grantOf(job string, events, bytes int64) core.Message {
	return core.Message{Kind: core.MsgGrant, JobID: job, Gen: 1, Queue: "q", Credit: core.OutputCredit{Events: events, Bytes: bytes}}
}

// A job's grants of output credit go from the ingress back to the host on
// the job's leg while a reply stream holds it, as cancels do, and leave the leg
// open; the newest is written again on the next reply stream that opens the leg
// (grants are cumulative: an older one would change nothing); with no leg
// held, a grant takes its queue's delivery stream.
func TestRespondGrantTravelsBackOnTheLeg(t *testing.T) {
	var px *proxy
	p := startLegPair(t, 50*time.Millisecond, func(b tnode) string {
		px = startProxy(t, b.addr)
		return px.addr()
	}, nil)
	p.ra.Send("b", out("j", 0))
	waitFor(t, 5*time.Second, "the first output", func() bool { return len(p.hb.messages()) == 1 })
	grants := func() []core.Message {
		var gs []core.Message
		for _, r := range p.ha.messages() {
			if r.from != "b" || r.m.Kind != core.MsgGrant {
				t.Fatalf("host handler got %+v from %s, want grants from b", r.m, r.from)
			}
			gs = append(gs, r.m)
		}
		return gs
	}
	p.rb.Send("a", grantOf("j", 10, 1000))
	p.rb.Send("a", grantOf("j", 20, 2000))
	waitFor(t, 5*time.Second, "the grants at the host's handler", func() bool {
		gs := grants()
		return len(gs) > 0 && equalMessage(gs[len(gs)-1], grantOf("j", 20, 2000))
	})
	if got := counter(t, p.rb.reg, "switchyard_peer_streams_opened_total", map[string]string{"kind": "deliver"}); got != 0 {
		t.Errorf("the ingress opened %v deliver streams: a grant took the delivery stream", got)
	}
	if got := legsOpen(t, p.ra); got != 1 {
		t.Errorf("legs open after the grants = %v, want 1", got)
	}

	// The second may replace the first before it is written: a grant is
	// counted once it is, whatever the reply streams it is written on after.
	counted := counter(t, p.rb.reg, "switchyard_peer_messages_total", map[string]string{"kind": "grant"})
	if counted != 1 && counted != 2 {
		t.Errorf("grants counted at the ingress = %v, want 1 or 2", counted)
	}

	// The reply stream fails: the host opens the leg on a new one, and gets the
	// newest grant again there.
	before := len(grants())
	px.cut()
	p.ra.Send("b", out("j", 1))
	waitFor(t, 5*time.Second, "the leg on a new reply stream, and the grant again", func() bool {
		gs := grants()
		return len(p.hb.messages()) == 2 && len(gs) > before && equalMessage(gs[len(gs)-1], grantOf("j", 20, 2000))
	})
	if got := counter(t, p.rb.reg, "switchyard_peer_messages_total", map[string]string{"kind": "grant"}); got != counted {
		t.Errorf("grants counted at the ingress = %v after the second reply stream, want still %v (each once, however often written)", got, counted)
	}

	// No leg of k is held at the ingress: its grant goes by the delivery
	// stream.
	p.rb.Send("a", grantOf("k", 5, 500))
	waitFor(t, 5*time.Second, "the delivery stream's grant", func() bool {
		gs := grants()
		return equalMessage(gs[len(gs)-1], grantOf("k", 5, 500))
	})
	p.ra.Send("b", end("j"))
	waitFor(t, 5*time.Second, "the leg closed", func() bool { return legsOpen(t, p.ra) == 0 })
}

// A host whose frames stop arriving without its connection closing (a
// proxy that stops forwarding) is reported to the ingress's receiver
// within three heartbeat intervals plus the check's interval, once for
// each leg its reply stream held — not for one that had ended; the host notices
// the silence too, and tries its legs again.
func TestRespondSilentHostIsReported(t *testing.T) {
	const hb = 50 * time.Millisecond
	h := startHostOfTwoLegs(t, hb)
	time.Sleep(2 * hb) // a frame or two more each way
	h.px.pause(true)
	paused := time.Now()
	h.awaitReported(t)
	took := time.Since(paused)
	t.Logf("silent host reported %s after its frames stopped (heartbeat %s: %.1f intervals)", took, hb, float64(took)/float64(hb))
	// Three intervals from the last frame (up to 1.5 intervals of heartbeat
	// spacing before the pause, more on a loaded machine whose host
	// heartbeats late), plus the half-interval check, plus scheduling
	// under -race. Under one interval would be a check that did not wait.
	if took < hb || took > 3*hb+2*hb+200*time.Millisecond {
		t.Errorf("reported after %s, want about 3-4 heartbeat intervals (%s each)", took, hb)
	}
	if got := counter(t, h.b.reg, "switchyard_peer_reply_leg_silences_total", map[string]string{"side": "ingress"}); got != 2 {
		t.Errorf("ingress silences = %v, want 2 (one per leg)", got)
	}
	if s := h.suspected(); len(s) == 0 || s[0] != "a" {
		t.Errorf("Config.Suspect heard %v, want the silent host a", s)
	}
	waitFor(t, 5*time.Second, "the host noticing", func() bool {
		return counter(t, h.r.reg, "switchyard_peer_reply_leg_silences_total", map[string]string{"side": "host"}) >= 1
	})
	h.noSecondReport(t)
}

// Legs to one ingress share one reply stream: a cancel for one of them ends
// that leg alone while the others carry on, in order; the reply stream
// outlives its legs until it has had none for the stream idle interval, and
// the next leg opens a new one.
func TestRespondLegsShareAReplyStream(t *testing.T) {
	p := startLegPair(t, 50*time.Millisecond, nil, func(c *peer.Config) {
		c.AckTimeoutCeiling, c.StreamIdle = 100*time.Millisecond, 400*time.Millisecond
	})
	const n = 50
	jobs := []string{"j1", "j2", "j3"}
	for i := range n / 2 {
		for _, job := range jobs {
			p.ra.Send("b", out(job, i))
		}
	}
	waitFor(t, 5*time.Second, "the first outputs", func() bool { return len(p.hb.messages()) == 3*n/2 })
	if got := legsOpen(t, p.ra); got != 3 {
		t.Fatalf("legs open = %v, want 3", got)
	}
	if got := replyStreamsOpen(t, p.ra); got != 1 {
		t.Fatalf("reply streams open = %v, want 1 for three legs", got)
	}
	p.rb.Send("a", cancelOf("j2"))
	waitFor(t, 5*time.Second, "j2's leg ended by its cancel", func() bool {
		return counter(t, p.ra.reg, "switchyard_peer_reply_legs_ended_total", map[string]string{"reason": "cancel"}) == 1 &&
			legsOpen(t, p.ra) == 2
	})
	if got := p.ha.messages(); len(got) != 1 || !equalMessage(got[0].m, cancelOf("j2")) {
		t.Fatalf("host handler got %+v, want j2's cancel alone", got)
	}
	for i := n / 2; i < n; i++ {
		for _, job := range []string{"j1", "j3"} {
			p.ra.Send("b", out(job, i))
		}
	}
	p.ra.Send("b", end("j1"))
	p.ra.Send("b", end("j3"))
	waitFor(t, 5*time.Second, "j1 and j3 to their ends", func() bool { return len(p.hb.messages()) == 3*n/2+n+2 })
	e1, e3 := end("j1"), end("j3")
	checkLeg(t, p.hb.messages(), "a", "j1", n, &e1)
	checkLeg(t, p.hb.messages(), "a", "j3", n, &e3)
	checkLeg(t, p.hb.messages(), "a", "j2", n/2, nil)
	waitFor(t, 5*time.Second, "every leg ended", func() bool { return legsOpen(t, p.ra) == 0 })
	if got := counter(t, p.ra.reg, "switchyard_peer_reply_legs_ended_total", map[string]string{"reason": "end"}); got != 2 {
		t.Errorf("legs ended by their end = %v, want 2", got)
	}
	if got := replyStreamsOpened(t, p.ra); got != 1 {
		t.Errorf("reply streams opened = %v, want 1", got)
	}
	// The ingress forgot the legs the host ended: a cancel for one now
	// goes by the delivery stream.
	p.rb.Send("a", cancelOf("j1"))
	waitFor(t, 5*time.Second, "j1's cancel by the delivery stream", func() bool { return len(p.ha.messages()) == 2 })
	if got := counter(t, p.rb.reg, "switchyard_peer_streams_opened_total", map[string]string{"kind": "deliver"}); got != 1 {
		t.Errorf("deliver streams opened by the ingress = %v, want 1 (j1's cancel)", got)
	}
	waitFor(t, 5*time.Second, "the idle reply stream closed", func() bool {
		return replyStreamsOpen(t, p.ra) == 0 && counter(t, p.ra.reg, "switchyard_peer_reply_trunk_idle_closes_total", nil) == 1
	})
	p.ra.Send("b", out("j4", 0))
	waitFor(t, 5*time.Second, "j4's output", func() bool { return len(p.hb.messages()) == 3*n/2+n+3 })
	if got := replyStreamsOpened(t, p.ra); got != 2 {
		t.Errorf("reply streams opened = %v, want 2 (a new one after the idle close)", got)
	}
}

// A leg whose ingress leaves the catalog (dead) is dropped, its messages
// counted; one whose job's TTL passes ends too, however it is doing.
func TestRespondLegEndsWhenGoneOrExpired(t *testing.T) {
	bk := newBook("b", freeAddr(t))
	r := newRouter(t, "a", secret, bk.Addr, fastDeliveries(5*time.Second, 15*time.Second, 20*time.Millisecond))
	for i := range 3 {
		r.Send("b", out("j", i))
	}
	waitFor(t, 5*time.Second, "a failed attempt", func() bool {
		return counter(t, r.reg, "switchyard_peer_send_failures_total", nil) >= 1
	})
	bk.remove("b")
	waitFor(t, 5*time.Second, "the leg dropped", func() bool {
		return counter(t, r.reg, "switchyard_peer_reply_legs_ended_total", map[string]string{"reason": "gone"}) == 1
	})
	if got := counter(t, r.reg, "switchyard_peer_messages_dropped_total", map[string]string{"kind": "reply"}); got != 3 {
		t.Errorf("dropped = %v, want 3", got)
	}

	h := &recorder{}
	b := startServerOn(t, "127.0.0.1:0", "b", h)
	bk.set("b", b.addr)
	m := out("k", 0)
	m.TTL = 10 * time.Millisecond
	start := time.Now()
	r.Send("b", m)
	waitFor(t, 10*time.Second, "the leg's TTL", func() bool {
		return counter(t, r.reg, "switchyard_peer_reply_legs_ended_total", map[string]string{"reason": "ttl"}) == 1
	})
	t.Logf("leg with a 10ms TTL ended after %s (slack included)", time.Since(start))
	if len(h.messages()) != 1 {
		t.Errorf("handled %d messages, want 1", len(h.messages()))
	}
	waitFor(t, 5*time.Second, "the stream closed", func() bool { return legsOpen(t, r) == 0 })
}

// ForceUnary sends replies by Post, as before response legs.
func TestRespondForceUnary(t *testing.T) {
	h := &recorder{}
	b := startServerOn(t, "127.0.0.1:0", "b", h)
	r := newRouter(t, "a", secret, newBook("b", b.addr).Addr, func(c *peer.Config) { c.ForceUnary = true })
	for i := range 10 {
		r.Send("b", out("j", i))
	}
	r.Send("b", end("j"))
	e := end("j")
	waitFor(t, 5*time.Second, "every message", func() bool { return len(h.messages()) == 11 })
	checkLeg(t, h.messages(), "a", "j", 10, &e)
	if got := replyStreamsOpened(t, r); got != 0 {
		t.Errorf("respond streams opened = %v with ForceUnary", got)
	}
}

// Close ends every leg at once (streaming to a stuck ingress, backing off
// from a peer that is down, opening to one that never speaks) and leaks
// nothing; what they held is dropped and counted.
func TestRespondCloseLeaksNothing(t *testing.T) {
	before := goleak.IgnoreCurrent()
	hung, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never speaks
	if err != nil {
		t.Fatal(err)
	}
	defer hung.Close()
	gate := make(chan struct{})
	h := &gatedRecorder{block: func(m core.Message) { <-gate }}
	b := startServerOn(t, "127.0.0.1:0", "b", h)
	reg := prometheus.NewRegistry()
	r, err := peer.New(peer.Config{Node: "a", Secret: secret, MaxReconnectDelay: 50 * time.Millisecond,
		Addr:     newBook("b", b.addr, "down", freeAddr(t), "hung", hung.Addr().String()).Addr,
		RetryMin: time.Minute, RetryMax: time.Minute, Heartbeat: time.Second, Metrics: peer.NewMetrics(reg)})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		r.Send("b", out("j", i))
		r.Send("down", out("j", i))
		r.Send("hung", out("j", i))
	}
	waitFor(t, 5*time.Second, "the failed attempt", func() bool {
		return counter(t, reg, "switchyard_peer_send_failures_total", nil) >= 1
	})
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Close took %s", took)
	}
	if got := counter(t, reg, "switchyard_peer_messages_dropped_total", map[string]string{"kind": "reply"}); got != 15 {
		t.Errorf("dropped at Close = %v, want 15", got)
	}
	if got := counter(t, reg, "switchyard_peer_reply_legs_ended_total", map[string]string{"reason": "closed"}); got != 3 {
		t.Errorf("legs ended at Close = %v, want 3", got)
	}
	close(gate)
	b.stop()
	goleak.VerifyNone(t, before)
}

// openWatcher is a recorder that notes when each leg opened.
type openWatcher struct {
	recorder
	mu     sync.Mutex
	opened map[string]time.Time
}

func (w *openWatcher) ResponseLegOpened(from, job string, gen uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.opened[job]; !ok {
		w.opened[job] = time.Now()
	}
}

func (w *openWatcher) openedAt(job string) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	at, ok := w.opened[job]
	return at, ok
}

// A leg opened ahead of its first reply (Expect) tells the ingress where
// the job runs even if the worker stays silent: its open frame goes alone
// after a short delay (min(20ms, a quarter of the heartbeat interval)), or with
// the first reply if one comes sooner. Replies queued right after Expect
// are all delivered, in order.
func TestRespondExpectOpensTheLeg(t *testing.T) {
	// A heartbeat far above a loaded machine's scheduling delays: the test
	// counts reply streams, and one taken for silent would be another (at
	// 80 ms, 240 ms of silence, it was in 8 of 60 runs at load 8 on 2
	// CPUs). The open's delay is then its own bound, min(20ms, hb/4).
	const hb = time.Second
	const delay = min(20*time.Millisecond, hb/4)
	w := &openWatcher{opened: map[string]time.Time{}}
	b := startServerOn(t, "127.0.0.1:0", "b", w)
	r := newRouter(t, "a", secret, newBook("b", b.addr).Addr, fastDeliveries(5*time.Second, 15*time.Second, hb))

	expected := time.Now()
	r.Expect("b", "silent", 1, "q", time.Minute)
	waitFor(t, 5*time.Second, "the silent job's leg opened at the ingress", func() bool {
		_, ok := w.openedAt("silent")
		return ok
	})
	at, _ := w.openedAt("silent")
	t.Logf("a leg with nothing to send opened %s after Expect (delay %s)", at.Sub(expected), delay)
	if at.Sub(expected) < delay {
		t.Errorf("the open frame went %s after Expect, before the %s delay", at.Sub(expected), delay)
	}
	if got := len(w.messages()); got != 0 {
		t.Fatalf("ingress handled %d messages, want none", got)
	}

	// A job that answers at once: its open goes with its replies.
	const n = 20
	for range 50 {
		job := fmt.Sprintf("quick-%d", len(w.messages()))
		r.Expect("b", job, 1, "q", time.Minute)
		for i := range n {
			r.Send("b", out(job, i))
		}
		r.Send("b", end(job))
		waitFor(t, 5*time.Second, job+"'s replies", func() bool { return w.handled(job) == n+1 })
		e := end(job)
		checkLeg(t, w.messages(), "a", job, n, &e)
		if _, ok := w.openedAt(job); !ok {
			t.Fatalf("%s: no open seen at the ingress", job)
		}
	}
	if got := replyStreamsOpened(t, r); got != 1 {
		t.Errorf("reply streams opened = %v, want 1", got)
	}
}

// Legs that reply at the same time take turns at their reply stream's stream:
// every leg's messages still arrive once each and in order, under many
// concurrent senders, on one reply stream.
func TestRespondConcurrentLegsKeepTheirOrder(t *testing.T) {
	// A heartbeat far above a loaded machine's scheduling delays: these
	// tests count reply streams, and a reply stream taken for silent would
	// be another.
	p := startLegPair(t, time.Second, nil, nil)
	const legs, n = 24, 200
	jobs := legJobs("c", legs)
	sendLegs(p.ra, "b", jobs, n, true)()
	waitFor(t, 20*time.Second, "every leg's messages", func() bool { return len(p.hb.messages()) == legs*(n+1) })
	checkLegsEnded(t, p.hb.messages(), "a", jobs, n)
	waitFor(t, 5*time.Second, "every leg ended", func() bool { return legsOpen(t, p.ra) == 0 })
	if got := counter(t, p.ra.reg, "switchyard_peer_reply_legs_ended_total", map[string]string{"reason": "end"}); got != legs {
		t.Errorf("legs ended by their end = %v, want %d", got, legs)
	}
	if got := replyStreamsOpened(t, p.ra); got != 1 {
		t.Errorf("reply streams opened = %v, want 1", got)
	}
	if got := counter(t, p.ra.reg, "switchyard_peer_messages_total", map[string]string{"kind": "reply"}); got != legs*(n+1) {
		t.Errorf("replies counted = %v, want %d", got, legs*(n+1))
	}
}

// What a leg queued while it could not send (its in-flight bound reached:
// the ingress stopped handling) goes in shared frames once it can, each
// message handled once, in order.
func TestRespondQueuedMessagesShareFrames(t *testing.T) {
	p := startLegPair(t, 50*time.Millisecond, nil, nil)
	gate := make(chan struct{})
	var gateOnce sync.Once
	open := func() { gateOnce.Do(func() { close(gate) }) }
	t.Cleanup(open)
	p.hb.block = func(m core.Message) { <-gate }
	// More than the in-flight bound (256): the rest waits in the leg's
	// queue until acks come.
	const n = 600
	for i := range n {
		p.ra.Send("b", out("j", i))
	}
	p.ra.Send("b", end("j"))
	open()
	e := end("j")
	waitFor(t, 20*time.Second, "every message", func() bool { return len(p.hb.messages()) == n+1 })
	checkLeg(t, p.hb.messages(), "a", "j", n, &e)
	waitFor(t, 5*time.Second, "the leg closed", func() bool { return legsOpen(t, p.ra) == 0 })
	frames := counter(t, p.ra.reg, "switchyard_peer_reply_frames_total", nil)
	t.Logf("%d messages in %v frames", n+1, frames)
	// At most the in-flight bound went one to a frame; what queued behind
	// it goes as each ack (every 32 handled) makes room.
	if frames < 1 || frames > 256+(n+1-256)/2 {
		t.Errorf("%v frames for %d messages: want what was queued behind the in-flight bound to share frames", frames, n+1)
	}
	if got := counter(t, p.ra.reg, "switchyard_peer_messages_total", map[string]string{"kind": "reply"}); got != n+1 {
		t.Errorf("replies counted = %v, want %d", got, n+1)
	}
}

// A host whose connection closes and that never opens a new reply stream (a
// process killed: its legs are not taken up again) is reported to the
// ingress's receiver like a silent one, within three heartbeat intervals
// of its last frame — a crash and a pause end the same jobs in the same
// bound. A leg that had ended is not reported.
func TestRespondKilledHostIsReported(t *testing.T) {
	const hb = 50 * time.Millisecond
	h := startHostOfTwoLegs(t, hb)
	h.px.close() // every connection closed, and none accepted again
	killed := time.Now()
	h.awaitReported(t)
	took := time.Since(killed)
	t.Logf("killed host reported %s after its connection closed (heartbeat %s: %.1f intervals)", took, hb, float64(took)/float64(hb))
	if took > 3*hb+2*hb+200*time.Millisecond {
		t.Errorf("reported after %s, want within about 3 heartbeat intervals (%s each) of the last frame", took, hb)
	}
	h.noSecondReport(t)
}

// hostOfTwoLegs is a consumer host a (r) whose reply stream to ingress b
// runs through px, with the legs of jobs j and k open on it and m's
// ended: the case of a host that goes silent or dies.
type hostOfTwoLegs struct {
	w    *silenceWatcher
	b, r tnode
	px   *proxy
	hb   time.Duration

	susp syncbuf.List[string] // what b's Config.Suspect heard
}

func startHostOfTwoLegs(t *testing.T, hb time.Duration) *hostOfTwoLegs {
	h := &hostOfTwoLegs{w: &silenceWatcher{silent: make(chan string, 4)}, hb: hb}
	h.b = startNode(t, "b", "127.0.0.1:0", h.w, func(c *peer.Config) {
		c.Suspect = func(node string) { h.susp.Append(node) }
	})
	h.px = startProxy(t, h.b.addr)
	h.r = newRouter(t, "a", secret, newBook("b", h.px.addr()).Addr, fastDeliveries(5*time.Second, 15*time.Second, hb))
	h.r.Send("b", out("j", 0))
	h.r.Send("b", out("k", 0))
	h.r.Send("b", out("m", 0))
	h.r.Send("b", end("m"))
	waitFor(t, 5*time.Second, "the outputs", func() bool { return len(h.w.messages()) == 4 })
	waitFor(t, 5*time.Second, "m's leg ended", func() bool { return legsOpen(t, h.r) == 2 })
	return h
}

func (h *hostOfTwoLegs) suspected() []string { return h.susp.All() }

// awaitReported waits until b reported both open legs, and only those.
func (h *hostOfTwoLegs) awaitReported(t *testing.T) {
	reported := map[string]bool{}
	for len(reported) < 2 {
		select {
		case who := <-h.w.silent:
			reported[who] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("the ingress reported %v, not both open legs", reported)
		}
	}
	if !reported["a/j/1"] || !reported["a/k/1"] {
		t.Errorf("reported %v, want a/j/1 and a/k/1", reported)
	}
}

// noSecondReport fails t if b reports a leg again within ten intervals.
func (h *hostOfTwoLegs) noSecondReport(t *testing.T) {
	select {
	case again := <-h.w.silent:
		t.Errorf("reported twice: %s", again)
	case <-time.After(10 * h.hb):
	}
}
