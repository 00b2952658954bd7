// Package tcptest is TCP plumbing for tests, as net/http/httptest is
// HTTP's: free loopback addresses, and a relay that stands between a
// client and a server, counts what it carries and fails on demand.
package tcptest

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// FreeAddrs returns n distinct 127.0.0.1 addresses whose ports were free a
// moment ago. Another process or test may take one before it is bound: the
// caller retries on a bind error.
func FreeAddrs(t testing.TB, n int) []string {
	t.Helper()
	addrs := make([]string, n)
	lns := make([]net.Listener, n)
	for i := range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("listen: %v", err)
		}
		lns[i], addrs[i] = ln, ln.Addr().String()
	}
	for _, ln := range lns {
		ln.Close()
	}
	return addrs
}

// Relay is a TCP forwarder on loopback: every connection to Addr is joined
// to a new one to its target. It counts the connections and bytes it
// carries, and fails on demand: blackholed, a peer gone silent (packets
// dropped, no FIN, no RST, as behind a blackhole route or on a paused
// host); refusing, a peer that is down (every connection closed, a new one
// closed at once); cut, the two in turn (every connection closed, a new
// one never answered). Heal ends any of them. It closes with the test.
type Relay struct {
	// Addr is the relay's address, host:port on 127.0.0.1.
	Addr string

	ln           net.Listener
	target       string
	conns, bytes atomic.Int64
	drop         atomic.Bool // blackholed
	wg           sync.WaitGroup

	mu       sync.Mutex
	refusing bool
	closed   bool
	open     []net.Conn
}

// NewRelay starts a relay to target, closed when t ends.
func NewRelay(t testing.TB, target string) *Relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Relay{Addr: ln.Addr().String(), ln: ln, target: target}
	r.wg.Go(r.accept)
	t.Cleanup(r.Close)
	return r
}

func (r *Relay) accept() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		if !r.hold(c) {
			continue
		}
		if r.drop.Load() {
			continue // held, never answered
		}
		up, err := net.Dial("tcp", r.target)
		if err != nil {
			c.Close()
			continue
		}
		if !r.hold(up) {
			c.Close()
			continue
		}
		r.conns.Add(1)
		r.wg.Go(func() { r.pipe(up, c); up.Close() })
		r.wg.Go(func() { r.pipe(c, up); c.Close() })
	}
}

// hold keeps c among the connections Refuse and Close close, unless the
// relay refuses or is closed: then it closes c and reports false.
func (r *Relay) hold(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.refusing || r.closed {
		c.Close()
		return false
	}
	r.open = append(r.open, c)
	return true
}

// pipe copies src to dst until either fails; blackholed, it reads and
// drops. Each read is counted before it is written on, so once the far
// side has received bytes, Bytes includes them.
func (r *Relay) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !r.drop.Load() {
			r.bytes.Add(int64(n))
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// closeOpen closes every connection the relay holds; r.mu is held.
func (r *Relay) closeOpen() {
	for _, c := range r.open {
		c.Close()
	}
	r.open = nil
}

// Blackhole makes the relay go silent until Heal: what either side sends
// is dropped, and a new connection is held and never answered.
func (r *Relay) Blackhole() { r.drop.Store(true) }

// Cut closes every connection the relay holds and goes silent: a new
// connection is accepted and never answered, until Heal (a peer that was
// lost, then is not even refusing: behind a blackhole route).
func (r *Relay) Cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.drop.Store(true)
	r.closeOpen()
}

// Refuse closes every connection the relay holds, and a new one at once,
// until Heal.
func (r *Relay) Refuse() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refusing = true
	r.closeOpen()
}

// Heal lets connections through again: after Blackhole, those joined
// before it carry again (one accepted while blackholed stays unanswered);
// after Refuse, new ones are joined.
func (r *Relay) Heal() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refusing = false
	r.drop.Store(false)
}

// Close closes the listener and every connection and waits for the
// relay's goroutines. It is idempotent.
func (r *Relay) Close() {
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		r.ln.Close()
		r.closeOpen()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// Conns is how many connections the relay has joined to its target.
func (r *Relay) Conns() int64 { return r.conns.Load() }

// Bytes is how many bytes the relay has carried, both ways.
func (r *Relay) Bytes() int64 { return r.bytes.Load() }
