package peer

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/internal/flowwin"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// server is the PeerService: the inbound half of the transport. It hands
// what peers send to its receiver, once Transport.Start installed one.
type server struct {
	pb.UnimplementedPeerServiceServer
	cfg  Config
	grpc *grpc.Server
	rcv  atomic.Pointer[receiverBox]
	// router is this node's router: told of every cancel the receiver
	// took, so it ends the job's response leg here (legCancelled).
	router *router

	// mu guards what follows. It is the last lock taken: under router.mu
	// (cancelOnLeg), and by callers that hold an unicastInbox's, a
	// deliveryInbox's or an inLeg's mu; it takes none.
	mu         sync.Mutex
	senders    map[string]*unicastInbox // by sending node id: Posts naming no delivery stream
	deliveries map[deliveryKey]*deliveryInbox
	swept      time.Time // when delivery streams was last swept of forgotten delivery streams
	inLegs     map[inLegKey]*inLeg
	finished   []finishedLeg // done legs in inLegs, oldest first (finishLeg)
	legsSwept  time.Time     // when inLegs was last swept
	epochs     atomic.Uint64 // respondIn.epoch
	// stalledAt is when this process was last seen not to have run for
	// a while (a timer that fired more than two heartbeat intervals late:
	// paused, starved), UnixNano; 0 if never (noteStall).
	stalledAt atomic.Int64
	// orphanWatches are the timers of broken reply streams' legs
	// (watchOrphans).
	orphanWatches map[*time.Timer]struct{}
	stopped       bool // stop began: no stream goroutine starts
	wg            sync.WaitGroup
}

// receiverBox lets an interface value live in an atomic.Pointer.
type receiverBox struct{ r core.Receiver }

var _ pb.PeerServiceServer = (*server)(nil)

// newServer returns a peer server whose every call is authenticated; cfg
// has its defaults.
func newServer(cfg Config) *server {
	a := &authenticator{metrics: cfg.Metrics, versions: newVersionGate(cfg.Metrics, cfg.Logger)}
	s := &server{cfg: cfg, senders: map[string]*unicastInbox{}, deliveries: map[deliveryKey]*deliveryInbox{}, inLegs: map[inLegKey]*inLeg{}, orphanWatches: map[*time.Timer]struct{}{}}
	opts := []grpc.ServerOption{
		serverCreds(cfg),
		serverCodec(),
		grpc.MaxRecvMsgSize(cfg.MaxMessageBytes),
		grpc.MaxSendMsgSize(cfg.MaxMessageBytes),
		grpc.MaxConcurrentStreams(cfg.MaxConcurrentStreams),
		grpc.ChainUnaryInterceptor(a.unary),
		grpc.ChainStreamInterceptor(a.stream),
		// Peers ping every ClientKeepaliveTime even without a call in
		// flight: accept that, with room for timer skew (a server that
		// enforced more than ClientKeepaliveTime would close the
		// connection with "too_many_pings").
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: ServerKeepaliveMinTime, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		// Stop returns once every handler has: a Deliver stream's
		// goroutines never outlive the server.
		grpc.WaitForHandlers(true),
	}
	// Static windows: no PING per burst of data read (flowwin).
	s.grpc = grpc.NewServer(append(opts, flowwin.ServerOptions(cfg.MaxMessageBytes)...)...)
	pb.RegisterPeerServiceServer(s.grpc, s)
	return s
}

// serverCreds are the server's transport credentials: the cluster's
// mutual TLS when the node has it (else plaintext), then the cluster
// handshake (handshake.go), which every connection must pass before a
// call is read. A refused one is counted and logged.
func serverCreds(cfg Config) grpc.ServerOption {
	refusals := &refusalLog{log: cfg.Logger}
	return grpc.Creds(Credentials(CredentialsConfig{
		Secret: cfg.Secret, Node: cfg.Node, TLS: cfg.ServerTLS,
		Refused: func(remote net.Addr, err error) {
			cfg.Metrics.authFailures.Inc()
			refusals.refused(remote, err)
		},
	}))
}

