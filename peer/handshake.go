package peer

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/switchyard/switchyard/core"
)

// The cluster handshake. Every peer connection, before gRPC speaks on it,
// proves on that connection, both ways, that each end holds the cluster
// secret, and names the node at each end:
//
//	client → server  hello:     magic, client's node id, client nonce (32 random bytes)
//	server → client  challenge: magic, server's node id, server nonce, server MAC
//	client → server  proof:     client MAC
//	server → client  verdict:   one byte, 1 accepted
//
// Each MAC is HMAC-SHA256 under the secret of a direction label ("server"
// or "client") and the transcript: both node ids, both nonces and, under
// TLS, 32 bytes exported from the TLS session (RFC 5705/8446 exporter).
// So a MAC is good for one connection only: a new connection has new
// nonces, and a captured exchange replayed on it proves nothing; a MAC of
// one direction cannot be reflected as the other. The client checks the
// server's MAC, and that the server is the node it meant to reach, before
// it proves anything itself: a listener that is not a node of the cluster
// (an address in a record someone wrote) learns a node id and a nonce,
// which are worth nothing. The server takes the client's node id from the
// proof, and handlers take it from the connection (Caller), never from a
// call's metadata.
//
// What it does not do: in plaintext, the channel is not private, and an
// active attacker on the path between two nodes (one who can redirect a
// node's connection for another node to itself) can relay the handshake
// between them and then read and change what follows. Under TLS the
// exported bytes differ on its two connections, so a relay fails; mutual
// TLS from a cluster CA (--peer-tls-*) is the production setup
// (docs/cluster.md, "Trust between nodes").

// handshakeMagic opens the hello and the challenge: a peer that speaks
// anything else (an HTTP/2 preface) is refused on its first bytes.
const handshakeMagic = "SYPEER/1"

// handshakeTimeout bounds a connection's handshake, each side.
const handshakeTimeout = 10 * time.Second

// nonceBytes is the size of each side's nonce, and of the TLS binding.
const nonceBytes = 32

// exporterLabel is the TLS exporter label of the channel binding.
const exporterLabel = "EXPORTER-switchyard-peer-handshake"

// AuthInfo is what a peer connection's handshake established: the node at
// the other end, proven to hold the cluster secret on this very
// connection. It is the credentials.AuthInfo of every peer connection, on
// both sides.
type AuthInfo struct {
	credentials.CommonAuthInfo
	// Node is the other end's node id.
	Node string
	// TLS is the connection's TLS state under mutual TLS; nil in
	// plaintext.
	TLS *tls.ConnectionState
}

// AuthType implements credentials.AuthInfo.
func (AuthInfo) AuthType() string { return "switchyard-peer" }

// CredentialsConfig is one end of peer connections.
type CredentialsConfig struct {
	// Secret is the cluster secret; Node this node's id.
	Secret []byte
	Node   string
	// Peer is, for a client, the node the connection is meant for: a
	// server that proves another id is refused. Empty for a server.
	Peer string
	// TLS is the mutual TLS under the handshake (its client or server
	// side); nil: plaintext.
	TLS *tls.Config
	// Refused, if set, is called with why when a handshake fails (a
	// server counts and logs refused callers).
	Refused func(remote net.Addr, err error)
}

// Credentials returns the gRPC transport credentials of peer connections:
// cfg.TLS's handshake (or none), then the cluster handshake.
func Credentials(cfg CredentialsConfig) credentials.TransportCredentials {
	var base credentials.TransportCredentials
	if cfg.TLS != nil {
		base = credentials.NewTLS(cfg.TLS)
	}
	return &handshakeCreds{cfg: cfg, base: base}
}

type handshakeCreds struct {
	cfg  CredentialsConfig
	base credentials.TransportCredentials // nil: plaintext
}

var _ credentials.TransportCredentials = (*handshakeCreds)(nil)

// Errors of a handshake, as the side that fails it sees them.
var (
	errNotPeer       = errors.New("peer handshake: the other end does not speak the peer protocol")
	errBadProof      = refusal("peer handshake: the other end does not prove the cluster secret (another cluster's node, another secret, or a replay)")
	errRefused       = refusal("peer handshake: refused by the other end: it does not take this node's proof of the cluster secret (another cluster secret?)")
	errBadNodeID     = errors.New("peer handshake: the other end's node id is not a node id")
	errNoTLSExporter = errors.New("peer handshake: the TLS session exports no keying material (TLS 1.3 is required)")
)

// refusalError is a handshake that failed on the cluster secret: no retry
// can pass it while the secrets differ. Its gRPC status is Unauthenticated,
// which a call on the connection ends with (gRPC finds the status through
// its connection error), and which the router takes as final, as it takes
// every refusal of this node's credentials (retry.go). Any other failure
// (the network, a node id other than the one meant: an address the view
// has not caught up with yet) is Unavailable, and retried.
type refusalError struct{ msg string }

