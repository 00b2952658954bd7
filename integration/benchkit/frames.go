package benchkit

import (
	"encoding/binary"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A frame is what the opaque relay floor (FrameNode, FrameIngress,
// RunFrameWorker) carries on every hop: one google.protobuf.BytesValue whose
// value is an 11-byte header, then the payload, which no hop reads.
//
//	0        8      10     11
//	| job id | seq  | flags | payload …
//	  u64 BE   u16 BE  u8
//
// The job id is the ingress's; seq numbers a job's answers from 0; flags
// say whether the frame is the job's last and whether it failed. A job goes
// from the ingress to the worker as one frame (seq 0, flags 0, the POST
// body as payload) and comes back as the frames the worker answers, the
// last one flagged frameLast. This is the shape of the reference kit's
// relay (../shared/bench, issue 31), so the floor costs what the kit's does.
const (
	frameHeaderLen = 11
	frameLast      = 1 << 0 // the job's last frame: hops forget the job
	frameFailed    = 1 << 1 // with frameLast: the job failed; payload says why
)

// frameHeader is a frame's header, decoded.
type frameHeader struct {
	id    uint64
	seq   uint16
	flags byte
}

// newFrame encodes a frame as a message ready for SendMsg.
func newFrame(h frameHeader, payload []byte) *wrapperspb.BytesValue {
	b := make([]byte, frameHeaderLen+len(payload))
	putFrameHeader(b, h)
	copy(b[frameHeaderLen:], payload)
	return &wrapperspb.BytesValue{Value: b}
}

func putFrameHeader(b []byte, h frameHeader) {
	binary.BigEndian.PutUint64(b, h.id)
	binary.BigEndian.PutUint16(b[8:], h.seq)
	b[10] = h.flags
}

// readFrame splits a frame into header and payload; ok is false when it is
// shorter than a header.
func readFrame(m *wrapperspb.BytesValue) (h frameHeader, payload []byte, ok bool) {
	b := m.GetValue()
	if len(b) < frameHeaderLen {
		return frameHeader{}, nil, false
	}
	return frameHeader{binary.BigEndian.Uint64(b), binary.BigEndian.Uint16(b[8:]), b[10]}, b[frameHeaderLen:], true
}

// encodedFrame is a frame already encoded as BytesValue wire bytes, with the
// offset of its header, so a sender can copy it and patch in the job id
// instead of marshalling (RunFrameWorker).
type encodedFrame struct {
	wire []byte
	at   int // where the header starts in wire
}

func encodeFrame(h frameHeader, payload []byte) encodedFrame {
	n := frameHeaderLen + len(payload)
	wire := protowire.AppendTag(nil, 1, protowire.BytesType)
	wire = protowire.AppendVarint(wire, uint64(n))
	at := len(wire)
	wire = append(wire, make([]byte, frameHeaderLen)...)
	putFrameHeader(wire[at:], h)
	return encodedFrame{append(wire, payload...), at}
}

// forJob is a copy of f for job id, as a message of its own (gRPC may
// write it after SendMsg returns).
func (f encodedFrame) forJob(id uint64) rawMsg {
	b := make([]byte, len(f.wire))
	copy(b, f.wire)
	binary.BigEndian.PutUint64(b[f.at:], id)
	return b
}

const (
	frameService = "switchyard.bench.v1.FrameRelay"
	// frameForward carries jobs from an ingress to the node and their
	// answers back; frameAttach carries them from the node to its worker
	// and the answers back. Both are bidi streams of BytesValue frames.
	frameForward = "/" + frameService + "/Forward"
	frameAttach  = "/" + frameService + "/Attach"
)

// frameDesc registers both streams by hand (no .proto: the messages are
// google.protobuf.BytesValue) on a *FrameNode.
var frameDesc = grpc.ServiceDesc{
	ServiceName: frameService,
	HandlerType: (*any)(nil),
	Streams: []grpc.StreamDesc{
		{
			StreamName: "Forward", ServerStreams: true, ClientStreams: true,
			Handler: func(srv any, ss grpc.ServerStream) error { return srv.(*FrameNode).forward(ss) },
		},
		{
			StreamName: "Attach", ServerStreams: true, ClientStreams: true,
			Handler: func(srv any, ss grpc.ServerStream) error { return srv.(*FrameNode).attach(ss) },
		},
	},
}
