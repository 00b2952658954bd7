package benchkit

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// BareShape is the job a bare worker answers with, read from the job's
// options: {"outputs": N, "bytes": B} (the demo tokens worker ignores both,
// so one envelope serves both workers). Each output's data is a JSON string
// of B characters; 16 of 32 when absent.
type BareShape struct {
	Outputs int `json:"outputs"`
	Bytes   int `json:"bytes"`
}

// RunBareWorker is the relay's worker end at its cheapest: one session on
// the WorkerService at addr (plaintext), Register, then every job answered
// at once from its receive loop with Accept, the shape's outputs and
// Complete, each appended to a buffer from bytes encoded once per shape
// (the output's data, the message framing) instead of marshalled from
// structs. It honours no output credit (the relay sends none), never
// rejects, and heartbeats at the interval Registered names. It returns
// when ctx ends or the session breaks.
//
// It is the floor the Go worker SDK (package worker) is measured against
// in BenchmarkProcesses: the same protocol on the wire, nothing else.
func RunBareWorker(ctx context.Context, addr, queue string, concurrency int) error {
	st, stop, err := dialRaw(ctx, addr, &pb.WorkerService_ServiceDesc.Streams[0], pb.WorkerService_Connect_FullMethodName)
	if err != nil {
		return err
	}
	defer stop()
	var sendMu sync.Mutex
	send := func(b []byte) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return st.SendMsg(rawMsg(b))
	}
	if err := st.SendMsg(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Register{Register: &pb.Register{
		Queue: queue, Concurrency: uint32(concurrency), Name: "bare",
	}}}); err != nil {
		return err
	}
	var hb sync.WaitGroup
	defer hb.Wait()
	defer stop()
	shapes := map[string]*bareAnswers{}
	for {
		m := new(pb.NodeMessage)
		if err := st.RecvMsg(m); err != nil {
			return err
		}
		switch x := m.GetMsg().(type) {
		case *pb.NodeMessage_Registered:
			every := time.Duration(x.Registered.GetHeartbeatMs()) * time.Millisecond
			if every <= 0 {
				continue
			}
			beat := protowire.AppendVarint(protowire.AppendTag(nil, 7, protowire.BytesType), 0) // an empty Heartbeat
			hb.Go(func() { heartbeat(st.Context(), every, func() error { return send(beat) }) })
		case *pb.NodeMessage_Job:
			j := x.Job
			a := shapes[string(j.GetOptions())]
			if a == nil {
				if a, err = newBareAnswers(j.GetOptions()); err != nil {
					return err
				}
				shapes[string(j.GetOptions())] = a
			}
			// Each message its own buffer: gRPC may write it after SendMsg
			// returns.
			id, gen := j.GetJobId(), j.GetGeneration()
			if err := send(appendMsg(nil, 2, ref(id, gen, nil))); err != nil {
				return err
			}
			for range a.outputs {
				if err := send(appendMsg(nil, 4, ref(id, gen, a.data))); err != nil {
					return err
				}
			}
			if err := send(appendMsg(nil, 5, ref(id, gen, a.result))); err != nil {
				return err
			}
		}
	}
}

// bareAnswers is one shape's pre-encoded parts: the data field (tag and
// length included) of every output and of the Complete.
type bareAnswers struct {
	outputs      int
	data, result []byte
}

func newBareAnswers(options []byte) (*bareAnswers, error) {
	s := BareShape{Outputs: 16, Bytes: 32}
	if len(options) > 0 {
		if err := json.Unmarshal(options, &s); err != nil {
			return nil, fmt.Errorf("bare worker: options: %w", err)
		}
	}
	data, _ := json.Marshal(strings.Repeat("x", max(s.Bytes, 0)))
	result, _ := json.Marshal(map[string]int{"words": s.Outputs})
	return &bareAnswers{
		outputs: s.Outputs,
		data:    protowire.AppendBytes(protowire.AppendTag(nil, 3, protowire.BytesType), data),
		result:  protowire.AppendBytes(protowire.AppendTag(nil, 3, protowire.BytesType), result),
	}, nil
}

// jobRef is an Accept, Output or Complete body: job_id, generation, then
// the pre-encoded data field (nil for Accept).
type jobRef struct {
	id   string
	gen  uint64
	tail []byte
}

func ref(id string, gen uint64, tail []byte) jobRef { return jobRef{id, gen, tail} }

func (r jobRef) size() int {
	return protowire.SizeTag(1) + protowire.SizeBytes(len(r.id)) + protowire.SizeTag(2) + protowire.SizeVarint(r.gen) + len(r.tail)
}

// appendMsg appends a WorkerMessage whose oneof field is field, holding r.
func appendMsg(b []byte, field protowire.Number, r jobRef) []byte {
	if b == nil {
		b = make([]byte, 0, 2*protowire.SizeVarint(uint64(r.size()))+r.size())
	}
	b = protowire.AppendTag(b, field, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(r.size()))
	b = protowire.AppendString(protowire.AppendTag(b, 1, protowire.BytesType), r.id)
	b = protowire.AppendVarint(protowire.AppendTag(b, 2, protowire.VarintType), r.gen)
	return append(b, r.tail...)
}

// dialRaw opens a stream of desc, calling method, at addr over a plaintext
// connection of its own, with rawCodec. The stream ends when ctx ends or
// stop is called; stop also closes the connection, and may be called again.
func dialRaw(ctx context.Context, addr string, desc *grpc.StreamDesc, method string) (st grpc.ClientStream, stop func(), err error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	stop = func() {
		cancel()
		_ = conn.Close()
	}
	if st, err = conn.NewStream(ctx, desc, method, grpc.ForceCodec(rawCodec{})); err != nil {
		stop()
		return nil, nil, err
	}
	return st, stop, nil
}

// heartbeat calls send every interval until ctx ends or send fails.
func heartbeat(ctx context.Context, every time.Duration, send func() error) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			if send() != nil {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

// rawMsg is a message already encoded: rawCodec sends it as it is.
type rawMsg []byte

// rawCodec sends rawMsg unchanged and everything else as protobuf; it
// answers to "proto", so the wire is what the node expects.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	if b, ok := v.(rawMsg); ok {
		return b, nil
	}
	return proto.Marshal(v.(proto.Message))
}

func (rawCodec) Unmarshal(data []byte, v any) error { return proto.Unmarshal(data, v.(proto.Message)) }

func (rawCodec) Name() string { return "proto" }

var _ encoding.Codec = rawCodec{}
