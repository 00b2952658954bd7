package peer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/switchyard/switchyard/core"
)

// Config is what a node's peer transport needs: its identity and
// credentials, its limits, where other nodes are, and its timings.
type Config struct {
	// Node is this node's id: presented on every call, answered by Ping.
	Node string
	// Secret is the cluster secret every caller must prove it holds (at
	// least MinSecretBytes).
	Secret []byte
	// ServerTLS and ClientTLS, when set, are the cluster's mutual TLS:
	// the server requires a client certificate (the node checks it is of
	// the cluster CA) and every call to a peer presents this node's. Both
	// or neither; nil: plaintext.
	ServerTLS, ClientTLS *tls.Config
	// MaxMessageBytes bounds one call or stream frame, both ways, as the
	// peers' own limit does (node config; default 4 MiB).
	MaxMessageBytes int
	// MaxConcurrentStreams bounds the calls in flight on one incoming
	// connection, Deliver streams included (one per delivery stream, that
	// is per (sending node, queue) with recent traffic) and Respond streams
	// (one reply stream per sending node): set it well above the number of
	// queues one peer may be sending for at once (0: unlimited).
	MaxConcurrentStreams uint32
	// MaxReconnectDelay caps gRPC's reconnect backoff, so a peer that comes
	// back is reached again within about this long (default 5s).
	MaxReconnectDelay time.Duration
	// Dialer, if set, makes the connections to peers (ClientConfig.Dialer);
	// nil: TCP.
	Dialer func(ctx context.Context, addr string) (net.Conn, error)

	// Addr resolves a node id to its peer address; false when the catalog
	// view has no record of the node: its lease is gone, it is dead.
	// Required.
	Addr func(node string) (string, bool)
	// Zone is a node's zone label in the catalog view; false when the node
	// has no record, or a record without a zone. A zone-scoped delivery
	// goes only to a node whose zone is known and is the job's (an
	// unlabelled node is not in any zone: treating "no label" as "same
	// zone" is the leak zoning exists to prevent). Nil: no node has a zone.
	Zone func(node string) (string, bool)
	// Incarnation is a node's incarnation in the catalog view: "" when the
	// view has no record of it (or a record without one). A job sent to a
	// node (a forward, a deliver) is stamped with it when it is queued for
	// that node, and dropped before it is sent or resent once the view
	// names another (incarnation.go). Send calls it with the engine's lock
	// held: it must be quick, must not block and must not call the engine.
	// Nil: jobs carry no stamp.
	Incarnation func(node string) string
	// Self is this node's incarnation now (catalog.Catalog.Incarnation): a
	// job stamped for another one is dropped on arrival and counted. Nil,
	// or "": every job is taken.
	Self func() string

	// AttemptTimeout bounds one Forward or Post attempt (default 10s), so a
	// peer that stopped answering without closing its connection is tried
	// again rather than waited on.
	AttemptTimeout time.Duration
	// RetryMin and RetryMax bound the backoff between attempts (default
	// 50ms and 2s): it doubles from RetryMin up to RetryMax, with jitter.
	RetryMin, RetryMax time.Duration
	// IdleTimeout is how long a node's unicast queue sender (releases and ends
	// with no response leg open) waits for a new message before it exits
	// (default 30s); the next Send to that node starts another. Response legs
	// never idle out: they end with their job.
	IdleTimeout time.Duration
	// StreamIdle is how long a delivery stream (one node, one queue) may
	// send nothing, with nothing unacked, before its Deliver stream is
	// closed and its goroutine exits, and how long a reply stream may carry
	// no leg before it is closed (default 30s); the next message starts
	// them again. It must be at least 3 × AckTimeoutCeiling (else
	// ErrStreamIdleTooShort), so a stall is diagnosed long before an idle
	// close could hide it.
	StreamIdle time.Duration
	// AckTimeout is how long the receiver may take to ack a delivery stream
	// message sent on a stream, counted from when it was sent or the
	// message before it was acked, whichever is later. Missing it drops the
	// stream for the unary path. The node passes a fraction of the job's
	// remaining TTL for forward and deliver (core.DispatchTimeout) and the
	// ceiling for kinds without a TTL. Results are clamped to
	// AckTimeoutCeiling; a non-positive one means the ceiling. Nil: the
	// ceiling for every message. Send calls it with the engine's lock held:
	// it must be quick and must not call the engine.
	AckTimeout func(m core.Message) time.Duration
	// AckTimeoutCeiling bounds AckTimeout, and how long opening a stream
	// may take (default 5s).
	AckTimeoutCeiling time.Duration
	// Heartbeat is how often each end of a Deliver or Respond stream sends
	// a frame when it has nothing else to send (default 1s). A stream that
	// receives nothing for three intervals is dropped (a response leg's
	// ingress fails the job), so three intervals must be shorter than
	// ClientKeepaliveTime (else ErrHeartbeatTooLong).
	Heartbeat time.Duration
	// ForceUnary sends every delivery stream message by unary Post and
	// Forward calls, and every reply and release by the node's unicast
	// queue, with no Deliver or Respond stream: a benchmark baseline, and
	// an operator's switch should streams misbehave. A job's grants of
	// output credit then go by its queue's delivery stream.
	ForceUnary bool
	// Figures reads this node's live figures, for a peer's cluster view
	// (the Figures call); nil answers Figures Unavailable. It is called on
	// a gRPC handler's goroutine and must not block.
	Figures func() core.NodeFigures
	// Suspect, if set, is told of the transport's evidence that a node is
	// gone: a reply stream from it broke and no new one took up its legs
	// within a heartbeat (a live host reopens one within milliseconds),
	// or its response legs went silent. It is the peer tracker's Suspect. It
	// is called holding none of the transport's locks and must not block.
	Suspect func(node string)

	Metrics *Metrics
	Logger  *slog.Logger
}