func refusal(msg string) error { return &refusalError{msg} }

func (e *refusalError) Error() string { return e.msg }

// GRPCStatus makes the refusal Unauthenticated.
func (e *refusalError) GRPCStatus() *status.Status { return status.New(codes.Unauthenticated, e.msg) }

func (c *handshakeCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, state, level := raw, (*tls.ConnectionState)(nil), credentials.NoSecurity
	if c.base != nil {
		var info credentials.AuthInfo
		var err error
		if conn, info, err = c.base.ClientHandshake(ctx, authority, raw); err != nil {
			return nil, nil, err
		}
		if state, level, err = tlsOf(info); err != nil {
			_ = conn.Close()
			return nil, nil, err
		}
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(handshakeTimeout)
	}
	_ = conn.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	peerNode, err := c.client(conn, state)
	if !stop() && err == nil {
		// ctx ended as the handshake did: the deadline in the past may
		// land after the one lifted below, so the connection is not used.
		err = ctx.Err()
	}
	_ = conn.SetDeadline(time.Time{})
	if err != nil {
		_ = conn.Close()
		if ctx.Err() != nil {
			err = fmt.Errorf("%w: %w", err, ctx.Err())
		}
		return nil, nil, fmt.Errorf("node %s at %s: %w", c.cfg.Peer, authority, err)
	}
	return conn, AuthInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: level}, Node: peerNode, TLS: state}, nil
}

func (c *handshakeCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, state, level := raw, (*tls.ConnectionState)(nil), credentials.NoSecurity
	if c.base != nil {
		var info credentials.AuthInfo
		var err error
		if conn, info, err = c.base.ServerHandshake(raw); err != nil {
			return nil, nil, err
		}
		if state, level, err = tlsOf(info); err != nil {
			_ = conn.Close()
			return nil, nil, err
		}
	}
	_ = conn.SetDeadline(time.Now().Add(handshakeTimeout))
	peerNode, err := c.server(conn, state)
	// gRPC reads the HTTP/2 preface next, then lifts the deadline: the
	// rest of the connection's setup gets a bound too.
	_ = conn.SetDeadline(time.Now().Add(handshakeTimeout))
	if err != nil {
		if c.cfg.Refused != nil {
			c.cfg.Refused(raw.RemoteAddr(), err)
		}
		_ = conn.Close()
		return nil, nil, err
	}
	return conn, AuthInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: level}, Node: peerNode, TLS: state}, nil
}

// tlsOf is the TLS state and security level of the base handshake's
// AuthInfo.
func tlsOf(info credentials.AuthInfo) (*tls.ConnectionState, credentials.SecurityLevel, error) {
	ti, ok := info.(credentials.TLSInfo)
	if !ok {
		return nil, 0, fmt.Errorf("peer handshake: the transport under it is %s, not TLS", info.AuthType())
	}
	return &ti.State, ti.SecurityLevel, nil
}

// client runs the client's half on conn, and returns the server's node id.
func (c *handshakeCreds) client(conn net.Conn, state *tls.ConnectionState) (string, error) {
	binding, err := channelBinding(state)
	if err != nil {
		return "", err
	}
	nonce := randomNonce()
	if _, err := conn.Write(appendHello(nil, c.cfg.Node, nonce)); err != nil {
		return "", err
	}
	peerNode, peerNonce, err := readHello(conn)
	if err != nil {
		return "", err
	}
	t := transcript(c.cfg.Node, nonce, peerNode, peerNonce, binding)
	var mac [sha256.Size]byte
	if _, err := io.ReadFull(conn, mac[:]); err != nil {
		return "", err
	}
	if !hmac.Equal(mac[:], c.mac(labelServer, t)) {
		return "", errBadProof
	}
	if peerNode != c.cfg.Peer {
		return "", fmt.Errorf("peer handshake: the other end is node %q, not %q", peerNode, c.cfg.Peer)
	}
	if _, err := conn.Write(c.mac(labelClient, t)); err != nil {
		return "", err
	}
	var verdict [1]byte
	if _, err := io.ReadFull(conn, verdict[:]); err != nil || verdict[0] != 1 {
		return "", errRefused
	}
	return peerNode, nil
}

