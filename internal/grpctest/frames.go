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
// through its Dial (grpc.WithContextDialer(f.Dial), plaintext only), each
// direction parsed from the bytes it carries.
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
	return &countedConn{Conn: c, f: f, sent: frameScan{skip: len(http2Preface)}}, nil
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

// frameScan parses one direction of a connection into HTTP/2 frames: a
// 9-byte header (24-bit length, type, flags, stream id), then the payload.
type frameScan struct {
	skip int    // preface bytes still to pass over
	buf  []byte // an incomplete frame
}

// feed adds p to the direction's bytes and counts the frames completed in n.
func (s *frameScan) feed(p []byte, n *Counts) {
	if s.skip > 0 {
		k := min(s.skip, len(p))
		s.skip -= k
		p = p[k:]
	}
	s.buf = append(s.buf, p...)
	for len(s.buf) >= 9 {
		size := int(s.buf[0])<<16 | int(binary.BigEndian.Uint16(s.buf[1:3]))
		if len(s.buf) < 9+size {
			return
		}
		typ, flags, payload := s.buf[3], s.buf[4], s.buf[9:9+size]
		n.Frames++
		switch {
		case typ == 0x0: // DATA
			n.Data++
		case typ == 0x6 && flags&0x1 == 0 && bytes.Equal(payload, bdpPingData): // PING, not an ack
			n.BDPPings++
		}
		s.buf = s.buf[9+size:]
	}
}
