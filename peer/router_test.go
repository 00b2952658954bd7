package peer_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/internal/syncbuf"
	"github.com/switchyard/switchyard/internal/tcptest"
	"github.com/switchyard/switchyard/peer"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// recorder is a core.Receiver that keeps the messages and forwards it
// was given.
type recorder struct {
	msgs     syncbuf.List[received]
	forwards syncbuf.List[received]
	mu       sync.Mutex // guards verdict
	// verdict answers HandleForward (nil: accept).
	verdict func(d core.Delivery) error
	// undeliverable, when set, hears Undeliverable.
	undeliverable func(node string, m core.Message, reason string)
}

var _ core.Receiver = (*recorder)(nil)

type received struct {
	from string
	m    core.Message
	d    core.Delivery
}

func (r *recorder) HandleForward(from string, d core.Delivery) error {
	r.forwards.Append(received{from: from, d: d})
	r.mu.Lock()
	v := r.verdict
	r.mu.Unlock()
	if v != nil {
		return v(d)
	}
	return nil
}

// HandleMessage records m, with a copy of its output: the transport's is
// valid during the call only (core.Receiver).
func (r *recorder) HandleMessage(from string, m core.Message) {
	m.Output = bytes.Clone(m.Output)
	r.msgs.Append(received{from: from, m: m})
}

func (r *recorder) Undeliverable(node string, m core.Message, reason string) {
	if r.undeliverable != nil {
		r.undeliverable(node, m, reason)
	}
}

func (r *recorder) ResponseLegOpened(string, string, uint64) {}
func (r *recorder) ResponseLegSilent(string, string, uint64) {}

func (r *recorder) messages() []received { return r.msgs.All() }

// handled is how many messages of job r has handled.
func (r *recorder) handled(job string) int {
	n := 0
	for _, m := range r.messages() {
		if m.m.JobID == job {
			n++
		}
	}
	return n
}

func (r *recorder) forwarded() []received { return r.forwards.All() }

// book is a catalog view the test edits: node id → peer address.
type book struct {
	mu    sync.Mutex
	addrs map[string]string
}

func newBook(kv ...string) *book { return &book{addrs: pairs(kv...)} }

// pairs is the map of kv's keys and values, in turn.
func pairs(kv ...string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

func (b *book) Addr(node string) (string, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	a, ok := b.addrs[node]
	return a, ok
}

func (b *book) set(node, addr string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.addrs[node] = addr
}

func (b *book) remove(node string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.addrs, node)
}

// newRouter returns node self's transport as a sender: secret key,
// addresses from addr, serving nothing and not started.
func newRouter(t *testing.T, self string, key []byte, addr func(string) (string, bool), tweak func(*peer.Config)) tnode {
	t.Helper()
	return startNode(t, self, "", nil, func(c *peer.Config) {
		c.Secret, c.Addr = key, addr
		if tweak != nil {
			tweak(c)
		}
	})
}

// freeAddr returns a loopback address nothing listens on (for now).
func freeAddr(t *testing.T) string { return tcptest.FreeAddrs(t, 1)[0] }

var kinds = []core.MessageKind{core.MsgReply, core.MsgRelease, core.MsgUnbind, core.MsgCancel, core.MsgDeliver, core.MsgForward}

// msg is the i-th test message of job: its kind cycles. A onDeliveryStream
// kind's Gen is i. The response kinds are what one binding of the job sends
// its ingress, so they share Gen 0 and a TTL: replies (each opens the
// binding's response leg if none is open) and releases, each right after a
// reply, so it rides that reply's leg and ends it.
func msg(job string, i int) core.Message {
	m := core.Message{Kind: kinds[i%len(kinds)], JobID: job, Gen: uint64(i), Queue: "q", Consumer: "c", Output: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))}
	if m.Kind == core.MsgForward || m.Kind == core.MsgDeliver {
		m.Delivery = &core.Delivery{JobID: job, Gen: uint64(i), Queue: "q", TTL: time.Duration(i)}
	}
	if !onDeliveryStream(m.Kind) {
		m.Gen, m.TTL = 0, time.Minute
	} else if i%7 == 0 {
		m.End = &core.End{}
	}
	return m
}

