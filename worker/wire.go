package worker

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	protobuf "google.golang.org/protobuf/proto"

	"github.com/switchyard/switchyard/internal/pbcodec"
	"github.com/switchyard/switchyard/internal/pbwire"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// A frame is one WorkerMessage already encoded for the stream, which the
// session's codec sends as it is. A session sends frames only; it encodes
// each message once, when it is put in the queue, with no message structs
// and no reflection. A frame is immutable once made (gRPC may still be
// writing it after the send returned). A job's frames are views of its
// arena (arena.go) and are sent once: gRPC frees each view when it has
// written it. Other frames (sliceFrame) hold their bytes and may be sent
// again, as the heartbeat is.
type frame struct {
	// buf is what the codec hands gRPC.
	buf [1]mem.Buffer
}

// sliceFrame is a frame with its bytes: its own allocation, which gRPC's
// Free leaves alone.
type sliceFrame struct {
	frame
	data mem.SliceBuffer
	// small holds data when it fits: such a frame is one allocation (128
	// bytes in all).
	small [88]byte
}

// newFrame returns a frame of n bytes, for the caller to fill in data.
func newFrame(n int) *sliceFrame {
	f := new(sliceFrame)
	if n <= len(f.small) {
		f.data = f.small[:0:n]
	} else {
		f.data = make([]byte, 0, n)
	}
	return f
}

// done seals f once data is written.
func (f *sliceFrame) done(data []byte) *frame {
	f.data = data
	f.buf[0] = &f.data // by pointer: no allocation for the interface
	return &f.frame
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
// messages (Accept, Reject, Output, Complete, Fail), into a frame of its
// own: the messages of a job without an arena (a Reject).
func jobFrame[T string | []byte](field protowire.Number, id string, gen uint64, f3 T, f4 string) *frame {
	f := newFrame(jobSize(field, id, gen, f3, f4))
	return f.done(appendJob(f.data, field, id, gen, f3, f4))
}

// jobSize is the size of the job message appendJob appends.
func jobSize[T string | []byte](field protowire.Number, id string, gen uint64, f3 T, f4 string) int {
	return protowire.SizeTag(field) + protowire.SizeBytes(jobBodySize(id, gen, f3, f4))
}

func jobBodySize[T string | []byte](id string, gen uint64, f3 T, f4 string) int {
	n := pbwire.SizeLen(1, len(id)) + pbwire.SizeLen(3, len(f3)) + pbwire.SizeLen(4, len(f4))
	if gen != 0 {
		n += protowire.SizeTag(2) + protowire.SizeVarint(gen)
	}
	return n
}

// appendJob appends a WorkerMessage whose oneof is field, one of the job
// messages: each is job_id = 1, generation = 2, then up to two string or
// bytes fields, 3 and 4. It encodes as proto.Marshal does, a zero field
// left out, so the bytes are those of the equivalent message struct.
func appendJob[T string | []byte](b []byte, field protowire.Number, id string, gen uint64, f3 T, f4 string) []byte {
	b = protowire.AppendTag(b, field, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(jobBodySize(id, gen, f3, f4)))
	b = pbwire.AppendLen(b, 1, id)
	if gen != 0 {
		b = protowire.AppendVarint(protowire.AppendTag(b, 2, protowire.VarintType), gen)
	}
	b = pbwire.AppendLen(b, 3, f3)
	return pbwire.AppendLen(b, 4, f4)
}

// messageFrame encodes any WorkerMessage (the rare ones: capability
// updates, heartbeats).
func messageFrame(m *pb.WorkerMessage) (*frame, error) {
	b, err := protobuf.Marshal(m)
	if err != nil {
		return nil, err
	}
	return new(sliceFrame).done(b), nil
}

// frameCodec is the session stream's codec: a frame goes out as it is,
// a batch as its header bytes and its frames' buffers,
// anything else (the Register) and what the node sends through the
// session codec of internal/pbcodec, their vtproto code instead of proto's
// reflection. It answers to the name "proto", so the wire is unchanged.
// It refuses a NodeMessage holding a string that is not UTF-8, as proto's
// decoder would: the stream then ends with an error and the session
// reconnects. The SDK trusts its node, but a handler is promised what
// proto promises (Job's strings are valid UTF-8), and the check costs
// little next to the decoding it stands beside.
type frameCodec struct{ pbcodec.SessionCodec }

func (c frameCodec) Marshal(v any) (mem.BufferSlice, error) {
	switch v := v.(type) {
	case *frame:
		return v.buf[:], nil
	case *batch:
		return v.bufs, nil
	}
	return c.SessionCodec.Marshal(v)
}

// withFrames is the call option that makes a stream send frames.
func withFrames() grpc.CallOption { return grpc.ForceCodecV2(withFramesCodec()) }

func withFramesCodec() frameCodec { return frameCodec{pbcodec.NewSession()} }

// heartbeatFrame is a Heartbeat, encoded once.
var heartbeatFrame = func() *frame {
	f, err := messageFrame(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Heartbeat{Heartbeat: &pb.Heartbeat{}}})
	if err != nil {
		panic(err)
	}
	return f
}()
