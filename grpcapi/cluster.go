package grpcapi

import (
	"context"
	"io"
	"log/slog"

	"google.golang.org/protobuf/proto"

	"github.com/switchyard/switchyard/apierr"
	"github.com/switchyard/switchyard/core"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// ClusterConfig configures the cluster service.
type ClusterConfig struct {
	// View is the catalog as the views read it; nil shows an empty cluster
	// (a node without a catalog, in tests).
	View core.ClusterView
	// Errors are the node's API error metrics; nil keeps a set registered
	// nowhere.
	Errors *apierr.Metrics
	// Transport labels the errors the service reports, as
	// JobConfig.Transport does.
	Transport string
	Logger    *slog.Logger
}

// ClusterServer serves the ClusterService: the nodes of the catalog, and
// every queue with its dispatcher, its consumers and this node's figures.
// It reads the node's watched view of the catalog and the engine's queues,
// never the store.
type ClusterServer struct {
	pb.UnimplementedClusterServiceServer
	e    *core.Engine
	view core.ClusterView
	errs *apierr.Reporter
}

var _ pb.ClusterServiceServer = (*ClusterServer)(nil)

// NewClusterServer returns a ClusterService over e and cfg.View.
func NewClusterServer(e *core.Engine, cfg ClusterConfig) *ClusterServer {
	if cfg.View == nil {
		cfg.View = core.NoCluster{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Errors == nil {
		cfg.Errors = apierr.NewMetrics(nil)
	}
	if cfg.Transport == "" {
		cfg.Transport = "grpc"
	}
	return &ClusterServer{e: e, view: cfg.View, errs: cfg.Errors.Reporter(cfg.Transport, cfg.Logger)}
}

// ListNodes returns every node with its zone and state.
func (s *ClusterServer) ListNodes(context.Context, *pb.ListNodesRequest) (*pb.ListNodesResponse, error) {
	out := &pb.ListNodesResponse{Nodes: []*pb.Node{}}
	for _, n := range s.view.Nodes() {
		nd := &pb.Node{
			Id: n.ID, State: string(n.State), Zone: optional(n.Zone),
			HttpAddr: optional(n.HTTPAddr), GrpcAddr: optional(n.GRPCAddr), PeerAddr: optional(n.PeerAddr),
			Incarnation: optional(n.Incarnation),
		}
		if n.Suspected {
			nd.Suspected = proto.Bool(true) // absent, not false, otherwise
		}
		out.Nodes = append(out.Nodes, nd)
	}
	return out, nil
}

// ListQueues returns every queue the catalog or this node knows, with its
// dispatcher and consumers, sorted by name.
func (s *ClusterServer) ListQueues(context.Context, *pb.ListQueuesRequest) (*pb.ListQueuesResponse, error) {
	out := &pb.ListQueuesResponse{Queues: []*pb.Queue{}}
	for _, q := range s.e.QueueViews(s.view) {
		out.Queues = append(out.Queues, queuePB(q))
	}
	return out, nil
}

// GetQueue returns one queue; not_found when neither the catalog nor this
// node knows it.
func (s *ClusterServer) GetQueue(_ context.Context, req *pb.GetQueueRequest) (*pb.Queue, error) {
	name := req.GetQueue()
	if err := core.CheckQueueName(name); err != nil {
		return nil, s.fail("GetQueue", err)
	}
	q, ok := s.e.QueueView(s.view, name)
	if !ok {
		return nil, s.fail("GetQueue", &core.Error{Code: core.CodeNotFound, Detail: "no queue by this name: queues exist while they have jobs or consumers"})
	}
	return queuePB(q), nil
}

func (s *ClusterServer) fail(method string, err error) error {
	s.errs.Report(err, "method", method)
	return apierr.Status(err)
}

func queuePB(v core.QueueView) *pb.Queue {
	d := v.Dispatch
	q := &pb.Queue{Name: v.Name, Dispatcher: optional(d.Dispatcher), ReplyTo: optional(d.ReplyTo), Zone: optional(d.Zone), Consumers: []*pb.Consumer{}}
	if st := v.Local; st != nil {
		q.Local = &pb.LocalQueue{Depth: int32(st.Depth), Bytes: st.Bytes, Bound: int32(st.Bound), Workers: int32(st.Workers), Subjects: []*pb.SubjectShare{}}
		for _, sub := range st.Subjects {
			q.Local.Subjects = append(q.Local.Subjects, &pb.SubjectShare{
				Subject: sub.Subject, Weight: int32(sub.Weight), Depth: int32(sub.Depth), Bound: int32(sub.Bound),
				Share: sub.Share, FairShare: sub.FairShare,
			})
		}
	}
	for _, c := range v.Consumers {
		q.Consumers = append(q.Consumers, &pb.Consumer{
			Id: c.ID, Node: c.Node, Name: optional(c.Name), Capabilities: c.Capabilities.Strings(),
			Concurrency: int32(c.Concurrency), Zone: optional(c.Zone),
		})
	}
	return q
}