// final is the i-th release of job, under generation i: each is a
// binding's only message, so each goes by the node's unicast queue.
func final(job string, i int) core.Message {
	return core.Message{Kind: core.MsgRelease, JobID: job, Gen: uint64(i), Queue: "q", Consumer: "c", Reason: fmt.Sprint("r", i)}
}

// checkFinals fails unless got holds job's finals 0..n-1, once each, in
// order.
func checkFinals(t *testing.T, got []received, job string, n int) {
	t.Helper()
	for _, r := range got {
		if r.m.JobID != job {
			continue
		}
		if want := final(job, int(r.m.Gen)); !equalMessage(r.m, want) {
			t.Fatalf("got %+v, want %+v", r.m, want)
		}
	}
	checkOnceInOrder(t, got, job, n)
}

// checkOrder fails unless got holds, for each job, messages 0..n-1, each
// intact and from node from, in order within each of the router's paths:
// the job's response legs (reply, release) and the queue's delivery stream
// (the other kinds). The two paths are not ordered with each other.
func checkOrder(t *testing.T, got []received, from string, n int, jobs ...string) {
	t.Helper()
	type path struct {
		job              string
		onDeliveryStream bool
	}
	next := map[path][]int{}
	expect := func(job string) {
		for i := range n {
			k := path{job, onDeliveryStream(msg(job, i).Kind)}
			next[k] = append(next[k], i)
		}
	}
	for _, j := range jobs {
		expect(j)
	}
	seen := map[string]bool{}
	for _, r := range got {
		if r.from != from {
			t.Fatalf("message from %q, want %q", r.from, from)
		}
		seen[r.m.JobID] = true
		k := path{r.m.JobID, onDeliveryStream(r.m.Kind)}
		if len(next[k]) == 0 {
			t.Fatalf("job %s: unexpected message %+v", r.m.JobID, r.m)
		}
		i := next[k][0]
		next[k] = next[k][1:]
		if want := msg(r.m.JobID, i); !equalMessage(r.m, want) {
			t.Fatalf("job %s (onDeliveryStream %v): message %d is %+v, want %+v", r.m.JobID, k.onDeliveryStream, i, r.m, want)
		}
	}
	for k, left := range next {
		if len(left) > 0 {
			t.Fatalf("job %s (onDeliveryStream %v): %d messages did not arrive", k.job, k.onDeliveryStream, len(left))
		}
	}
	if len(seen) != len(jobs) {
		t.Fatalf("messages of %d jobs arrived, want %d", len(seen), len(jobs))
	}
}

// onDeliveryStream reports whether the router sends messages of kind by their
// queue's delivery stream (else by the response leg).
func onDeliveryStream(k core.MessageKind) bool { return k != core.MsgReply && k != core.MsgRelease }

func equalMessage(a, b core.Message) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

// waitSent waits until nothing is queued for node, the batch in flight
// included: its answer has come back and it is counted.
func waitSent(t *testing.T, r tnode, node string) {
	t.Helper()
	waitFor(t, 10*time.Second, "queue to "+node+" empty", func() bool {
		return counter(t, r.reg, "switchyard_peer_queue_messages", map[string]string{"node": node}) == 0
	})
}

func sum(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	var n float64
	for _, k := range kinds {
		n += counter(t, reg, name, map[string]string{"kind": string(k)})
	}
	return n
}

