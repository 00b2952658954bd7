package peer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/keepalive"

	"github.com/switchyard/switchyard/internal/flowwin"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// Client keepalive: a peer connection that carries nothing is still probed,
// so a peer that vanished without a FIN is noticed.
const (
	ClientKeepaliveTime    = 10 * time.Second
	ClientKeepaliveTimeout = 5 * time.Second
)

// defaultMaxMessageBytes is gRPC's own default message limit, used when a
// config leaves it 0 (gRPC would read 0 as "nothing may be received").
const defaultMaxMessageBytes = 4 << 20

// ClientConfig is what a node's client pool needs.
type ClientConfig struct {
	// Node is this node's id, presented on every call.
	Node   string
	Secret []byte
	// TLS, when set, is the client side of the cluster's mutual TLS; nil:
	// plaintext.
	TLS *tls.Config
	// MaxMessageBytes bounds messages both ways, from node config (default
	// 4 MiB). It must match the peers' servers' limit.
	MaxMessageBytes int
	// MaxReconnectDelay caps gRPC's reconnect backoff, so a peer that comes
	// back is reached again within about this long (default 5s).
	MaxReconnectDelay time.Duration
	// Activity, if set, records the traffic of every call but pings and
	// Figures calls (Activity).
	Activity *Activity
	// IdleTimeout closes a connection that carried no call and no stream
	// this long (gRPC's idle mode); the next call dials again. A node
	// keeps busy only the connections to the peers it works with (the
	// tracker pings those every heartbeat), so one to a node it has no
	// business with goes, with its keepalives. 0: gRPC's default (30m).
	IdleTimeout time.Duration
	// Dialer, if set, makes the pool's network connections, each to a
	// peer's host:port, beneath the handshake and TLS: for tests that
	// watch a peer connection's bytes, and for users who route peer
	// traffic through something of their own. nil: TCP.
	Dialer func(ctx context.Context, addr string) (net.Conn, error)
}

// Client is a pool of connections, one per peer address, each created on
// first use. Each connection is for one node: its handshake refuses a
// server that proves another id (handshake.go). It is safe for concurrent
// use.
type Client struct {
	cfg     ClientConfig
	version grpc.DialOption

	mu     sync.Mutex
	conns  map[string]nodeConn // by address
	closed bool
}

// nodeConn is a pooled connection and the node it is for.
type nodeConn struct {
	node string
	cc   *grpc.ClientConn
}

// ErrClosed is returned by a Client after Close.
var ErrClosed = errors.New("peer client closed")

// NewClient returns an empty pool.
func NewClient(cfg ClientConfig) *Client {
	if cfg.MaxReconnectDelay <= 0 {
		cfg.MaxReconnectDelay = 5 * time.Second
	}
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = defaultMaxMessageBytes
	}
	return &Client{cfg: cfg, version: grpc.WithPerRPCCredentials(newVersionCreds()), conns: map[string]nodeConn{}}
}

// Conn returns the pool's connection to node at addr, creating it if
// needed; one to addr made for another node (a node that took over the
// address) is closed and replaced. It does not dial: the connection is
// made by the first call.
func (c *Client) Conn(node, addr string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	if nc, ok := c.conns[addr]; ok {
		if nc.node == node {
			return nc.cc, nil
		}
		_ = nc.cc.Close() // does not block: it only starts the teardown
		delete(c.conns, addr)
	}
	bo := backoff.DefaultConfig
	bo.BaseDelay = min(bo.BaseDelay, c.cfg.MaxReconnectDelay)
	bo.MaxDelay = c.cfg.MaxReconnectDelay
	transport := Credentials(CredentialsConfig{Secret: c.cfg.Secret, Node: c.cfg.Node, Peer: node, TLS: c.cfg.TLS})
	opts := c.cfg.Activity.dialOptions(node)
	if c.cfg.IdleTimeout > 0 {
		opts = append(opts, grpc.WithIdleTimeout(c.cfg.IdleTimeout))
	}
	if c.cfg.Dialer != nil {
		opts = append(opts, grpc.WithContextDialer(c.cfg.Dialer))
	}
	opts = append(opts,
		grpc.WithTransportCredentials(transport),
		c.version,
		// The router resends what a failed call carried itself, in order (a
		// delivery stream's fallback, delivery_stall.go; a response leg's
		// connect, leg_send.go); gRPC's transparent retry would only buffer
		// every message of every stream for a replay it never needs.
		grpc.WithDisableRetry(),
		grpc.WithDefaultCallOptions(callCodec(), grpc.MaxCallRecvMsgSize(c.cfg.MaxMessageBytes), grpc.MaxCallSendMsgSize(c.cfg.MaxMessageBytes)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: ClientKeepaliveTime, Timeout: ClientKeepaliveTimeout, PermitWithoutStream: true}),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bo, MinConnectTimeout: 5 * time.Second}),
	)
	// Static windows: no PING per burst of data read (flowwin).
	opts = append(opts, flowwin.DialOptions(c.cfg.MaxMessageBytes)...)
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("peer %s: %w", addr, err)
	}
	c.conns[addr] = nodeConn{node: node, cc: cc}
	return cc, nil
}

// Ping calls Ping on node at addr and returns the id it answered with.
func (c *Client) Ping(ctx context.Context, node, addr string) (string, error) {
	cc, err := c.Conn(node, addr)
	if err != nil {
		return "", err
	}
	res, err := pb.NewPeerServiceClient(cc).Ping(ctx, &pb.PingRequest{})
	if err != nil {
		return "", err
	}
	return res.GetNode(), nil
}

// Retain closes the connections to every address not in keep: peers that
// left the catalog, or moved.
func (c *Client) Retain(keep map[string]bool) {
	c.mu.Lock()
	var drop []*grpc.ClientConn
	for addr, nc := range c.conns {
		if !keep[addr] {
			drop = append(drop, nc.cc)
			delete(c.conns, addr)
		}
	}
	c.mu.Unlock()
	for _, cc := range drop {
		_ = cc.Close()
	}
}

// Close closes every connection; later calls fail with ErrClosed.
func (c *Client) Close() error {
	c.mu.Lock()
	conns := c.conns
	c.conns, c.closed = nil, true
	c.mu.Unlock()
	var errs []error
	for _, nc := range conns {
		errs = append(errs, nc.cc.Close())
	}
	return errors.Join(errs...)
}