// minIdleFactor: StreamIdle must be at least this many ack timeout
// ceilings.
const minIdleFactor = 3

// withDefaults is c with every unset tunable set, or the first setting
// that cannot work.
func (c Config) withDefaults() (Config, error) {
	if len(c.Secret) < MinSecretBytes {
		return c, &core.ConfigError{Field: "cluster-secret", Value: "(hidden)", Err: errors.New("must be at least 16 bytes")}
	}
	if c.Addr == nil {
		return c, errors.New("peer: Config.Addr is required")
	}
	if (c.ServerTLS == nil) != (c.ClientTLS == nil) {
		return c, errors.New("peer: Config.ServerTLS and ClientTLS go together")
	}
	if c.MaxMessageBytes <= 0 {
		c.MaxMessageBytes = defaultMaxMessageBytes
	}
	if c.AttemptTimeout <= 0 {
		c.AttemptTimeout = 10 * time.Second
	}
	if c.RetryMin <= 0 {
		c.RetryMin = 50 * time.Millisecond
	}
	if c.RetryMax < c.RetryMin {
		c.RetryMax = max(2*time.Second, c.RetryMin)
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 30 * time.Second
	}
	if c.AckTimeoutCeiling <= 0 {
		c.AckTimeoutCeiling = 5 * time.Second
	}
	if c.StreamIdle <= 0 {
		c.StreamIdle = 30 * time.Second
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = time.Second
	}
	if c.StreamIdle < minIdleFactor*c.AckTimeoutCeiling {
		return c, &core.ConfigError{Field: "peer-stream-idle", Value: c.StreamIdle,
			Err: fmt.Errorf("%w: at least %d × %s", ErrStreamIdleTooShort, minIdleFactor, c.AckTimeoutCeiling)}
	}
	if silentIntervals*c.Heartbeat >= ClientKeepaliveTime {
		return c, &core.ConfigError{Field: "peer-heartbeat-interval", Value: c.Heartbeat,
			Err: fmt.Errorf("%w: %d intervals must be under %s", ErrHeartbeatTooLong, silentIntervals, ClientKeepaliveTime)}
	}
	if c.Metrics == nil {
		c.Metrics = NewMetrics(nil)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c, nil
}

// Transport is a node's peer transport: the PeerService server on its
// --peer-addr (inbound), the router that sends to other nodes' servers
// (outbound), and the client pool the router and the Tracker share. It is
// core.Transport; what peers send goes to the core.Receiver given to
// Start.
//
// Lifecycle: New builds it from its Config alone; Serve serves the
// listener (Ping answers at once, routing calls are refused Unavailable
// until Start); Start hands it the engine, and routing begins; Close stops
// it all.
//
// Its core.Transport methods are written where their work is done: Forward
// with the delivery streams that carry it (delivery_send.go), Send and
// Expect with the response legs (leg_send.go); ZonesChanged with the zone
// test (delivery_zone.go).
type Transport struct {
	client *Client
	srv    *server
	rt     *router
}

var _ core.Transport = (*Transport)(nil)

// New returns a node's transport. It starts goroutines only as calls come
// in and messages are sent; Close stops them.
func New(cfg Config) (*Transport, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	client := NewClient(ClientConfig{Node: cfg.Node, Secret: cfg.Secret, TLS: cfg.ClientTLS, MaxMessageBytes: cfg.MaxMessageBytes, MaxReconnectDelay: cfg.MaxReconnectDelay, Activity: cfg.Metrics.activity,
		IdleTimeout: activeRounds * cfg.Heartbeat, Dialer: cfg.Dialer})
	srv, rt := newServer(cfg), newRouter(cfg, client)
	// Cancels cross between them: one for a job whose response leg the
	// server holds goes back on that leg, and one the server's receiver
	// took by any path ends the job's response leg the router holds here.
	srv.router, rt.srv = rt, srv
	return &Transport{client: client, srv: srv, rt: rt}, nil
}

// Start hands the transport its receiver (the node's engine): from now on
// the routing calls peers make are handed to it, and so are this node's
// own undeliverable messages and the cancels that come back on its reply
// legs. Before Start the routing calls are refused Unavailable (peers
// retry) and Ping already answers. Call it once.
func (t *Transport) Start(rcv core.Receiver) {
	if rcv == nil {
		panic("peer: Start with a nil receiver")
	}
	if !t.srv.rcv.CompareAndSwap(nil, &receiverBox{rcv}) {
		panic("peer: Start called twice")
	}
}

// Serve serves the PeerService on ln until Close; it returns nil after
// Close.
func (t *Transport) Serve(ln net.Listener) error { return t.srv.serve(ln) }

// Close stops the server (every call's handler and goroutines have
// returned when it does), then the router (messages still queued or
// unacked are dropped and counted; Forward calls in flight fail with
// ErrClosed; later Sends are dropped and counted), then the client pool.
// A router goroutine may be in the receiver when Close begins, so Close
// must not be called with the engine's lock held.
func (t *Transport) Close() error {
	t.srv.stop()
	t.rt.close()
	return t.client.Close()
}

// Client is the transport's connection pool, for the Tracker's pings.
func (t *Transport) Client() *Client { return t.client }
