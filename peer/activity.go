package peer

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// Activity is when this node last exchanged a routing message with each
// peer, either way: a call, or a message on a stream (a stream's own
// heartbeats count, so an open delivery stream or response leg keeps its
// peer active). Pings and Figures calls do not count: they are the
// tracker's and the cluster view's, not traffic. The tracker pings every
// heartbeat only the peers this node has business with, these among them
// (Tracker).
type Activity struct {
	last sync.Map // node id → *atomic.Int64 (unix nanoseconds)
}

// NewActivity returns an empty record.
func NewActivity() *Activity { return &Activity{} }

// Mark records traffic with node now. Nil-safe.
func (a *Activity) Mark(node string) {
	if a == nil || node == "" {
		return
	}
	now := time.Now().UnixNano()
	if v, ok := a.last.Load(node); ok {
		v.(*atomic.Int64).Store(now)
		return
	}
	v, _ := a.last.LoadOrStore(node, new(atomic.Int64))
	v.(*atomic.Int64).Store(now)
}

// Last is when this node last exchanged traffic with node (zero: never).
func (a *Activity) Last(node string) time.Time {
	if a == nil {
		return time.Time{}
	}
	v, ok := a.last.Load(node)
	if !ok {
		return time.Time{}
	}
	return time.Unix(0, v.(*atomic.Int64).Load())
}

// Forget drops node's record (it left the catalog).
func (a *Activity) Forget(node string) {
	if a != nil {
		a.last.Delete(node)
	}
}

// isTraffic reports whether a call of method is routing traffic rather
// than liveness or the cluster view.
func isTraffic(method string) bool {
	return method != pb.PeerService_Ping_FullMethodName && method != pb.PeerService_Figures_FullMethodName
}

// dialOptions are the client interceptors that mark traffic to node.
func (a *Activity) dialOptions(node string) []grpc.DialOption {
	if a == nil {
		return nil
	}
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if isTraffic(method) {
				a.Mark(node)
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			a.Mark(node)
			cs, err := streamer(ctx, desc, cc, method, opts...)
			if err != nil {
				return nil, err
			}
			return &markedClientStream{ClientStream: cs, a: a, node: node}, nil
		}),
	}
}

type markedClientStream struct {
	grpc.ClientStream
	a    *Activity
	node string
}

func (s *markedClientStream) SendMsg(m any) error {
	return s.a.sendMarked(s.node, s.ClientStream.SendMsg, m)
}

func (s *markedClientStream) RecvMsg(m any) error {
	return s.a.recvMarked(s.node, s.ClientStream.RecvMsg, m)
}

// sendMarked and recvMarked are how a stream's messages, either way and
// at either end, mark traffic with node: a message sent as it goes, one
// received once it arrived. Nil-safe.
func (a *Activity) sendMarked(node string, send func(any) error, m any) error {
	a.Mark(node)
	return send(m)
}

func (a *Activity) recvMarked(node string, recv func(any) error, m any) error {
	err := recv(m)
	if err == nil {
		a.Mark(node)
	}
	return err
}
