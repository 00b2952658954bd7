package worker_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
	"github.com/switchyard/switchyard/worker"
)

// BenchmarkSDKJob is the SDK's per-job path in one process: the demo
// tokens handler streaming 16 outputs of 32 bytes per job, c jobs in
// flight, against a loopback node that reads each worker message only as
// far as its kind (a raw codec: its own cost stays small and constant)
// and offers a new job for each that ends. One op is one job; allocs/op,
// ns/op and cpu-ns/op (the process's CPU time per job) include the node's
// side of the loopback. The batched runs are against a node that takes
// batches (Registered.accepts_batches); msgs/op is the messages the
// worker sent per job.
func BenchmarkSDKJob(b *testing.B) {
	for _, c := range []int{1, 64} {
		for _, batches := range []bool{false, true} {
			name := "c=" + strconv.Itoa(c)
			if batches {
				name += "/batched"
			}
			b.Run(name, func(b *testing.B) { benchSDKJob(b, c, 16, 32, batches) })
		}
	}
}

func benchSDKJob(b *testing.B, c, outputs, size int, batches bool) {
	word := strings.Repeat("x", size-1)
	text := strings.Repeat(word+" ", outputs-1) + word + "x"
	n := &benchNode{
		conc:    c,
		jobs:    int64(b.N),
		input:   []byte(strconv.Quote(text)),
		batches: batches,
		done:    make(chan struct{}),
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	desc := pb.WorkerService_ServiceDesc
	desc.HandlerType = (*any)(nil)
	desc.Streams = []grpc.StreamDesc{{
		StreamName: desc.Streams[0].StreamName, ServerStreams: true, ClientStreams: true,
		Handler: func(_ any, st grpc.ServerStream) error { return n.connect(st) },
	}}
	srv := grpc.NewServer(grpc.ForceServerCodec(peekCodec{}))
	srv.RegisterService(&desc, n)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran := make(chan error, 1)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := processCPU(b)
	go func() {
		// As `switchyard worker --demo tokens --delay 0s` runs without an
		// OTLP endpoint: a no-op tracer provider.
		ran <- worker.Run(ctx, worker.Config{
			Server: lis.Addr().String(), Queue: "q", Concurrency: c, TracerProvider: noop.NewTracerProvider(),
		}, worker.Tokens(0))
	}()
	select {
	case <-n.done:
	case err := <-ran:
		b.Fatalf("worker ended: %v", err)
	case <-time.After(5*time.Minute + time.Duration(b.N)*time.Millisecond):
		b.Fatal("jobs did not complete")
	}
	b.StopTimer()
	b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(n.msgs.Load())/float64(b.N), "msgs/op")
	if f := n.failed.Load(); f > 0 {
		b.Fatalf("%d jobs failed", f)
	}
	if got, want := n.outputs.Load(), int64(b.N*outputs); got != want {
		b.Fatalf("%d outputs, want %d", got, want)
	}
	cancel()
	if err := <-ran; err != nil {
		b.Fatal(err)
	}
}

// processCPU is the user and system time this process used so far: on a
// loaded machine a steadier figure than the wall time ns/op measures.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchNode is BenchmarkSDKJob's node: one session, conc jobs in flight
// until jobs were offered.
type benchNode struct {
	conc    int
	jobs    int64
	input   []byte
	batches bool
	msgs    atomic.Int64 // received, a batch as one
	offered atomic.Int64
	ended   atomic.Int64
	failed  atomic.Int64
	outputs atomic.Int64
	done    chan struct{}
}

func (n *benchNode) connect(st grpc.ServerStream) error {
	var f peekFrame
	if err := st.RecvMsg(&f); err != nil {
		return err
	}
	if err := st.SendMsg(&pb.NodeMessage{Msg: &pb.NodeMessage_Registered{Registered: &pb.Registered{
		ConsumerId: "c1", Node: "bench", HeartbeatMs: 60_000, AcceptsBatches: n.batches,
	}}}); err != nil {
		return err
	}
	// Offers go from a goroutine of their own, so the node always reads:
	// a node blocked on a send while the worker waits to send would stall
	// both.
	next := make(chan struct{}, n.conc)
	for range n.conc {
		next <- struct{}{}
	}
	sendErr := make(chan error, 1)
	go func() {
		for range next {
			id := n.offered.Add(1)
			if id > n.jobs {
				continue
			}
			err := st.SendMsg(&pb.NodeMessage{Msg: &pb.NodeMessage_Job{Job: &pb.Job{
				JobId: "j" + strconv.FormatInt(id, 10), Generation: 1, Queue: "q", Input: n.input, TtlMs: 60_000,
				OutputCredit: &pb.OutputCredit{Events: 1 << 20, Bytes: 1 << 30},
				// A node sends its offer's trace context with every job.
				Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			}}})
			if err != nil {
				sendErr <- err
				return
			}
		}
	}()
	defer close(next)
	for {
		if err := st.RecvMsg(&f); err != nil {
			return err
		}
		n.msgs.Add(1)
		for _, kind := range f.kinds {
			switch kind {
			case 4: // Output
				n.outputs.Add(1)
			case 3, 5, 6: // Reject, Complete, Fail
				if kind != 5 {
					n.failed.Add(1)
				}
				if e := n.ended.Add(1); e == n.jobs {
					close(n.done)
				} else if e < n.jobs {
					next <- struct{}{}
				}
			}
		}
		select {
		case err := <-sendErr:
			return err
		default:
		}
	}
}

// peekFrame is a received WorkerMessage read only as far as its oneof's
// field number, a batch's messages each (kinds is reused).
type peekFrame struct{ kinds []int }

// peekCodec sends protobuf messages and receives into a peekFrame.
type peekCodec struct{}

func (peekCodec) Marshal(v any) ([]byte, error) { return proto.Marshal(v.(proto.Message)) }

func (peekCodec) Unmarshal(data []byte, v any) error {
	f, ok := v.(*peekFrame)
	if !ok || len(data) == 0 {
		return errors.New("peekCodec: want a peekFrame and a message")
	}
	f.kinds = f.kinds[:0]
	if data[0]>>3 != 9 { // not a Batch
		f.kinds = append(f.kinds, int(data[0]>>3))
		return nil
	}
	_, _, n := protowire.ConsumeTag(data)
	body, m := protowire.ConsumeBytes(data[n:])
	for m >= 0 && len(body) > 0 {
		_, _, n = protowire.ConsumeTag(body)
		var item []byte
		item, m = protowire.ConsumeBytes(body[n:])
		if m < 0 || len(item) == 0 {
			return errors.New("peekCodec: a malformed batch")
		}
		f.kinds = append(f.kinds, int(item[0]>>3))
		body = body[n+m:]
	}
	return nil
}

func (peekCodec) Name() string { return "proto" }

var _ encoding.Codec = peekCodec{}
