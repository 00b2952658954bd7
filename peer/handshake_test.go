package peer_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/switchyard/switchyard/peer"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// The sizes of the handshake's messages (handshake.go) between nodes a
// and b: the hello and the proof are what a client sends before gRPC.
const (
	helloLen     = len("SYPEER/1") + 1 + len("a") + 32
	challengeLen = len("SYPEER/1") + 1 + len("b") + 32 + 32
	proofLen     = 32
)

// A connection that does not pass the cluster handshake carries no call:
// a client with no handshake (gRPC's own insecure transport), one that
// presents, in metadata, the credential nodes used to send (a's id and
// its HMAC under the secret: what the issue captured and replayed), one
// of another secret, and bytes that are not the protocol are refused and
// counted; none is answered or reaches the receiver. A client that meant
// another node refuses the server. One with the secret is served, and its
// messages are from the node its handshake proved.
func TestPeerHandshakeRefusals(t *testing.T) {
	h := &recorder{}
	b := startNode(t, "b", "127.0.0.1:0", h, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	plain := dialBare(t, b.addr)
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte("a"))
	oldCredential := metadata.NewOutgoingContext(ctx, metadata.Pairs(
		"x-switchyard-node", "a", "x-switchyard-auth", hex.EncodeToString(mac.Sum(nil)), peer.MetadataVersion, "1"))

	for i, tc := range []struct {
		name string
		call func() error
	}{
		{"no handshake", func() error { _, err := plain.Ping(ctx, &pb.PingRequest{}); return err }},
		{"no handshake, a's credential in metadata", func() error {
			_, err := plain.Ping(oldCredential, &pb.PingRequest{})
			return err
		}},
		{"another secret", func() error {
			_, err := dialPeer(t, b.addr, "a", "b", []byte("another-secret-of-16+")).Ping(ctx, &pb.PingRequest{})
			return err
		}},
		{"not the protocol", func() error {
			conn, err := net.Dial("tcp", b.addr)
			if err != nil {
				return nil
			}
			defer conn.Close()
			_, _ = conn.Write([]byte("GET / HTTP/1.1\r\nHost: b\r\n\r\n" + strings.Repeat("x", 64)))
			_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			got, _ := io.ReadAll(conn)
			if len(got) > 0 {
				return nil // answered: the test fails below
			}
			return io.EOF
		}},
	} {
		if err := tc.call(); err == nil {
			t.Errorf("%s: served", tc.name)
		} else {
			t.Logf("%s: refused: %v", tc.name, err)
		}
		waitFor(t, 5*time.Second, tc.name+" counted", func() bool {
			return counter(t, b.reg, "switchyard_peer_auth_failures_total", nil) >= float64(i+1)
		})
	}
	_, err := newClient(t, "a", secret).Ping(ctx, "c", b.addr)
	if err == nil || !strings.Contains(err.Error(), `the other end is node \"b\", not \"c\"`) {
		t.Errorf("a client meaning node c at b's address: %v, want it to refuse b", err)
	}
	if got := counter(t, b.reg, "switchyard_peer_messages_total", map[string]string{"kind": "ping"}); got != 0 {
		t.Errorf("%v pings answered on refused connections", got)
	}

	got, err := newClient(t, "a", secret).Ping(ctx, "b", b.addr)
	if err != nil || got != "b" {
		t.Fatalf("ping with the secret: %q, %v", got, err)
	}
	r := newRouter(t, "a", secret, newBook("b", b.addr).Addr, nil)
	r.Send("b", final("j", 0))
	waitFor(t, 5*time.Second, "a's message", func() bool { return len(h.messages()) == 1 })
	if from := h.messages()[0].from; from != "a" {
		t.Errorf("message from %q, want a (the node the connection proved)", from)
	}
}

