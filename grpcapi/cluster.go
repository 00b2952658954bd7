package grpcapi

import (
	"context"
	"io"
	"log/slog"
	"slices"

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
		cfg.View = emptyView{}
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
		out.Nodes = append(out.Nodes, &pb.Node{
			Id: n.ID, State: string(n.State), Zone: optional(n.Zone),
			HttpAddr: optional(n.HTTPAddr), GrpcAddr: optional(n.GRPCAddr), PeerAddr: optional(n.PeerAddr),
		})
	}
	return out, nil
}

// ListQueues returns every queue the catalog or this node knows, with its
// dispatcher and consumers, sorted by name.
func (s *ClusterServer) ListQueues(context.Context, *pb.ListQueuesRequest) (*pb.ListQueuesResponse, error) {
	local := s.localQueues()
	names := s.view.Queues()
	for name := range local {
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	out := &pb.ListQueuesResponse{Queues: []*pb.Queue{}}
	for _, name := range names {
		out.Queues = append(out.Queues, s.queue(name, local))
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
	local := s.localQueues()
	if _, known := local[name]; !known && !slices.Contains(s.view.Queues(), name) {
		return nil, s.fail("GetQueue", &core.Error{Code: core.CodeNotFound, Detail: "no queue by this name: queues exist while they have jobs or consumers"})
	}
	return s.queue(name, local), nil
}

func (s *ClusterServer) fail(method string, err error) error {
	s.errs.Report(err, "method", method)
	return apierr.Status(err)
}

func (s *ClusterServer) localQueues() map[string]core.QueueStat {
	local := map[string]core.QueueStat{}
	for _, q := range s.e.QueueStats() {
		local[q.Name] = q
	}
	return local
}

func (s *ClusterServer) queue(name string, local map[string]core.QueueStat) *pb.Queue {
	q := &pb.Queue{Name: name, Consumers: []*pb.Consumer{}}
	if d, ok := s.view.Dispatch(name); ok {
		q.Dispatcher, q.ReplyTo, q.Zone = optional(d.Dispatcher), optional(d.ReplyTo), optional(d.Zone)
	}
	if st, ok := local[name]; ok {
		q.Local = &pb.LocalQueue{Depth: int32(st.Depth), Bytes: st.Bytes, Bound: int32(st.Bound), Workers: int32(st.Workers)}
		if q.Dispatcher == nil {
			// Without a dispatch record, the node holding the queue is its
			// dispatcher: every queue a single node serves is local.
			q.Dispatcher = optional(s.e.Config().Node)
		}
	}
	for _, c := range s.view.Consumers(name) {
		q.Consumers = append(q.Consumers, &pb.Consumer{
			Id: c.ID, Node: c.Node, Name: optional(c.Name), Capabilities: c.Capabilities.Strings(),
			Concurrency: int32(c.Concurrency), Zone: optional(c.Zone),
		})
	}
	return q
}

// emptyView is the view of a node with no catalog.
type emptyView struct{}

func (emptyView) Nodes() []core.NodeInfo                    { return nil }
func (emptyView) Queues() []string                          { return nil }
func (emptyView) Consumers(string) []core.ConsumerInfo      { return nil }
func (emptyView) Dispatch(string) (core.DispatchInfo, bool) { return core.DispatchInfo{}, false }
