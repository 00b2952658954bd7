package benchkit

import (
	"context"
	"errors"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The opaque relay floor's gRPC edge: FrameIngress can serve jobs on a
// gRPC port as well as on HTTP, so the JobService setups have a floor of
// their own protocol. A job is one server-streaming call,
//
//	switchyard.bench.v1.FrameEdge/Submit(BytesValue envelope) returns (stream BytesValue)
//
// whose response messages are the node's frames, passed on unchanged (the
// 11-byte header carries the seq a resume would need, and the flags). It
// is to the JobService's Submit what the HTTP edge is to a POST: the
// protocol's own cost (gRPC-Go's writer goroutine on the server, its reader
// goroutine on the client, HTTP/2 framing) with nothing else, so the ratio
// of a JobService setup to it is what Switchyard adds over a bare gRPC
// relay, and its ratio to the HTTP floor is what the protocol costs.
//
// Both servers keep gRPC's default settings, as every hop of the floor does.

const (
	frameEdgeService = "switchyard.bench.v1.FrameEdge"
	frameEdgeSubmit  = "/" + frameEdgeService + "/Submit"
)

var frameEdgeDesc = grpc.ServiceDesc{
	ServiceName: frameEdgeService,
	HandlerType: (*any)(nil),
	Streams: []grpc.StreamDesc{{
		StreamName: "Submit", ServerStreams: true,
		Handler: func(srv any, ss grpc.ServerStream) error { return srv.(*FrameIngress).serveEdge(ss) },
	}},
}

// serveEdge runs one job of the gRPC edge: it sends the request's envelope
// to the node and each frame of the job back, ending after the last; a
// failed job ends the call with Unavailable and the frame's reason.
func (in *FrameIngress) serveEdge(ss grpc.ServerStream) error {
	req := new(wrapperspb.BytesValue)
	if err := ss.RecvMsg(req); err != nil {
		return err
	}
	jw, err := in.open(req.GetValue())
	if err != nil {
		return status.Error(codes.Unavailable, err.Error())
	}
	defer in.end(jw)
	for {
		select {
		case m, open := <-jw.frames:
			if !open {
				return status.Error(codes.Unavailable, errBroken.Error())
			}
			h, p, _ := readFrame(m)
			if h.flags&frameFailed != 0 {
				return status.Error(codes.Unavailable, string(p))
			}
			if err := ss.SendMsg(m); err != nil {
				return err
			}
			if h.flags&frameLast != 0 {
				return nil
			}
		case <-ss.Context().Done():
			return ss.Context().Err()
		}
	}
}

// FrameEdgeJob is FrameJob through the gRPC edge on conn: one Submit call
// per job, first timed at the first frame, last at the frames-th; ok is
// false when the call failed or ended with another count.
func FrameEdgeJob(conn *grpc.ClientConn, body []byte, frames int) JobFunc {
	desc := &frameEdgeDesc.Streams[0]
	return func(ctx context.Context) (first, last time.Duration, ok bool) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		t0 := time.Now()
		st, err := conn.NewStream(ctx, desc, frameEdgeSubmit)
		if err != nil {
			return 0, 0, false
		}
		if st.SendMsg(&wrapperspb.BytesValue{Value: body}) != nil || st.CloseSend() != nil {
			return 0, 0, false
		}
		n := 0
		for {
			m := new(wrapperspb.BytesValue)
			if err := st.RecvMsg(m); err != nil {
				return first, last, errors.Is(err, io.EOF) && n == frames
			}
			n++
			if n == 1 {
				first = time.Since(t0)
			}
			if n == frames {
				last = time.Since(t0)
			}
		}
	}
}