// serve serves on ln until stop; it returns nil after stop.
func (s *server) serve(ln net.Listener) error {
	if err := s.grpc.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// ServerKeepaliveMinTime is the shortest interval between a client's
// keepalive pings the peer server accepts: half the interval peers ping at.
const ServerKeepaliveMinTime = ClientKeepaliveTime / 2

// stop closes the listener and every connection at once, and returns once
// every call's handler and goroutines have.
func (s *server) stop() {
	s.mu.Lock()
	s.stopped = true
	for t := range s.orphanWatches {
		t.Stop()
	}
	clear(s.orphanWatches)
	s.mu.Unlock()
	s.grpc.Stop()
	s.wg.Wait()
}

// Ping answers with this node's id.
func (s *server) Ping(context.Context, *pb.PingRequest) (*pb.PingResponse, error) {
	return &pb.PingResponse{Node: s.cfg.Node}, nil
}

var errNotRouting = status.Error(codes.Unavailable, "node not routing yet")

// receiver is what Transport.Start installed: errNotRouting before.
func (s *server) receiver() (core.Receiver, error) {
	b := s.rcv.Load()
	if b == nil {
		return nil, errNotRouting
	}
	return b.r, nil
}

// Stream bounds, on both streams and both sides.
const (
	// openTimeout bounds the wait for a stream's open frame.
	openTimeout = 10 * time.Second
	// silentIntervals heartbeat intervals without a frame end a stream, on
	// either side.
	silentIntervals = 3
)

// Heartbeat interval bounds a receiver accepts from an open frame.
const (
	minHeartbeat     = time.Millisecond
	maxHeartbeat     = time.Minute
	defaultHeartbeat = time.Second
)

// errStopping ends a stream that arrives once Stop began.
var errStopping = status.Error(codes.Unavailable, "peer server stopping")

// goStream runs f on a goroutine Stop waits for: false once Stop began.
func (s *server) goStream(f func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return false
	}
	s.wg.Go(f)
	return true
}

// heartbeatOf is the heartbeat interval an open frame announces, in ns,
// clamped.
func heartbeatOf(ns int64) time.Duration {
	hb := time.Duration(ns)
	if hb <= 0 {
		return defaultHeartbeat
	}
	return min(max(hb, minHeartbeat), maxHeartbeat)
}

// sweep deletes the entries of m that gone reports, at most once per
// every: *last is when it last did.
func sweep[K comparable, V any](m map[K]V, last *time.Time, every time.Duration, now time.Time, gone func(V) bool) {
	if now.Sub(*last) < every {
		return
	}
	*last = now
	for k, v := range m {
		if gone(v) {
			delete(m, k)
		}
	}
}

// inCall is what a stream handler (Deliver, Respond) keeps of its call:
// the authenticated sender, and ctx, derived from the call's context, which
// the handler cancels with the cause the stream ends for.
type inCall struct {
	s      *server
	from   string
	call   context.Context // the gRPC call's own
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// accept begins a stream handler: the caller must be authenticated and the
// engine started. The handler defers c.cancel(nil).
func (s *server) accept(st grpc.ServerStream) (c inCall, rcv core.Receiver, err error) {
	from, ok := Caller(st.Context())
	if !ok {
		return inCall{}, nil, errUnauthenticated
	}
	if rcv, err = s.receiver(); err != nil {
		return inCall{}, nil, err
	}
	ctx, cancel := context.WithCancelCause(st.Context())
	return inCall{s: s, from: from, call: st.Context(), ctx: ctx, cancel: cancel}, rcv, nil
}

// end is the status the stream ends with once c.ctx is done: the call's own
// end (the client went away), else why c.ctx was cancelled, as a status
// (Unavailable unless it is one already).
func (c *inCall) end() error {
	if err := c.call.Err(); err != nil {
		return status.FromContextError(err).Err()
	}
	err := context.Cause(c.ctx)
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codes.Unavailable, err.Error())
}

// handleMessage hands m to rcv; a cancel then ends the job's response leg on
// this node, if it has one (the engine has marked the binding cancelling,
// so it sends nothing more on it).
func (s *server) handleMessage(rcv core.Receiver, from string, m core.Message) {
	rcv.HandleMessage(from, m)
	if m.Kind == core.MsgCancel {
		s.router.legCancelled(m.JobID, m.Gen)
	}
}
