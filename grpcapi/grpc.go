package grpcapi

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// ServerConfig are the settings of the gRPC server itself, from the node's
// config.
type ServerConfig struct {
	// MaxMessageBytes bounds every message the server receives or sends.
	MaxMessageBytes int
	// MaxConcurrentStreams bounds the concurrent streams of one client
	// connection.
	MaxConcurrentStreams uint32
}

// NewServer returns the gRPC server of a node's --grpc-addr, with the
// public services registered. The caller serves it on its listener and
// stops it; Stop waits for session handlers (see WaitForHandlers below).
func NewServer(cfg ServerConfig, workers *WorkerServer, jobs *JobServer, cluster *ClusterServer) *grpc.Server {
	s := grpc.NewServer(
		grpc.MaxRecvMsgSize(cfg.MaxMessageBytes),
		grpc.MaxSendMsgSize(cfg.MaxMessageBytes),
		grpc.MaxConcurrentStreams(cfg.MaxConcurrentStreams),
		// Application heartbeats detect a silent worker in seconds; gRPC
		// keepalive is the transport's backstop. Accept client pings as
		// often as every 5s so a worker's keepalive is never punished.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		// Stop waits for session handlers, whose deferred Detach withdraws
		// the consumer record: a node's Close must not return before that.
		grpc.WaitForHandlers(true),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
	)
	pb.RegisterWorkerServiceServer(s, workers)
	pb.RegisterJobServiceServer(s, jobs)
	pb.RegisterClusterServiceServer(s, cluster)
	return s
}
