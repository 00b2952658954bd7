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
	// took, so it ends the job's reply leg here (legCancelled).
	router *router

	mu        sync.Mutex
	senders   map[string]*inbox // by sending node id: lane-less Posts
	lanes     map[laneKey]*laneInbox
	swept     time.Time // when lanes was last swept of forgotten lanes
	inLegs    map[inLegKey]*inLeg
	finished  []finishedLeg // done legs in inLegs, oldest first (finishLeg)
	legsSwept time.Time     // when inLegs was last swept
	epochs    atomic.Uint64 // respondStream.epoch
	stopped   bool          // stop began: no stream goroutine starts
	wg        sync.WaitGroup
}

// receiverBox lets an interface value live in an atomic.Pointer.
type receiverBox struct{ r core.Receiver }

// inbox is what a server remembers of one sending node's Posts: it
// serialises them (a resend may arrive while the attempt it replaces is
// still being handled) and skips what it already handled. One per node id
// that ever posted; a node that restarts reuses its entry.
type inbox struct {
	mu      sync.Mutex
	session string
	next    uint64
}

var _ pb.PeerServiceServer = (*server)(nil)

// newServer returns a peer server whose every call is authenticated; cfg
// has its defaults.
func newServer(cfg Config) *server {
	a := &authenticator{secret: cfg.Secret, metrics: cfg.Metrics, versions: newVersionGate(cfg.Metrics, cfg.Logger)}
	s := &server{cfg: cfg, senders: map[string]*inbox{}, lanes: map[laneKey]*laneInbox{}, inLegs: map[inLegKey]*inLeg{}}
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
	return s
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

// Forward hands one job to the receiver and answers with its verdict. A
// refusal is an answer; an error the receiver could not classify is
// Unavailable, which the caller retries.
func (s *server) Forward(ctx context.Context, req *pb.ForwardRequest) (*pb.ForwardResponse, error) {
	from, ok := Caller(ctx)
	if !ok {
		return nil, errUnauthenticated
	}
	d, err := DeliveryFromPB(req.GetDelivery())
	if err != nil {
		s.cfg.Metrics.invalid.Inc()
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	rcv, err := s.receiver()
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
		return s.forwardLocked(from, rcv, l, req.GetSeq(), req.GetDelivery())
	}
	err = rcv.HandleForward(from, d)
	res, ok := ForwardResponse(err)
	if !ok {
		return nil, status.Errorf(codes.Unavailable, "dispatcher could not take job %s: %v", d.JobID, err)
	}
	return res, nil
}

// Post hands each message of the batch to the receiver, in order, and
// answers once all are handled.
//
// A message no receiver could act on (unknown kind, no job id, a forward
// or deliver without its job) is skipped, logged and counted in
// switchyard_peer_messages_invalid_total; the rest of the batch is still
// handled. Refusing the whole batch instead would make the sender resend
// it forever and stall every message queued behind it for a fault that
// resending cannot cure.
func (s *server) Post(ctx context.Context, req *pb.PostRequest) (*pb.PostResponse, error) {
	from, ok := Caller(ctx)
	if !ok {
		return nil, errUnauthenticated
	}
	rcv, err := s.receiver()
	if err != nil {
		return nil, err
	}
	if req.GetLane() != nil {
		return s.postLane(from, rcv, req)
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
		s.handleMessage(rcv, from, m)
	}
	if session != "" {
		in.next = max(in.next, seq+uint64(len(req.GetMessages())))
	}
	return &pb.PostResponse{}, nil
}

// postLane is Post for a lane's unary path: each message is checked
// against the lane's numbers, shared with its Deliver streams and Forwards.
func (s *server) postLane(from string, rcv core.Receiver, req *pb.PostRequest) (*pb.PostResponse, error) {
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
				s.handleMessage(rcv, from, m)
			} else {
				s.cfg.Metrics.invalid.Inc()
			}
			continue
		}
		s.messageLocked(from, rcv, l, seqs[i], p)
	}
	return &pb.PostResponse{}, nil
}

func (s *server) inbox(from string) *inbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	in := s.senders[from]
	if in == nil {
		in = &inbox{}
		s.senders[from] = in
	}
	return in
}