// A captured handshake replayed on another connection is refused: the
// server's new nonce makes the captured proof worthless, whether the
// handshake alone is replayed or the whole connection's bytes, calls
// included.
func TestCapturedHandshakeReplayRefused(t *testing.T) {
	h := &recorder{}
	b := startNode(t, "b", "127.0.0.1:0", h, nil)
	tap := startTap(t, b.addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if got, err := newClient(t, "a", secret).Ping(ctx, "b", tap.addr); err != nil || got != "b" {
		t.Fatalf("ping through the tap: %q, %v", got, err)
	}
	sent, answered := tap.conn(0)
	if len(sent) < helloLen+proofLen || len(answered) < challengeLen+1 || answered[challengeLen] != 1 {
		t.Fatalf("captured %d bytes sent, %d answered: not a handshake that was accepted", len(sent), len(answered))
	}
	pings := counter(t, b.reg, "switchyard_peer_messages_total", map[string]string{"kind": "ping"})
	failures := counter(t, b.reg, "switchyard_peer_auth_failures_total", nil)

	// The handshake alone: a fresh challenge, then the refusal.
	conn, err := net.Dial("tcp", b.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write(sent[:helloLen+proofLen]); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	reply, _ := io.ReadAll(conn)
	if len(reply) != challengeLen+1 || reply[challengeLen] != 0 {
		t.Fatalf("the replayed handshake got %d bytes (%x), want a challenge and the refusal (0)", len(reply), reply)
	}
	if bytes.Equal(reply[:challengeLen], answered[:challengeLen]) {
		t.Error("the server sent the captured challenge again: its nonce is not fresh")
	}
	// The whole connection, its Ping included.
	conn2, err := net.Dial("tcp", b.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	_, _ = conn2.Write(sent)
	_ = conn2.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, _ = io.Copy(io.Discard, conn2)

	waitFor(t, 5*time.Second, "both replays counted", func() bool {
		return counter(t, b.reg, "switchyard_peer_auth_failures_total", nil) == failures+2
	})
	if got := counter(t, b.reg, "switchyard_peer_messages_total", map[string]string{"kind": "ping"}); got != pings {
		t.Errorf("pings answered %v, want %v: a replayed Ping was served", got, pings)
	}
	t.Logf("captured handshake replayed on a new connection: challenge with a new nonce, then refused (verdict %d); %v refusals counted", reply[challengeLen], counter(t, b.reg, "switchyard_peer_auth_failures_total", nil)-failures)
}

// A listener that is not a node of the cluster, at an address a node was
// told is node "evil"'s, gets nothing usable: the node sends its hello
// and no proof until the listener proves the secret, which it can only
// borrow by relaying to a real node, which proves itself as that node
// and not as "evil", so the node refuses it. What the listener saw (a
// node id and a nonce) passes nowhere: TestCapturedHandshakeReplayRefused.
func TestOutsiderListenerGetsNothing(t *testing.T) {
	h := &recorder{}
	b := startNode(t, "b", "127.0.0.1:0", h, nil)
	evil := startTap(t, b.addr) // relays whatever it gets to b, and keeps it
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := newClient(t, "a", secret).Ping(ctx, "evil", evil.addr)
	if err == nil || !strings.Contains(err.Error(), `the other end is node \"b\", not \"evil\"`) {
		t.Fatalf("ping of evil: %v, want the relayed node refused", err)
	}
	sent, _ := evil.conn(0)
	if len(sent) != helloLen {
		t.Errorf("the node sent the listener %d bytes, want its hello alone (%d): no proof", len(sent), helloLen)
	}
	if got := counter(t, b.reg, "switchyard_peer_messages_total", map[string]string{"kind": "ping"}); got != 0 {
		t.Errorf("b answered %v pings through the relay", got)
	}
	if len(h.messages()) != 0 {
		t.Errorf("b's receiver got %d messages through the relay", len(h.messages()))
	}
}

// tap is a TCP relay to a target that keeps, per connection, what each
// side sent.
type tap struct {
	addr  string
	mu    sync.Mutex
	conns []*tapConn
}

type tapConn struct {
	mu             sync.Mutex
	sent, answered bytes.Buffer
}

func startTap(t *testing.T, target string) *tap {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tp := &tap{addr: ln.Addr().String()}
	var wg sync.WaitGroup
	var open []net.Conn
	var openMu sync.Mutex
	wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				_ = in.Close()
				continue
			}
			openMu.Lock()
			open = append(open, in, out)
			openMu.Unlock()
			tc := &tapConn{}
			tp.mu.Lock()
			tp.conns = append(tp.conns, tc)
			tp.mu.Unlock()
			copyTo := func(dst, src net.Conn, keep *bytes.Buffer) {
				buf := make([]byte, 4096)
				for {
					n, err := src.Read(buf)
					if n > 0 {
						tc.mu.Lock()
						keep.Write(buf[:n])
						tc.mu.Unlock()
						_, _ = dst.Write(buf[:n])
					}
					if err != nil {
						_ = dst.Close()
						return
					}
				}
			}
			wg.Go(func() { copyTo(out, in, &tc.sent) })
			wg.Go(func() { copyTo(in, out, &tc.answered) })
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		openMu.Lock()
		for _, c := range open {
			_ = c.Close()
		}
		openMu.Unlock()
		wg.Wait()
	})
	return tp
}

// conn is what the i-th connection's client sent and was answered, so far.
func (tp *tap) conn(i int) (sent, answered []byte) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	if i >= len(tp.conns) {
		return nil, nil
	}
	c := tp.conns[i]
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.sent.Bytes()), bytes.Clone(c.answered.Bytes())
}

// BenchmarkConnect is what a new peer connection costs, handshake
// included: a fresh client pool's first Ping, to completion. It reports
// µs per connection.
func BenchmarkConnect(b *testing.B) {
	srv := startNode(b, "b", "127.0.0.1:0", nil, nil)
	ctx := context.Background()
	start := time.Now()
	for range b.N {
		c := peer.NewClient(peer.ClientConfig{Node: "a", Secret: secret, MaxMessageBytes: 1 << 20})
		if _, err := c.Ping(ctx, "b", srv.addr); err != nil {
			b.Fatal(err)
		}
		_ = c.Close()
	}
	b.ReportMetric(float64(time.Since(start).Microseconds())/float64(b.N), "µs/connection")
}
