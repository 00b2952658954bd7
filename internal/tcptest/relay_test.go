package tcptest

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// echoServer accepts on loopback and echoes every connection, until the
// test ends.
func echoServer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

// echo sends a word on c and reads it back, within 300ms.
func echo(c net.Conn) error {
	_ = c.SetDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := c.Write([]byte("ping")); err != nil {
		return err
	}
	_, err := io.ReadFull(c, make([]byte, 4))
	return err
}

func dial(t *testing.T, addr string) net.Conn {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// A relay carries both ways and counts it; blackholed, it answers nothing,
// on the connections it holds and on new ones, and closes none of them;
// healed, the connections it held before carry again.
func TestRelayBlackhole(t *testing.T) {
	r := NewRelay(t, echoServer(t))
	c := dial(t, r.Addr)
	if err := echo(c); err != nil {
		t.Fatalf("through the relay: %v", err)
	}
	if r.Conns() != 1 || r.Bytes() != 8 {
		t.Errorf("carried %d connections, %d bytes; want 1, 8 (4 each way)", r.Conns(), r.Bytes())
	}

	r.Blackhole()
	if err := echo(c); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("blackholed, on a held connection: %v, want a timeout", err)
	}
	if err := echo(dial(t, r.Addr)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("blackholed, on a new connection: %v, want a timeout", err)
	}
	if r.Conns() != 1 {
		t.Errorf("blackholed, joined %d connections to the target, want still 1", r.Conns())
	}

	r.Heal()
	c = dial(t, r.Addr)
	if err := echo(c); err != nil {
		t.Errorf("healed, on a new connection: %v", err)
	}
}

// Refusing or cut, a relay closes what it holds; a new connection is
// closed at once (refusing) or never answered (cut); healed, it joins new
// ones again.
func TestRelayRefuseAndCut(t *testing.T) {
	closed := func(err error) bool { return err != nil && !errors.Is(err, os.ErrDeadlineExceeded) }
	unanswered := func(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }
	for _, tc := range []struct {
		name  string
		fault func(*Relay)
		// newConn reports whether echo's error on a connection made
		// during the fault is the one the fault should give.
		newConn func(error) bool
		want    string
	}{
		{"refusing", (*Relay).Refuse, closed, "it closed"},
		{"cut", (*Relay).Cut, unanswered, "a timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRelay(t, echoServer(t))
			c := dial(t, r.Addr)
			if err := echo(c); err != nil {
				t.Fatalf("through the relay: %v", err)
			}
			tc.fault(r)
			if err := echo(c); !closed(err) {
				t.Errorf("%s, on a held connection: %v, want it closed", tc.name, err)
			}
			if err := echo(dial(t, r.Addr)); !tc.newConn(err) {
				t.Errorf("%s, on a new connection: %v, want %s", tc.name, err, tc.want)
			}
			r.Heal()
			if err := echo(dial(t, r.Addr)); err != nil {
				t.Errorf("healed, on a new connection: %v", err)
			}
		})
	}
}

// A closed relay accepts nothing; Close is idempotent.
func TestRelayClose(t *testing.T) {
	r := NewRelay(t, echoServer(t))
	if err := echo(dial(t, r.Addr)); err != nil {
		t.Fatalf("through the relay: %v", err)
	}
	r.Close()
	r.Close()
	if c, err := net.DialTimeout("tcp", r.Addr, time.Second); err == nil {
		c.Close()
		t.Errorf("closed, the relay still accepts")
	}
}

func TestFreeAddrs(t *testing.T) {
	addrs := FreeAddrs(t, 3)
	seen := map[string]bool{}
	for _, a := range addrs {
		if seen[a] {
			t.Errorf("%s twice in %v", a, addrs)
		}
		seen[a] = true
		ln, err := net.Listen("tcp", a)
		if err != nil {
			t.Errorf("listen on %s: %v", a, err)
			continue
		}
		ln.Close()
	}
}
