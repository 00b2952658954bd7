package grpctest

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"sync"
)

// http2Preface opens what an HTTP/2 client writes, before its first frame.
const http2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// bdpPingData is the payload of the PINGs gRPC-Go's bandwidth-delay
// estimator sends (internal/transport/bdp_estimator.go): keepalive PINGs
// carry zeros, so the payload tells the two apart.
var bdpPingData = []byte{2, 4, 16, 16, 9, 14, 7, 7}

// Frames counts the HTTP/2 frames on the client connections dialled
// through its Dial (grpc.WithContextDialer(f.Dial)), each direction parsed
// from the bytes it carries.
//
// The HTTP/2 must be in the clear, but it may follow a handshake of any
// length in either direction, as transport credentials that run one
// before HTTP/2 (the cluster's peer handshake) write and read it on the
// dialled connection. Each direction is counted from where HTTP/2 begins
// (RFC 9113, section 3.4): the client's bytes after its preface, the
// first 24 bytes equal to it; the server's from its first frame, which
// must be a SETTINGS frame: the first nine bytes that are such a frame's
// header (type 4, no flags, stream 0, a length that is a multiple of 6
// and under 64 KiB). A handshake of random and text bytes holds a false
// one of either only by a chance under 2^-58 at each byte. Under TLS the
// frames are sealed, and nothing is counted.
type Frames struct {
	mu         sync.Mutex
	sent, recv Counts // written and read by the clients
}

// Counts are frames seen in one direction.
type Counts struct {
	// Frames of every type, and DATA frames among them.
	Frames, Data int
	// BDPPings are PINGs (not acks) carrying the bandwidth-delay
	// estimator's payload.
	BDPPings int
	// Skipped are the bytes before the first frame: a handshake's, and
	// the client's preface.
	Skipped int
}

// Sent is what the client wrote; Received what it read.
func (f *Frames) Sent() Counts     { f.mu.Lock(); defer f.mu.Unlock(); return f.sent }
func (f *Frames) Received() Counts { f.mu.Lock(); defer f.mu.Unlock(); return f.recv }

// Dial dials addr over TCP and counts what the connection carries.
func (f *Frames) Dial(ctx context.Context, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &countedConn{Conn: c, f: f, sent: frameScan{begin: afterPreface, hold: len(http2Preface) - 1},
		recv: frameScan{begin: atSettings, hold: frameHeader - 1}}, nil
}

type countedConn struct {
	net.Conn
	f          *Frames
	sent, recv frameScan // under f.mu
}

func (c *countedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.f.mu.Lock()
	c.recv.feed(p[:n], &c.f.recv)
	c.f.mu.Unlock()
	return n, err
}

func (c *countedConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.f.mu.Lock()
	c.sent.feed(p[:n], &c.f.sent)
	c.f.mu.Unlock()
	return n, err
}

// frameHeader is an HTTP/2 frame header's size: a 24-bit length, type,
// flags, stream id.
const frameHeader = 9

// frameScan parses one direction of a connection into HTTP/2 frames, once
// it found where they begin.
type frameScan struct {
	// begin is the offset in b of the first frame, or -1 if b does not
	// show it yet.
	begin func(b []byte) int
	// hold is how many bytes at the end of one that does not show it may
	// be the start of what shows it.
	hold  int
	begun bool
	buf   []byte // an incomplete frame, or the bytes still searched for begin
}

// feed adds p to the direction's bytes and counts the frames completed in n.
func (s *frameScan) feed(p []byte, n *Counts) {
	s.buf = append(s.buf, p...)
	if !s.begun {
		i := s.begin(s.buf)
		if i < 0 {
			drop := max(len(s.buf)-s.hold, 0)
			n.Skipped += drop
			s.buf = append(s.buf[:0], s.buf[drop:]...)
			return
		}
		n.Skipped += i
		s.buf, s.begun = s.buf[i:], true
	}
	for len(s.buf) >= frameHeader {
		size := int(s.buf[0])<<16 | int(binary.BigEndian.Uint16(s.buf[1:3]))
		if len(s.buf) < frameHeader+size {
			return
		}
		typ, flags, payload := s.buf[3], s.buf[4], s.buf[frameHeader:frameHeader+size]
		n.Frames++
		switch {
		case typ == 0x0: // DATA
			n.Data++
		case typ == 0x6 && flags&0x1 == 0 && bytes.Equal(payload, bdpPingData): // PING, not an ack
			n.BDPPings++
		}
		s.buf = s.buf[frameHeader+size:]
	}
}

// afterPreface is the offset just past the client preface in b, or -1.
func afterPreface(b []byte) int {
	i := bytes.Index(b, []byte(http2Preface))
	if i < 0 {
		return -1
	}
	return i + len(http2Preface)
}

// atSettings is the offset of the first header in b of a SETTINGS frame
// that may be the server's preface, or -1.
func atSettings(b []byte) int {
	for i := 0; i+frameHeader <= len(b); i++ {
		h := b[i : i+frameHeader]
		size := int(h[1])<<8 | int(h[2])
		if h[0] == 0 && size%6 == 0 && h[3] == 0x4 && h[4] == 0 && binary.BigEndian.Uint32(h[5:9]) == 0 {
			return i
		}
	}
	return -1
}