// Messages from one node to another arrive in the order they were sent,
// under concurrent senders and to several nodes at once, each counted once
// by its kind on the sending side.
func TestRouterUnicastsInOrder(t *testing.T) {
	hb, hc := &recorder{}, &recorder{}
	b := startServerOn(t, "127.0.0.1:0", "b", hb)
	c := startServerOn(t, "127.0.0.1:0", "c", hc)
	r := newRouter(t, "a", secret, newBook("b", b.addr, "c", c.addr).Addr, nil)

	const n, senders = 1000, 4
	for i := range n {
		r.Send("b", msg("one", i))
		r.Send("c", msg("one", i))
	}
	// Concurrent senders: each one's messages keep their order.
	var wg sync.WaitGroup
	var jobs []string
	for g := range senders {
		job := fmt.Sprintf("g%d", g)
		jobs = append(jobs, job)
		wg.Go(func() {
			for i := range n {
				r.Send("b", msg(job, i))
			}
		})
	}
	wg.Wait()

	waitFor(t, 20*time.Second, "every message", func() bool {
		return len(hb.messages()) == n*(senders+1) && len(hc.messages()) == n
	})
	checkOrder(t, hb.messages(), "a", n, append(jobs, "one")...)
	checkOrder(t, hc.messages(), "a", n, "one")

	waitSent(t, r, "b")
	waitSent(t, r, "c")
	if got, want := sum(t, r.reg, "switchyard_peer_messages_total"), float64(n*(senders+2)); got != want {
		t.Errorf("messages sent = %v, want %v", got, want)
	}
	perKind := map[core.MessageKind]float64{}
	for i := range n {
		perKind[msg("", i).Kind] += senders + 2
	}
	for k, want := range perKind {
		if got := counter(t, r.reg, "switchyard_peer_messages_total", map[string]string{"kind": string(k)}); got != want {
			t.Errorf("%s messages = %v, want %v", k, got, want)
		}
	}
	// The receiving side counts no routing messages: each is counted once,
	// where it was sent.
	if got := sum(t, b.reg, "switchyard_peer_messages_total"); got != 0 {
		t.Errorf("receiver counted %v routing messages", got)
	}
	if got := counter(t, r.reg, "switchyard_peer_send_failures_total", nil); got != 0 {
		t.Errorf("send failures = %v", got)
	}
}

// A batch is cut at the message size limit, in order; a message that alone
// exceeds it is undeliverable (counted, never sent), and the others still
// go.
func TestRouterSplitsBatchesAtTheSizeLimit(t *testing.T) {
	h := &recorder{}
	b := startServerOn(t, "127.0.0.1:0", "b", h)
	r := newRouter(t, "a", secret, newBook("b", b.addr).Addr, func(c *peer.Config) { c.MaxMessageBytes = 8 << 10 })

	// Ends with no response leg open go by Post.
	chunk := json.RawMessage(`"` + strings.Repeat("x", 500) + `"`)
	const n = 100
	for i := range n {
		r.Send("b", core.Message{Kind: core.MsgReply, JobID: "j", Gen: uint64(i), End: &core.End{Result: chunk}})
		if i == 50 {
			r.Send("b", core.Message{Kind: core.MsgReply, JobID: "huge", End: &core.End{Result: json.RawMessage(`"` + strings.Repeat("y", 10<<10) + `"`)}})
		}
	}
	waitFor(t, 10*time.Second, "every message", func() bool { return len(h.messages()) == n })
	for i, got := range h.messages() {
		if got.m.JobID != "j" || got.m.Gen != uint64(i) {
			t.Fatalf("message %d is %s/%d", i, got.m.JobID, got.m.Gen)
		}
	}
	if got := counter(t, r.reg, "switchyard_peer_streams_opened_total", map[string]string{"kind": "respond"}); got != 0 {
		t.Errorf("respond streams opened = %v, want 0: a binding's only message needs no leg", got)
	}
	if got := counter(t, r.reg, "switchyard_peer_messages_undeliverable_total", map[string]string{"kind": "reply", "reason": peer.ReasonTooLarge}); got != 1 {
		t.Errorf("undeliverable = %v, want 1 (the oversized one)", got)
	}
	if got := sum(t, r.reg, "switchyard_peer_messages_dropped_total"); got != 0 {
		t.Errorf("dropped = %v, want 0: an undeliverable message is not dropped", got)
	}
	waitSent(t, r, "b")
	if got := counter(t, r.reg, "switchyard_peer_messages_total", map[string]string{"kind": "reply"}); got != n {
		t.Errorf("sent = %v, want %d", got, n)
	}
}

