package peer

import (
	"context"
	"errors"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/switchyard/switchyard/core"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// ServerConfig is what a peer server needs from its node.
type ServerConfig struct {
	// Node is this node's id, returned by Ping.
	Node string
	// Secret is the cluster secret every caller must prove it holds.
	Secret []byte
	// gRPC limits, from node config.
	MaxMessageBytes      int
	MaxConcurrentStreams uint32
	Metrics              *Metrics
}

// Server is the PeerService on its own listener.
type Server struct {
	pb.UnimplementedPeerServiceServer
	cfg  ServerConfig
	grpc *grpc.Server
}

var _ pb.PeerServiceServer = (*Server)(nil)

// NewServer returns a peer server whose every call is authenticated.
func NewServer(cfg ServerConfig) (*Server, error) {
	if len(cfg.Secret) < MinSecretBytes {
		return nil, &core.ConfigError{Field: "cluster-secret", Value: "(hidden)", Err: errors.New("must be at least 16 bytes")}
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	a := &authenticator{secret: cfg.Secret, metrics: cfg.Metrics}
	s := &Server{cfg: cfg}
	s.grpc = grpc.NewServer(
		grpc.MaxRecvMsgSize(cfg.MaxMessageBytes),
		grpc.MaxSendMsgSize(cfg.MaxMessageBytes),
		grpc.MaxConcurrentStreams(cfg.MaxConcurrentStreams),
		grpc.ChainUnaryInterceptor(a.unary),
		grpc.ChainStreamInterceptor(a.stream),
		// Peers ping every ClientKeepaliveTime even without a call in
		// flight: accept that, with room for timer skew.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: ClientKeepaliveTime / 2, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
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

// Stop closes the listener and every connection at once.
func (s *Server) Stop() { s.grpc.Stop() }

// Ping answers with this node's id.
func (s *Server) Ping(context.Context, *pb.PingRequest) (*pb.PingResponse, error) {
	return &pb.PingResponse{Node: s.cfg.Node}, nil
}
