// Package tcptest is TCP plumbing for tests, as net/http/httptest is
// HTTP's: a relay that stands between a client and a server, counts what
// it carries and can go silent on demand.
package tcptest

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Relay is a TCP forwarder on loopback: every connection to Addr is joined
// to a new one to its target. It counts the connections and bytes it
// carries; once blackholed it keeps its connections open and discards
// everything either way, and accepts new connections without answering
// them: a peer gone silent (packets dropped, no FIN, no RST), as behind a
// blackhole route or on a paused host. It stops with the test.
type Relay struct {
	// Addr is the relay's address, host:port on 127.0.0.1.
	Addr string

	conns, bytes atomic.Int64
	drop         atomic.Bool
}

// NewRelay starts a relay to target, closed, with every connection it
// holds, when t ends.
func NewRelay(t testing.TB, target string) *Relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Relay{Addr: ln.Addr().String()}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		open []net.Conn
	)
	hold := func(cs ...net.Conn) {
		mu.Lock()
		open = append(open, cs...)
		mu.Unlock()
	}
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if r.drop.Load() {
				hold(c)
				continue
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			r.conns.Add(1)
			hold(c, up)
			wg.Go(func() { r.pipe(up, c); up.Close() })
			wg.Go(func() { r.pipe(c, up); c.Close() })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range open {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return r
}

// pipe copies src to dst until either fails, counting what it writes;
// blackholed, it reads and drops.
func (r *Relay) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !r.drop.Load() {
			w, werr := dst.Write(buf[:n])
			r.bytes.Add(int64(w))
			if werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Blackhole makes the relay go silent, for good: what either side sends
// from now on is dropped, and a new connection is never answered.
func (r *Relay) Blackhole() { r.drop.Store(true) }

// Conns is how many connections the relay has joined to its target.
func (r *Relay) Conns() int64 { return r.conns.Load() }

// Bytes is how many bytes the relay has carried, both ways.
func (r *Relay) Bytes() int64 { return r.bytes.Load() }
