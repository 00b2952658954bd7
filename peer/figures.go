package peer

import (
	"context"
	"math"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/switchyard/switchyard/core"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// Figures answers with this node's live figures (Config.Figures), for a
// peer's cluster view.
func (s *server) Figures(context.Context, *pb.FiguresRequest) (*pb.FiguresResponse, error) {
	if s.cfg.Figures == nil {
		return nil, status.Error(codes.Unavailable, "this node reads no figures")
	}
	f := s.cfg.Figures()
	res := &pb.FiguresResponse{
		Node: s.cfg.Node, JobsEnded: f.JobsEnded,
		FirstOutputBounds: f.FirstOutput.Bounds, FirstOutputCounts: f.FirstOutput.Counts, FirstOutputTotal: f.FirstOutput.Count,
		StreamsOpen: clampU32(f.StreamsOpen),
	}
	for _, q := range f.Queues {
		res.Queues = append(res.Queues, &pb.QueueFigures{Name: q.Name, Depth: clampU32(q.Depth), Bound: clampU32(q.Bound)})
	}
	return res, nil
}

// Figures asks node, at addr, for its live figures. At is left for the
// caller to set: it is the asking node's clock that rates are taken on.
func (c *Client) Figures(ctx context.Context, node, addr string) (core.NodeFigures, error) {
	cc, err := c.Conn(node, addr)
	if err != nil {
		return core.NodeFigures{}, err
	}
	res, err := pb.NewPeerServiceClient(cc).Figures(ctx, &pb.FiguresRequest{})
	if err != nil {
		return core.NodeFigures{}, err
	}
	f := core.NodeFigures{
		Node: res.GetNode(), JobsEnded: res.GetJobsEnded(),
		FirstOutput: core.Histogram{Bounds: res.GetFirstOutputBounds(), Counts: res.GetFirstOutputCounts(), Count: res.GetFirstOutputTotal()},
		StreamsOpen: int(res.GetStreamsOpen()),
	}
	if len(f.FirstOutput.Bounds) != len(f.FirstOutput.Counts) || !slices.IsSorted(f.FirstOutput.Bounds) {
		// Not a histogram: the rest still reads.
		f.FirstOutput = core.Histogram{}
	}
	for _, q := range res.GetQueues() {
		f.Queues = append(f.Queues, core.QueueStat{Name: q.GetName(), Depth: int(q.GetDepth()), Bound: int(q.GetBound())})
	}
	return f, nil
}

func clampU32(n int) uint32 { return uint32(min(max(n, 0), math.MaxUint32)) }
