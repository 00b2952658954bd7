package grpctest

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"slices"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Handshake bytes that look like the start of HTTP/2 and are not: the
// client's a preface cut short, the server's a SETTINGS ack and a
// SETTINGS frame on a stream, neither of which opens a server's HTTP/2.
var (
	clientHello = slices.Concat([]byte("SYPEER/1\x02n1"), []byte(http2Preface[:16]), []byte("nonce and proof"))
	serverHello = slices.Concat([]byte("SYPEER/1\x02n2"), frame(0x4, 0x1, 0, nil), frame(0x4, 0, 1, make([]byte, 6)), []byte("proof\x01"))
)

// The scan counts each direction's frames from where its HTTP/2 begins,
// whatever bytes came before and however the reads and writes cut them.
func TestFrameScan(t *testing.T) {
	clientFrames := slices.Concat([]byte(http2Preface),
		frame(0x4, 0, 0, nil),             // SETTINGS
		frame(0x0, 0, 1, []byte("hello")), // DATA
		frame(0x6, 0, 0, bdpPingData),     // a bandwidth PING
		frame(0x6, 0x1, 0, bdpPingData),   // its ack, not one
		frame(0x6, 0, 0, make([]byte, 8)), // a keepalive PING
		frame(0x0, 0x1, 1, nil))           // DATA, END_STREAM
	serverFrames := slices.Concat(
		frame(0x4, 0, 0, make([]byte, 12)),    // SETTINGS, two of them
		frame(0x8, 0, 0, []byte{0, 0, 1, 0}),  // WINDOW_UPDATE
		frame(0x0, 0, 1, make([]byte, 70000)), // DATA, larger than any read
		frame(0x6, 0, 0, bdpPingData))         // a bandwidth PING
	wantSent := Counts{Frames: 6, Data: 2, BDPPings: 1}
	wantRecv := Counts{Frames: 4, Data: 1, BDPPings: 1}
	for _, hs := range []struct {
		name           string
		client, server []byte
	}{
		{"plain", nil, nil},
		{"after a handshake", clientHello, serverHello},
	} {
		for _, chunk := range []int{1, 5, 9, 4096, 1 << 20} {
			var sent, recv Counts
			scan(frameScan{begin: afterPreface, hold: len(http2Preface) - 1}, slices.Concat(hs.client, clientFrames), chunk, &sent)
			scan(frameScan{begin: atSettings, hold: frameHeader - 1}, slices.Concat(hs.server, serverFrames), chunk, &recv)
			ws, wr := wantSent, wantRecv
			ws.Skipped, wr.Skipped = len(hs.client)+len(http2Preface), len(hs.server)
			if sent != ws || recv != wr {
				t.Errorf("%s, in %d-byte pieces: sent %+v, received %+v; want %+v, %+v", hs.name, chunk, sent, recv, ws, wr)
			}
		}
	}
}

// Over a real gRPC connection with the default (dynamic) windows, the
// count sees each side's bandwidth PINGs and DATA frames, with a handshake
// before HTTP/2 as without.
func TestFramesCountAfterHandshake(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, tc := range []struct {
		name  string
		creds credentials.TransportCredentials
		// the bytes before each direction's first frame
		skipSent, skipRecv int
	}{
		{"plain", insecure.NewCredentials(), len(http2Preface), 0},
		{"after a handshake", handshakeCreds{}, len(clientHello) + len(http2Preface), len(serverHello)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := grpc.NewServer(grpc.Creds(tc.creds))
			healthpb.RegisterHealthServer(srv, health.NewServer())
			var f Frames
			c := healthpb.NewHealthClient(Dial(t, Serve(t, srv), grpc.WithTransportCredentials(tc.creds), grpc.WithContextDialer(f.Dial)))
			for range 3 {
				if _, err := c.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
					t.Fatal(err)
				}
			}
			// The server's PING for a request's DATA is queued before its
			// response, so the client has read it; the client's for the
			// first response before the next request, so it has written it.
			sent, recv := f.Sent(), f.Received()
			if sent.Skipped != tc.skipSent || sent.Data < 3 || sent.BDPPings == 0 {
				t.Errorf("sent %+v; want %d bytes skipped, at least 3 DATA frames and a bandwidth PING", sent, tc.skipSent)
			}
			if recv.Skipped != tc.skipRecv || recv.Data < 3 || recv.BDPPings == 0 {
				t.Errorf("received %+v; want %d bytes skipped, at least 3 DATA frames and a bandwidth PING", recv, tc.skipRecv)
			}
		})
	}
}

// scan feeds b to s in pieces of chunk bytes, counting into n.
func scan(s frameScan, b []byte, chunk int, n *Counts) {
	for len(b) > 0 {
		k := min(chunk, len(b))
		s.feed(b[:k], n)
		b = b[k:]
	}
}

// frame is an HTTP/2 frame.
func frame(typ, flags byte, stream uint32, payload []byte) []byte {
	h := []byte{byte(len(payload) >> 16), byte(len(payload) >> 8), byte(len(payload)), typ, flags, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(h[5:], stream)
	return append(h, payload...)
}

// handshakeCreds run a handshake before HTTP/2, as the cluster's peer
// handshake does: the client writes clientHello, the server reads it and
// writes serverHello, the client reads that.
type handshakeCreds struct{}

type handshakeInfo struct{ credentials.CommonAuthInfo }

func (handshakeInfo) AuthType() string { return "test-handshake" }

func (handshakeCreds) ClientHandshake(_ context.Context, _ string, c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if _, err := c.Write(clientHello); err != nil {
		return nil, nil, err
	}
	return c, handshakeInfo{}, expect(c, serverHello)
}

func (handshakeCreds) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if err := expect(c, clientHello); err != nil {
		return nil, nil, err
	}
	_, err := c.Write(serverHello)
	return c, handshakeInfo{}, err
}

// expect reads want from r.
func expect(r io.Reader, want []byte) error {
	got := make([]byte, len(want))
	if _, err := io.ReadFull(r, got); err != nil {
		return err
	}
	if !slices.Equal(got, want) {
		return io.ErrUnexpectedEOF
	}
	return nil
}

func (handshakeCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "test-handshake"}
}
func (c handshakeCreds) Clone() credentials.TransportCredentials { return c }
func (handshakeCreds) OverrideServerName(string) error           { return nil }
