package peer

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/switchyard/switchyard/core"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// ServerConfig is what a peer server needs from its node.
type ServerConfig struct {
	// Node is this node's id, returned by Ping.
	Node string
	// Secret is the cluster secret every caller must prove it holds.
	Secret []byte
	// gRPC limits, from node config. MaxMessageBytes bounds messages both
	// ways (default 4 MiB). MaxConcurrentStreams bounds the calls in flight
	// on one connection, Deliver streams included (one per lane, that is
	// per (sending node, queue) with recent traffic) and Respond streams
	// (one per job whose worker on the sending node has streamed a reply
	// and not ended): set it well above the number of queues plus running
	// jobs one peer may be sending for at once (0: unlimited). A host that
	// reaches it waits to open a job's reply leg until another ends.
	MaxMessageBytes      int
	MaxConcurrentStreams uint32
	Metrics              *Metrics
	// Handler receives the routing calls. Nil: they are answered
	// Unavailable until SetHandler installs one.
	Handler Handler
	Logger  *slog.Logger
}

// Handler is the engine's side of the routing calls: what a node does with
// the jobs and messages its peers send it. from is the authenticated id of
// the node that sent them.
type Handler interface {
	// HandleForward takes a job as its queue's dispatcher: nil once it
	// holds it, a *core.Error to refuse it (an answer the caller passes
	// on), any other error when it cannot decide (the caller may retry).
	// It is called again with the same (job id, generation) when a caller
	// lost the answer, and must not create a second job.
	HandleForward(from string, d core.Delivery) error
	// HandleMessage handles one routing message. Messages from one node
	// arrive one at a time, in the order that node sent them on one path:
	// a queue's lane, a job's reply leg, or the node's Post FIFO.
	HandleMessage(from string, m core.Message)
}

// Server is the PeerService on its own listener.
type Server struct {
	pb.UnimplementedPeerServiceServer
	cfg     ServerConfig
	grpc    *grpc.Server
	handler atomic.Pointer[handlerBox]

	// legCancelled is the router's hook for cancels (setLegCancelled).
	legCancelled atomic.Pointer[func(job string, gen uint64)]

	mu        sync.Mutex
	senders   map[string]*inbox // by sending node id: lane-less Posts
	lanes     map[laneKey]*laneInbox
	swept     time.Time // when lanes was last swept of forgotten lanes
	inLegs    map[inLegKey]*inLeg
	finished  []finishedLeg // done legs in inLegs, oldest first (finishLeg)
	legsSwept time.Time     // when inLegs was last swept
	epochs    atomic.Uint64 // respondStream.epoch
	stopped   bool          // Stop began: no stream goroutine starts
	wg        sync.WaitGroup
}

// handlerBox lets an interface value live in an atomic.Pointer.
type handlerBox struct{ h Handler }

// inbox is what a server remembers of one sending node's Posts: it
// serialises them (a resend may arrive while the attempt it replaces is
// still being handled) and skips what it already handled. One per node id
// that ever posted; a node that restarts reuses its entry.
type inbox struct {
	mu      sync.Mutex
	session string
	next    uint64
}

var _ pb.PeerServiceServer = (*Server)(nil)

// NewServer returns a peer server whose every call is authenticated.
func NewServer(cfg ServerConfig) (*Server, error) {
	if len(cfg.Secret) < MinSecretBytes {
		return nil, &core.ConfigError{Field: "cluster-secret", Value: "(hidden)", Err: errors.New("must be at least 16 bytes")}
	}
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = defaultMaxMessageBytes
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	a := &authenticator{secret: cfg.Secret, metrics: cfg.Metrics}
	s := &Server{cfg: cfg, senders: map[string]*inbox{}, lanes: map[laneKey]*laneInbox{}, inLegs: map[inLegKey]*inLeg{}}
	s.SetHandler(cfg.Handler)
	s.grpc = grpc.NewServer(
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
	)
	pb.RegisterPeerServiceServer(s.grpc, s)
	return s, nil
}