// A refusal is an answer: it comes back as the *core.Error the dispatcher
// returned, code, detail, field and hint intact.
func TestForwardRefusalIsACoreError(t *testing.T) {
	h := &recorder{verdict: func(d core.Delivery) error {
		if d.Queue == "full" {
			return &core.Error{Code: core.CodeQueueFull, Detail: "the queue is full", Field: "queue", RetryAfter: time.Second}
		}
		return nil
	}}
	b := startServerOn(t, "127.0.0.1:0", "b", h)
	r := newRouter(t, "a", secret, newBook("b", b.addr).Addr, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	d := fullDelivery()
	if err := r.Forward(ctx, "b", d); err != nil {
		t.Fatalf("accepted forward: %v", err)
	}
	if got := h.forwarded(); len(got) != 1 || got[0].from != "a" || !equalDelivery(got[0].d, d) {
		t.Fatalf("dispatcher got %+v, want %+v from a", got, d)
	}

	err := r.Forward(ctx, "b", core.Delivery{JobID: "j2", Queue: "full"})
	var ce *core.Error
	if !errors.As(err, &ce) {
		t.Fatalf("got %v (%T), want a *core.Error", err, err)
	}
	want := core.Error{Code: core.CodeQueueFull, Detail: "the queue is full", Field: "queue", RetryAfter: time.Second}
	if *ce != want || !errors.Is(err, core.ErrQueueFull) {
		t.Fatalf("got %#v, want %#v", *ce, want)
	}
	if got := counter(t, r.reg, "switchyard_peer_messages_total", map[string]string{"kind": "forward"}); got != 2 {
		t.Errorf("forwards counted = %v, want 2 (a refusal is an answer)", got)
	}
	if got := counter(t, r.reg, "switchyard_peer_send_failures_total", nil); got != 0 {
		t.Errorf("send failures = %v, want 0", got)
	}

	if err := r.Forward(ctx, "nobody", d); !errors.Is(err, peer.ErrUnknownNode) {
		t.Errorf("forward to an unknown node: got %v, want ErrUnknownNode", err)
	}
}

func equalDelivery(a, b core.Delivery) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

// A dispatcher that cannot decide (an error that is no *core.Error) is
// Unavailable, retried until the caller's context ends; the error then
// wraps the context's and is no refusal.
func TestForwardUndecidedIsRetriedUntilTheDeadline(t *testing.T) {
	h := &recorder{verdict: func(core.Delivery) error { return errors.New("disk on fire") }}
	b := startServerOn(t, "127.0.0.1:0", "b", h)
	r := newRouter(t, "a", secret, newBook("b", b.addr).Addr, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := r.Forward(ctx, "b", core.Delivery{JobID: "j"})
	if _, isRefusal := core.CodeOf(err); isRefusal || !errors.Is(err, context.DeadlineExceeded) || status.Code(errors.Unwrap(err)) == codes.OK {
		t.Fatalf("got %v, want the deadline, no refusal", err)
	}
	if !strings.Contains(err.Error(), "disk on fire") {
		t.Errorf("%v does not say why the attempts failed", err)
	}
	if got := len(h.forwarded()); got < 2 {
		t.Errorf("dispatcher asked %d times, want retries", got)
	}
}

// Forward retries while the dispatcher's peer port is down, and succeeds
// once it is up; messages sent meanwhile wait and arrive in order. A node
// that is up but not routing yet answers Unavailable, and is retried too.
func TestForwardAndUnicastRetryUntilThePeerIsUp(t *testing.T) {
	addr := freeAddr(t)
	r := newRouter(t, "a", secret, newBook("b", addr).Addr, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()

	const n = 50
	for i := range n {
		r.Send("b", msg("j", i))
	}
	errc := make(chan error, 1)
	go func() { errc <- r.Forward(ctx, "b", core.Delivery{JobID: "f", Gen: 3}) }()

	time.Sleep(300 * time.Millisecond)
	select {
	case err := <-errc:
		t.Fatalf("forward returned %v while the peer was down", err)
	default:
	}
	h := &recorder{}
	b := startServerOn(t, addr, "b", nil) // not started yet: Unavailable
	time.Sleep(200 * time.Millisecond)
	b.Start(h)

	if err := <-errc; err != nil {
		t.Fatalf("forward: %v", err)
	}
	if got := h.forwarded(); len(got) != 1 || got[0].d.JobID != "f" || got[0].d.Gen != 3 {
		t.Fatalf("dispatcher got %+v, want job f once", got)
	}
	waitFor(t, 10*time.Second, "queued messages", func() bool { return len(h.messages()) == n })
	checkOrder(t, h.messages(), "a", n, "j")
	if got := counter(t, r.reg, "switchyard_peer_send_failures_total", nil); got < 2 {
		t.Errorf("send failures = %v, want the failed attempts counted", got)
	}
	waitSent(t, r, "b")
	if got := sum(t, r.reg, "switchyard_peer_messages_total"); got != n+1 {
		t.Errorf("messages counted = %v, want %d: a resent batch counts once", got, n+1)
	}
}

// A Post attempt that times out while the receiver is still handling it is
// resent; the receiver handles each message once, in order.
func TestUnicastResendIsHandledOnce(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	h := &slowRecorder{gate: func() { once.Do(func() { <-release }) }}
	b := startServerOn(t, "127.0.0.1:0", "b", h)
	r := newRouter(t, "a", secret, newBook("b", b.addr).Addr, func(c *peer.Config) { c.AttemptTimeout = 100 * time.Millisecond })

	const n = 20
	for i := range n {
		r.Send("b", final("j", i))
	}
	// The first message blocks its batch past several attempt timeouts.
	waitFor(t, 5*time.Second, "resends", func() bool {
		return counter(t, r.reg, "switchyard_peer_send_failures_total", nil) >= 2
	})
	for i := n; i < 2*n; i++ {
		r.Send("b", final("j", i))
	}
	close(release)
	waitFor(t, 10*time.Second, "every message", func() bool { return len(h.messages()) >= 2*n })
	time.Sleep(200 * time.Millisecond) // a duplicate would land now
	checkFinals(t, h.messages(), "j", 2*n)
	waitSent(t, r, "b")
	if got := sum(t, r.reg, "switchyard_peer_messages_total"); got != 2*n {
		t.Errorf("messages counted = %v, want %d", got, 2*n)
	}
}

type slowRecorder struct {
	recorder
	gate func()
}

func (s *slowRecorder) HandleMessage(from string, m core.Message) {
	s.gate()
	s.recorder.HandleMessage(from, m)
}

// closeEndsTheForward closes r, which must take under two seconds and end
// the Forward in flight, whose error ferr yields, with ErrClosed.
func closeEndsTheForward(t *testing.T, r *peer.Transport, ferr <-chan error) {
	t.Helper()
	start := time.Now()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Close took %s", took)
	}
	if err := <-ferr; !errors.Is(err, peer.ErrClosed) {
		t.Errorf("forward in flight at Close: got %v, want ErrClosed", err)
	}
}

// sendToADownNode is a router a that sent messages 0..n-1 of job j to
// node b, whose address nothing listens on, and failed a first attempt.
func sendToADownNode(t *testing.T, n int) (*book, tnode) {
	t.Helper()
	bk := newBook("b", freeAddr(t))
	r := newRouter(t, "a", secret, bk.Addr, nil)
	for i := range n {
		r.Send("b", msg("j", i))
	}
	waitFor(t, 5*time.Second, "a failed attempt", func() bool {
		return counter(t, r.reg, "switchyard_peer_send_failures_total", nil) >= 1
	})
	return bk, r
}

// Messages for a node that left the catalog (its lease is gone: it is
// dead) are dropped and counted, not retried forever; its sender exits.
func TestSendToAVanishedNodeIsDropped(t *testing.T) {
	const n = 5
	bk, r := sendToADownNode(t, n)
	if got := counter(t, r.reg, "switchyard_peer_queue_messages", map[string]string{"node": "b"}); got != n {
		t.Errorf("queue gauge = %v while undeliverable, want %d", got, n)
	}
	bk.remove("b")
	waitFor(t, 5*time.Second, "drops", func() bool { return sum(t, r.reg, "switchyard_peer_messages_dropped_total") == n })
	if got := counter(t, r.reg, "switchyard_peer_messages_dropped_total", map[string]string{"kind": "reply"}); got != 1 {
		t.Errorf("dropped replies = %v, want 1", got)
	}
	if got := sum(t, r.reg, "switchyard_peer_messages_total"); got != 0 {
		t.Errorf("dropped messages counted as sent: %v", got)
	}
	r.Send("b", msg("k", 0))
	waitFor(t, 5*time.Second, "later send dropped", func() bool { return sum(t, r.reg, "switchyard_peer_messages_dropped_total") == n+1 })
	waitFor(t, 5*time.Second, "queue gauge at 0", func() bool {
		return counter(t, r.reg, "switchyard_peer_queue_messages", map[string]string{"node": "b"}) == 0
	})
}

// Post and Forward on a connection without the cluster handshake are
// refused and counted; a router whose secret is wrong drops what it cannot
// deliver rather than stall behind it (its handshake's refusal is
// Unauthenticated, final).
func TestRoutingCallsAreAuthenticated(t *testing.T) {
	h := &recorder{}
	b := startServerOn(t, "127.0.0.1:0", "b", h)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	bare := dialBare(t, b.addr)
	p, _ := peer.MessageToPB(msg("j", 0))
	if _, err := bare.Post(ctx, &pb.PostRequest{Messages: []*pb.PeerMessage{p}}); err == nil {
		t.Error("bare Post served")
	}
	if _, err := bare.Forward(ctx, &pb.ForwardRequest{Delivery: peer.DeliveryToPB(fullDelivery())}); err == nil {
		t.Error("bare Forward served")
	}
	bareRefusals := counter(t, b.reg, "switchyard_peer_auth_failures_total", nil)
	if bareRefusals < 1 {
		t.Errorf("auth failures = %v after the bare calls, want at least 1 (one per connection tried)", bareRefusals)
	}

	r := newRouter(t, "a", []byte("another-secret-of-16+"), newBook("b", b.addr).Addr, nil)
	r.Send("b", msg("j", 0))
	r.Send("b", msg("j", 1))
	waitFor(t, 5*time.Second, "drops", func() bool { return sum(t, r.reg, "switchyard_peer_messages_dropped_total") == 2 })
	if err := r.Forward(ctx, "b", fullDelivery()); status.Code(errors.Unwrap(err)) != codes.Unauthenticated {
		t.Errorf("forward with a wrong secret: got %v, want Unauthenticated at once", err)
	}
	if got := counter(t, b.reg, "switchyard_peer_auth_failures_total", nil); got <= bareRefusals {
		t.Errorf("auth failures = %v: the wrong secret's connections were not counted", got)
	}
	if len(h.messages()) != 0 || len(h.forwarded()) != 0 {
		t.Errorf("the handler saw unauthenticated calls: %v %v", h.messages(), h.forwarded())
	}
}

// The receiver skips what it handled already (same session, lower
// sequence numbers) and messages no handler could act on, which it counts,
// and handles the rest of the batch in order.
func TestUnicastSkipsDuplicatesAndInvalidMessages(t *testing.T) {
	h := &recorder{}
	b := startServerOn(t, "127.0.0.1:0", "b", h)
	cl, ctx := rawClient(t, b)
	batch := func(session string, first int, n int) *pb.PostRequest {
		req := &pb.PostRequest{Session: session, FirstSeq: uint64(first)}
		for i := first; i < first+n; i++ {
			p, _ := peer.MessageToPB(final(session, i))
			req.Messages = append(req.Messages, p)
		}
		return req
	}
	post := func(req *pb.PostRequest) {
		t.Helper()
		if _, err := cl.Post(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	post(batch("s1", 0, 3))
	post(batch("s1", 0, 3)) // a resend: skipped
	post(batch("s1", 2, 3)) // overlaps: 2 skipped, 3 and 4 handled
	post(batch("s2", 0, 2)) // a new sender process starts afresh
	post(batch("s1", 4, 2)) // and the first one, back: afresh as well (it cannot tell)
	var got []string
	for _, r := range h.messages() {
		got = append(got, fmt.Sprintf("%s/%d", r.m.JobID, r.m.Gen))
	}
	want := "s1/0 s1/1 s1/2 s1/3 s1/4 s2/0 s2/1 s1/4 s1/5"
	if strings.Join(got, " ") != want {
		t.Errorf("handled %v, want %v", got, want)
	}

	bad := batch("s3", 0, 3)
	bad.Messages[1] = &pb.PeerMessage{Kind: 42, JobId: "x"}
	bad.Messages = append(bad.Messages, &pb.PeerMessage{Kind: pb.PeerMessage_KIND_CANCEL})
	post(bad)
	if got := h.messages()[len(h.messages())-2:]; got[0].m.Gen != 0 || got[1].m.Gen != 2 || got[1].m.JobID != "s3" {
		t.Errorf("around the invalid message: %+v", got)
	}
	if got := counter(t, b.reg, "switchyard_peer_messages_invalid_total", nil); got != 2 {
		t.Errorf("invalid messages = %v, want 2", got)
	}
	if _, err := cl.Forward(ctx, &pb.ForwardRequest{}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("forward without a job: got %v, want InvalidArgument", err)
	}
}

// Until the engine starts the transport, routing calls are Unavailable;
// Ping already answers.
func TestServerNotStartedIsUnavailable(t *testing.T) {
	b := startServer(t, "b")
	c := newClient(t, "a", secret)
	cc, err := c.Conn("b", b.addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl := pb.NewPeerServiceClient(cc)
	if _, err := cl.Post(ctx, &pb.PostRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("Post: got %v, want Unavailable", err)
	}
	if _, err := cl.Forward(ctx, &pb.ForwardRequest{Delivery: &pb.PeerDelivery{JobId: "j"}}); status.Code(err) != codes.Unavailable {
		t.Errorf("Forward: got %v, want Unavailable", err)
	}
	if got, err := c.Ping(ctx, "b", b.addr); err != nil || got != "b" {
		t.Errorf("Ping: %q, %v", got, err)
	}
	b.Start(&recorder{})
	if _, err := cl.Post(ctx, &pb.PostRequest{}); err != nil {
		t.Errorf("Post after Start: %v", err)
	}
}

// A node's sender exits once its queue stayed empty for the idle interval;
// the next Send starts another.
func TestSenderExitsWhenIdle(t *testing.T) {
	h := &recorder{}
	b := startServerOn(t, "127.0.0.1:0", "b", h)
	r := newRouter(t, "a", secret, newBook("b", b.addr).Addr, func(c *peer.Config) { c.IdleTimeout = 50 * time.Millisecond })
	for round := range 2 {
		r.Send("b", final("j", round))
		waitFor(t, 5*time.Second, "delivery", func() bool { return len(h.messages()) == round+1 })
		waitFor(t, 5*time.Second, "sender gone", func() bool { return series(t, r.reg, "switchyard_peer_queue_messages") == 0 })
	}
	checkFinals(t, h.messages(), "j", 2)
}

// Close stops every sender at once, even one waiting on a peer that
// accepted the connection but never answers and one backing off from a
// peer that is down; what they held is dropped and counted, and later
// Sends are dropped too. TestMain's leak check proves the goroutines gone.
func TestCloseStopsEverySender(t *testing.T) {
	hung, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never speaks
	if err != nil {
		t.Fatal(err)
	}
	defer hung.Close()
	h := &recorder{}
	b := startServerOn(t, "127.0.0.1:0", "b", h)
	r := newRouter(t, "a", secret, newBook("b", b.addr, "hung", hung.Addr().String(), "down", freeAddr(t)).Addr,
		func(c *peer.Config) {
			c.AttemptTimeout = time.Minute
			c.RetryMin, c.RetryMax = time.Minute, time.Minute
		})
	r.Send("b", msg("j", 0))
	waitFor(t, 5*time.Second, "delivery", func() bool { return len(h.messages()) == 1 })
	// b's ack is deferred to its next heartbeat tick: until it arrives the
	// reply is still held (and would be counted as dropped at Close).
	waitFor(t, 5*time.Second, "b's ack", func() bool {
		return counter(t, r.reg, "switchyard_peer_queue_messages", map[string]string{"node": "b"}) == 0
	})
	r.Send("hung", msg("j", 0))
	r.Send("down", msg("j", 0))
	r.Send("down", msg("j", 1))
	waitFor(t, 5*time.Second, "the down peer failing", func() bool {
		return counter(t, r.reg, "switchyard_peer_send_failures_total", nil) >= 1
	})
	fctx, fcancel := context.WithCancel(context.Background())
	defer fcancel()
	ferr := make(chan error, 1)
	go func() { ferr <- r.Forward(fctx, "hung", core.Delivery{JobID: "f"}) }()
	// A forward to the down peer waits out a minute's backoff after its
	// first attempt: Close ends that wait too, with a context that never
	// ends.
	downErr := make(chan error, 1)
	go func() { downErr <- r.Forward(context.Background(), "down", core.Delivery{JobID: "g"}) }()
	time.Sleep(100 * time.Millisecond)

	closeEndsTheForward(t, r.Transport, ferr)
	select {
	case err := <-downErr:
		if !errors.Is(err, peer.ErrClosed) {
			t.Errorf("forward in its backoff at Close: got %v, want ErrClosed", err)
		}
	case <-time.After(2 * time.Second):
		t.Error("a forward in its backoff outlived Close")
	}
	if got := sum(t, r.reg, "switchyard_peer_messages_dropped_total"); got != 3 {
		t.Errorf("dropped at Close = %v, want 3", got)
	}
	r.Send("b", msg("j", 1))
	if got := sum(t, r.reg, "switchyard_peer_messages_dropped_total"); got != 4 {
		t.Errorf("dropped after Close = %v, want 4", got)
	}
	if got := series(t, r.reg, "switchyard_peer_queue_messages"); got != 0 {
		t.Errorf("queue gauges left after Close: %d", got)
	}
	if err := r.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// The node's address is resolved again on every attempt: a node that
// moved (restarted on another port) gets what was queued for it.
func TestUnicastFollowsANodeThatMoved(t *testing.T) {
	const n = 10
	bk, _ := sendToADownNode(t, n)
	h := &recorder{}
	b := startServerOn(t, "127.0.0.1:0", "b", h)
	bk.set("b", b.addr)
	waitFor(t, 10*time.Second, "every message", func() bool { return len(h.messages()) == n })
	checkOrder(t, h.messages(), "a", n, "j")
}
