package benchkit

import (
	"context"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// GRPCJob is Job through the public JobService instead of HTTP/SSE: one
// Submit stream per job, read to its terminal event. It measures the path
// without the HTTP edge (the same engine, the same stream writer, a gRPC
// sink instead of the SSE one).
func GRPCJob(client pb.JobServiceClient, queue string, envelope []byte) JobFunc {
	return func(ctx context.Context) (first, last time.Duration, ok bool) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		t0 := time.Now()
		st, err := client.Submit(ctx, &pb.SubmitRequest{Queue: queue, EnvelopeJson: envelope})
		if err != nil {
			return 0, 0, false
		}
		kinds := func(yield func(string, error) bool) {
			for {
				ev, err := st.Recv()
				// io.EOF too: the stream ended without a terminal event.
				if !yield(ev.GetKind(), err) || err != nil {
					return
				}
			}
		}
		return timeStream(t0, kinds, "error", "terminated", "resync")
	}
}

// BatchedMessages and BatchedEvents count what every GRPCBatchedJob
// received: JobEventBatch messages, and the events in them.
var BatchedMessages, BatchedEvents atomic.Uint64

// GRPCBatchedJob is GRPCJob through SubmitBatched: the events come in
// JobEventBatch messages, timed as they come out of each (the first
// output when the message holding it arrived, the job when the one
// holding its terminal event did).
func GRPCBatchedJob(client pb.JobServiceClient, queue string, envelope []byte) JobFunc {
	return func(ctx context.Context) (first, last time.Duration, ok bool) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		t0 := time.Now()
		st, err := client.SubmitBatched(ctx, &pb.SubmitRequest{Queue: queue, EnvelopeJson: envelope})
		if err != nil {
			return 0, 0, false
		}
		kinds := func(yield func(string, error) bool) {
			for {
				b, err := st.Recv()
				if err != nil {
					// io.EOF too: the stream ended without a terminal event.
					yield("", err)
					return
				}
				BatchedMessages.Add(1)
				BatchedEvents.Add(uint64(len(b.GetEvents())))
				for _, ev := range b.GetEvents() {
					if !yield(ev.GetKind(), nil) {
						return
					}
				}
			}
		}
		return timeStream(t0, kinds, "error", "terminated", "resync")
	}
}

// DialGRPCJob is GRPCJob (GRPCBatchedJob when batched) against the node
// at addr over a plaintext gRPC connection of its own; close releases the
// connection.
func DialGRPCJob(addr, queue string, envelope []byte, batched bool) (job JobFunc, close func() error, err error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	if batched {
		return GRPCBatchedJob(pb.NewJobServiceClient(conn), queue, envelope), conn.Close, nil
	}
	return GRPCJob(pb.NewJobServiceClient(conn), queue, envelope), conn.Close, nil
}