// server runs the server's half on conn, and returns the client's node
// id.
func (c *handshakeCreds) server(conn net.Conn, state *tls.ConnectionState) (string, error) {
	binding, err := channelBinding(state)
	if err != nil {
		return "", err
	}
	peerNode, peerNonce, err := readHello(conn)
	if err != nil {
		return "", fmt.Errorf("hello: %w", err)
	}
	nonce := randomNonce()
	t := transcript(peerNode, peerNonce, c.cfg.Node, nonce, binding)
	if _, err := conn.Write(append(appendHello(nil, c.cfg.Node, nonce), c.mac(labelServer, t)...)); err != nil {
		return "", err
	}
	var mac [sha256.Size]byte
	if _, err := io.ReadFull(conn, mac[:]); err != nil {
		return "", fmt.Errorf("node %q sent no proof (it did not take this node's: another secret?): %w", peerNode, err)
	}
	if !hmac.Equal(mac[:], c.mac(labelClient, t)) {
		_, _ = conn.Write([]byte{0})
		return "", errBadProof
	}
	if _, err := conn.Write([]byte{1}); err != nil {
		return "", err
	}
	return peerNode, nil
}

// Direction labels: a MAC one side makes is never the other side's.
const (
	labelServer = "switchyard peer handshake v1: server"
	labelClient = "switchyard peer handshake v1: client"
)

func (c *handshakeCreds) mac(label string, transcript []byte) []byte {
	m := hmac.New(sha256.New, c.cfg.Secret)
	m.Write([]byte(label))
	m.Write([]byte{0})
	m.Write(transcript)
	return m.Sum(nil)
}

// transcript is what both MACs cover: the client's id and nonce, the
// server's, and the channel binding, each length-prefixed.
func transcript(clientNode string, clientNonce []byte, serverNode string, serverNonce, binding []byte) []byte {
	b := make([]byte, 0, 4+len(clientNode)+len(serverNode)+2*nonceBytes+len(binding))
	for _, part := range [][]byte{[]byte(clientNode), clientNonce, []byte(serverNode), serverNonce, binding} {
		b = append(b, byte(len(part)))
		b = append(b, part...)
	}
	return b
}

// channelBinding is 32 bytes exported from a TLS session (nil in
// plaintext): the same at both ends of one TLS connection, different on
// any other.
func channelBinding(state *tls.ConnectionState) ([]byte, error) {
	if state == nil {
		return nil, nil
	}
	b, err := state.ExportKeyingMaterial(exporterLabel, nil, nonceBytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errNoTLSExporter, err)
	}
	return b, nil
}

// appendHello appends a hello (or a challenge's first part): the magic,
// node's id, and nonce.
func appendHello(b []byte, node string, nonce []byte) []byte {
	b = append(b, handshakeMagic...)
	b = append(b, byte(len(node)))
	b = append(b, node...)
	return append(b, nonce...)
}

// readHello reads what appendHello wrote: a node id that is a valid one,
// and a nonce.
func readHello(r io.Reader) (node string, nonce []byte, err error) {
	var head [len(handshakeMagic) + 1]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return "", nil, err
	}
	if string(head[:len(handshakeMagic)]) != handshakeMagic {
		return "", nil, errNotPeer
	}
	rest := make([]byte, int(head[len(handshakeMagic)])+nonceBytes)
	if _, err := io.ReadFull(r, rest); err != nil {
		return "", nil, err
	}
	node = string(rest[:len(rest)-nonceBytes])
	if !core.ValidName(node) {
		return "", nil, errBadNodeID
	}
	return node, rest[len(rest)-nonceBytes:], nil
}

func randomNonce() []byte {
	b := make([]byte, nonceBytes)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return b
}

func (c *handshakeCreds) Info() credentials.ProtocolInfo {
	if c.base != nil {
		return c.base.Info()
	}
	return credentials.ProtocolInfo{SecurityProtocol: "insecure"}
}

func (c *handshakeCreds) Clone() credentials.TransportCredentials {
	cc := *c
	if c.base != nil {
		cc.base = c.base.Clone()
	}
	return &cc
}

// OverrideServerName is deprecated in gRPC and unused here.
func (c *handshakeCreds) OverrideServerName(string) error { return nil }

// refusalLog logs refused handshakes at most once per refusalLogEvery,
// with how many were refused in between: whoever probes the peer port
// must not fill the log.
type refusalLog struct {
	log     *slog.Logger
	last    atomic.Int64 // unix nanos of the last line
	skipped atomic.Int64
}

const refusalLogEvery = 10 * time.Second

func (l *refusalLog) refused(remote net.Addr, err error) {
	now := time.Now().UnixNano()
	last := l.last.Load()
	if now-last < int64(refusalLogEvery) || !l.last.CompareAndSwap(last, now) {
		l.skipped.Add(1)
		return
	}
	l.log.Warn("peer handshake refused: the caller did not prove the cluster secret on its connection",
		"remote", remote.String(), "err", err, "refused_since_last_line", l.skipped.Swap(0))
}
