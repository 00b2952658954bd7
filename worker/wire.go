package worker

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	protobuf "google.golang.org/protobuf/proto"

	"github.com/switchyard/switchyard/internal/pbwire"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// A frame is one WorkerMessage already encoded for the stream, which the
// session's codec sends as it is. A session sends frames only; it encodes
// each message once, when it is put in the queue, with no message structs
// and no reflection. A frame is immutable once made (gRPC may still be
// writing it after the send returned) and may be sent again, as the
// heartbeat is.
type frame struct {
	// buf is what the codec hands gRPC: data, by pointer (no allocation
	// for the interface).
	buf  [1]mem.Buffer
	data mem.SliceBuffer
	// small holds data when it fits: a usual output is then one
	// allocation, the frame (128 bytes in all).
	small [88]byte
}

// newFrame returns a frame of n bytes, for the caller to fill in data.
func newFrame(n int) *frame {
	f := new(frame)
	if n <= len(f.small) {
		f.data = f.small[:0:n]
	} else {
		f.data = make([]byte, 0, n)
	}
	return f
}

// done seals f once data is written.
func (f *frame) done(data []byte) *frame {
	f.data = data
	f.buf[0] = &f.data
	return f
}

// WorkerMessage's oneof fields.
const (
	fieldAccept   protowire.Number = 2
	fieldReject   protowire.Number = 3
	fieldOutput   protowire.Number = 4
	fieldComplete protowire.Number = 5
	fieldFail     protowire.Number = 6
)

// jobFrame encodes a WorkerMessage whose oneof is field, one of the job
// messages (Accept, Reject, Output, Complete, Fail): each is job_id = 1,
// generation = 2, then up to two string or bytes fields, 3 and 4. It
// encodes as proto.Marshal does, a zero field left out, so the bytes are
// those of the equivalent message struct.
func jobFrame[T string | []byte](field protowire.Number, id string, gen uint64, f3 T, f4 string) *frame {
	n := pbwire.SizeLen(1, len(id)) + pbwire.SizeLen(3, len(f3)) + pbwire.SizeLen(4, len(f4))
	if gen != 0 {
		n += protowire.SizeTag(2) + protowire.SizeVarint(gen)
	}
	f := newFrame(protowire.SizeTag(field) + protowire.SizeBytes(n))
	b := f.data
	b = protowire.AppendTag(b, field, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(n))
	b = pbwire.AppendLen(b, 1, id)
	if gen != 0 {
		b = protowire.AppendVarint(protowire.AppendTag(b, 2, protowire.VarintType), gen)
	}
	b = pbwire.AppendLen(b, 3, f3)
	b = pbwire.AppendLen(b, 4, f4)
	return f.done(b)
}

// messageFrame encodes any WorkerMessage (the rare ones: capability
// updates, heartbeats).
func messageFrame(m *pb.WorkerMessage) (*frame, error) {
	b, err := protobuf.Marshal(m)
	if err != nil {
		return nil, err
	}
	return new(frame).done(b), nil
}

// frameCodec is the session stream's codec: a frame goes out as it is,
// anything else (the Register, what the node sends) as protobuf by gRPC's
// own codec. It answers to the name "proto", so the wire is unchanged.
type frameCodec struct{ encoding.CodecV2 }

func (c frameCodec) Marshal(v any) (mem.BufferSlice, error) {
	if f, ok := v.(*frame); ok {
		return f.buf[:], nil
	}
	return c.CodecV2.Marshal(v)
}

// withFrames is the call option that makes a stream send frames.
func withFrames() grpc.CallOption {
	return grpc.ForceCodecV2(frameCodec{encoding.GetCodecV2(proto.Name)})
}

// heartbeatFrame is a Heartbeat, encoded once.
var heartbeatFrame = func() *frame {
	f, err := messageFrame(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Heartbeat{Heartbeat: &pb.Heartbeat{}}})
	if err != nil {
		panic(err)
	}
	return f
}()