// Serve serves on ln until Stop; it returns nil after Stop.
func (s *Server) Serve(ln net.Listener) error {
	if err := s.grpc.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// ServerKeepaliveMinTime is the shortest interval between a client's
// keepalive pings the peer server accepts: half the interval peers ping at.
const ServerKeepaliveMinTime = ClientKeepaliveTime / 2

// Stop closes the listener and every connection at once, and returns once
// every call's handler and goroutines have.
func (s *Server) Stop() {
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	s.grpc.Stop()
	s.wg.Wait()
}

// Ping answers with this node's id.
func (s *Server) Ping(context.Context, *pb.PingRequest) (*pb.PingResponse, error) {
	return &pb.PingResponse{Node: s.cfg.Node}, nil
}

// SetHandler installs the handler of the routing calls (nil: refuse them
// as Unavailable again). The engine is built after the peer server, so a
// node serves Ping first and starts routing once this is called. Safe for
// concurrent use.
func (s *Server) SetHandler(h Handler) {
	if h == nil {
		s.handler.Store(nil)
		return
	}
	s.handler.Store(&handlerBox{h})
}

var errNotRouting = status.Error(codes.Unavailable, "node not routing yet")

func (s *Server) getHandler() (Handler, error) {
	b := s.handler.Load()
	if b == nil {
		return nil, errNotRouting
	}
	return b.h, nil
}

// Forward hands one job to the handler and answers with its verdict. A
// refusal is an answer; an error the handler could not classify is
// Unavailable, which the caller retries.
func (s *Server) Forward(ctx context.Context, req *pb.ForwardRequest) (*pb.ForwardResponse, error) {
	from, ok := Caller(ctx)
	if !ok {
		return nil, errUnauthenticated
	}
	d, err := DeliveryFromPB(req.GetDelivery())
	if err != nil {
		s.cfg.Metrics.invalid.Inc()
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	h, err := s.getHandler()
	if err != nil {
		return nil, err
	}
	if req.GetLane() != nil && req.GetSession() != "" {
		// A lane's item: checked against the lane's numbers, in its order.
		l := s.acquireLane(from, req.GetLane().GetQueue())
		defer s.releaseLane(l)
		l.mu.Lock()
		defer l.mu.Unlock()
		l.syncLocked(req.GetSession())
		return s.forwardLocked(from, h, l, req.GetSeq(), req.GetDelivery())
	}
	err = h.HandleForward(from, d)
	res, ok := ForwardResponse(err)
	if !ok {
		return nil, status.Errorf(codes.Unavailable, "dispatcher could not take job %s: %v", d.JobID, err)
	}
	return res, nil
}

// Post hands each message of the batch to the handler, in order, and
// answers once all are handled.
//
// A message no handler could act on (unknown kind, no job id, a forward
// or deliver without its job) is skipped, logged and counted in
// switchyard_peer_messages_invalid_total; the rest of the batch is still
// handled. Refusing the whole batch instead would make the sender resend
// it forever and stall every message queued behind it for a fault that
// resending cannot cure.
func (s *Server) Post(ctx context.Context, req *pb.PostRequest) (*pb.PostResponse, error) {
	from, ok := Caller(ctx)
	if !ok {
		return nil, errUnauthenticated
	}
	h, err := s.getHandler()
	if err != nil {
		return nil, err
	}
	if req.GetLane() != nil {
		return s.postLane(from, h, req)
	}
	in := s.inbox(from)
	in.mu.Lock()
	defer in.mu.Unlock()
	session, seq := req.GetSession(), req.GetFirstSeq()
	if session != in.session {
		// A new sender process (or the first Post from this node): what
		// the last one sent says nothing about this one's numbers.
		in.session, in.next = session, 0
	}
	for i, p := range req.GetMessages() {
		n := seq + uint64(i)
		if session != "" && n < in.next {
			continue // handled already: this is a resend whose answer was lost
		}
		m, err := MessageFromPB(p)
		if err != nil {
			s.cfg.Metrics.invalid.Inc()
			s.cfg.Logger.Warn("skipped an invalid peer message", "from", from, "err", err)
			continue
		}
		s.handleMessage(h, from, m)
	}
	if session != "" {
		in.next = max(in.next, seq+uint64(len(req.GetMessages())))
	}
	return &pb.PostResponse{}, nil
}

// postLane is Post for a lane's unary path: each message is checked
// against the lane's numbers, shared with its Deliver streams and Forwards.
func (s *Server) postLane(from string, h Handler, req *pb.PostRequest) (*pb.PostResponse, error) {
	msgs, seqs, session := req.GetMessages(), req.GetSeqs(), req.GetSession()
	if len(seqs) != len(msgs) {
		return nil, status.Errorf(codes.InvalidArgument, "a lane's Post numbers each message: %d numbers for %d messages", len(seqs), len(msgs))
	}
	l := s.acquireLane(from, req.GetLane().GetQueue())
	defer s.releaseLane(l)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.syncLocked(session)
	for i, p := range msgs {
		if session == "" {
			// No numbers to check against: handled as it comes.
			if m, err := MessageFromPB(p); err == nil {
				s.handleMessage(h, from, m)
			} else {
				s.cfg.Metrics.invalid.Inc()
			}
			continue
		}
		s.messageLocked(from, h, l, seqs[i], p)
	}
	return &pb.PostResponse{}, nil
}

func (s *Server) inbox(from string) *inbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	in := s.senders[from]
	if in == nil {
		in = &inbox{}
		s.senders[from] = in
	}
	return in
}
