package peer_test

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/peer"
)

// Tests of the host's one sender of response legs per ingress node
// (leg_sender.go): it does the work of every leg to that node, so what
// several legs queued together shares a frame, and it moves all of them
// to the next reply stream when one fails.

// legSenders is how many leg senders' goroutines run in the process.
func legSenders() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "peer.(*legSender).run(")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// What several legs queued while their ingress could not be reached goes
// in one frame once its reply stream opens, each leg's items in order,
// each leg's first carrying its open.
func TestLegSenderSharesFramesAcrossLegs(t *testing.T) {
	addr := freeAddr(t)
	r := newRouter(t, "a", secret, newBook("b", addr).Addr, func(c *peer.Config) {
		c.RetryMin, c.RetryMax = 100*time.Millisecond, 100*time.Millisecond
	})
	const legs, n = 8, 4
	jobs := legJobs("s", legs)
	for _, job := range jobs {
		for i := range n {
			r.Send("b", out(job, i))
		}
		r.Send("b", end(job))
	}
	waitFor(t, 5*time.Second, "a failed attempt", func() bool {
		return counter(t, r.reg, "switchyard_peer_send_failures_total", nil) >= 1
	})
	h := &recorder{}
	startServerOn(t, addr, "b", h)
	waitFor(t, 10*time.Second, "every leg's messages", func() bool { return len(h.messages()) == legs*(n+1) })
	checkLegsEnded(t, h.messages(), "a", jobs, n)
	waitFor(t, 5*time.Second, "every leg ended", func() bool { return legsOpen(t, r) == 0 })
	if got := counter(t, r.reg, "switchyard_peer_reply_frames_total", nil); got != 1 {
		t.Errorf("%v frames for %d legs' %d messages queued together, want 1", got, legs, legs*(n+1))
	}
	if got := counter(t, r.reg, "switchyard_peer_reply_legs_ended_total", map[string]string{"reason": "end"}); got != legs {
		t.Errorf("legs ended by their end = %v, want %d", got, legs)
	}
}

// A reply stream that fails under many legs sending at once is opened
// again once, for all of them: each leg's messages arrive once each and in
// order, a leg cancelled meanwhile ends alone, and once the legs ended and
// the idle reply stream closed the sender's goroutine is gone; the next
// leg starts another.
func TestLegSenderMovesEveryLegToTheNextReplyStream(t *testing.T) {
	var px *proxy
	p := startLegPair(t, 50*time.Millisecond, func(b tnode) string {
		px = startProxy(t, b.addr)
		return px.addr()
	}, func(c *peer.Config) { c.AckTimeoutCeiling, c.StreamIdle = 100*time.Millisecond, 400*time.Millisecond })
	held, gate := holdAt(p, func(m core.Message) bool { return m.JobID == "m00" && string(m.Output) == `{"i":50}` })
	const legs, n = 12, 200
	jobs := legJobs("m", legs)
	wait := sendLegs(p.ra, "b", jobs, n, false)
	<-held // the ingress handles m00's output 50; more is in flight
	px.cut()
	waitFor(t, 5*time.Second, "the legs' next reply stream", func() bool { return replyStreamsOpened(t, p.ra) >= 2 })
	close(gate)
	wait()
	waitFor(t, 10*time.Second, "m11's outputs", func() bool { return p.hb.handled("m11") == n })
	// Acked too: a cancel drops (and counts) what its leg still holds.
	waitFor(t, 10*time.Second, "every output acked", func() bool {
		return counter(t, p.ra.reg, "switchyard_peer_queue_messages", map[string]string{"node": "b"}) == 0
	})
	p.rb.Send("a", cancelOf("m11"))
	waitFor(t, 5*time.Second, "m11's leg ended by its cancel", func() bool {
		return counter(t, p.ra.reg, "switchyard_peer_reply_legs_ended_total", map[string]string{"reason": "cancel"}) == 1
	})
	ended := jobs[:legs-1] // all but m11
	for _, job := range ended {
		p.ra.Send("b", end(job))
	}
	waitFor(t, 10*time.Second, "every leg's messages", func() bool { return len(p.hb.messages()) >= (legs-1)*(n+1)+n })
	time.Sleep(100 * time.Millisecond) // a duplicate would land now
	checkLegsEnded(t, p.hb.messages(), "a", ended, n)
	checkLeg(t, p.hb.messages(), "a", "m11", n, nil)
	waitFor(t, 5*time.Second, "every leg ended", func() bool { return legsOpen(t, p.ra) == 0 })
	if got := counter(t, p.ra.reg, "switchyard_peer_reply_legs_ended_total", map[string]string{"reason": "end"}); got != legs-1 {
		t.Errorf("legs ended by their end = %v, want %d", got, legs-1)
	}
	if got := counter(t, p.ra.reg, "switchyard_peer_messages_total", map[string]string{"kind": "reply"}); got != (legs-1)*(n+1)+n {
		t.Errorf("replies counted = %v, want %d: a resent message counts once", got, (legs-1)*(n+1)+n)
	}
	if got := sum(t, p.ra.reg, "switchyard_peer_messages_dropped_total"); got != 0 {
		t.Errorf("dropped = %v", got)
	}

	waitFor(t, 5*time.Second, "the idle reply stream closed and its sender gone", func() bool {
		return replyStreamsOpen(t, p.ra) == 0 && legSenders() == 0
	})
	opened := replyStreamsOpened(t, p.ra)
	before := len(p.hb.messages())
	p.ra.Send("b", out("next", 0))
	p.ra.Send("b", end("next"))
	waitFor(t, 5*time.Second, "the next leg's messages", func() bool { return len(p.hb.messages()) == before+2 })
	e := end("next")
	checkLeg(t, p.hb.messages(), "a", "next", 1, &e)
	if got := replyStreamsOpened(t, p.ra); got != opened+1 {
		t.Errorf("reply streams opened = %v, want %v", got, opened+1)
	}
}
