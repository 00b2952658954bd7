package grpcapi

import (
	"io"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/switchyard/switchyard/apierr"
	"github.com/switchyard/switchyard/auth"
	"github.com/switchyard/switchyard/internal/flowwin"
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
	// Keys authenticate every call (see methodRoles); nil means a node
	// without keys: every call is anonymous.
	Keys *auth.Store
	// Creds are the server's transport credentials (TLS); nil serves
	// plaintext.
	Creds credentials.TransportCredentials
	// Errors count the calls the guard refuses; nil keeps a set registered
	// nowhere.
	Errors *apierr.Metrics
	// TracerProvider records the span of every JobService call (trace.go);
	// nil records none, and the caller's trace context still reaches the
	// job.
	TracerProvider trace.TracerProvider
	Logger         *slog.Logger
}

// NewServer returns the gRPC server of a node's --grpc-addr, with the
// public services registered. The caller serves it on its listener and
// stops it; Stop waits for session handlers (see WaitForHandlers below).
func NewServer(cfg ServerConfig, workers *WorkerServer, jobs *JobServer, cluster *ClusterServer) *grpc.Server {
	if cfg.Keys == nil {
		cfg.Keys, _ = auth.Open(auth.Source{}, nil) // no source: cannot fail
	}
	if cfg.Errors == nil {
		cfg.Errors = apierr.NewMetrics(nil)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	g := guard{keys: cfg.Keys, errs: cfg.Errors.Reporter("grpc", cfg.Logger), extractTrace: cfg.TracerProvider == nil}
	opts := []grpc.ServerOption{
		// Proto, but a job stream's events are encoded without reflection
		// into pooled memory (codec.go).
		grpc.ForceServerCodecV2(newCodec()),
		grpc.ChainUnaryInterceptor(g.unary),
		grpc.ChainStreamInterceptor(g.stream),
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
	}
	if cfg.Creds != nil {
		opts = append(opts, grpc.Creds(cfg.Creds))
	}
	if cfg.TracerProvider != nil {
		opts = append(opts, traceCalls(cfg.TracerProvider))
	}
	// Static windows: no PING per burst of data read (flowwin); a worker
	// session is bursts of outputs.
	opts = append(opts, flowwin.ServerOptions(cfg.MaxMessageBytes)...)
	s := grpc.NewServer(opts...)
	pb.RegisterWorkerServiceServer(s, workers)
	s.RegisterService(jobs.serviceDesc(), jobs)
	pb.RegisterClusterServiceServer(s, cluster)
	return s
}
