package tcptest

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// A relay carries both ways and counts it; blackholed, it answers nothing,
// on the connections it holds and on new ones, and closes none of them.
func TestRelay(t *testing.T) {
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
	r := NewRelay(t, ln.Addr().String())
	c, err := net.Dial("tcp", r.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	echo := func(c net.Conn) error {
		_ = c.SetDeadline(time.Now().Add(300 * time.Millisecond))
		if _, err := c.Write([]byte("ping")); err != nil {
			return err
		}
		buf := make([]byte, 4)
		_, err := io.ReadFull(c, buf)
		return err
	}
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
	c2, err := net.Dial("tcp", r.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if err := echo(c2); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("blackholed, on a new connection: %v, want a timeout", err)
	}
	if r.Conns() != 1 {
		t.Errorf("blackholed, joined %d connections to the target, want still 1", r.Conns())
	}
}
