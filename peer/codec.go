package peer

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
)

// vtMessage is what protoc-gen-go-vtproto generates for each of our
// messages (make proto): size, marshal and unmarshal as plain code, with
// no reflection over the message's descriptor.
type vtMessage interface {
	Reset()
	SizeVT() int
	MarshalToSizedBufferVT(dAtA []byte) (int, error)
	UnmarshalVT(dAtA []byte) error
}

// codec is the peer connections' gRPC codec, on both ends (the server's
// forced codec, the client's default call option). A message of ours
// goes through its generated vtproto code, which makes the same bytes as
// proto's codec in a fraction of the time: proto's Size and Marshal walk
// the message by reflection, twice for a message under 1 KiB, and were
// about a quarter of a consumer host's CPU under load (docs/perf.md). Any
// other message goes through proto's codec.
//
// vtproto's decoder does not check that strings are UTF-8, where proto's
// rejects the message. That check stays where it matters: a node checks
// every message it queues for a peer (wireValid) and reports one without
// a wire form as undeliverable, and only authenticated nodes reach this
// codec.
type codec struct{ proto encoding.CodecV2 }

func newCodec() codec { return codec{proto: encoding.GetCodecV2(protocodec.Name)} }

// Marshal encodes v into one buffer: freshly allocated below gRPC's
// pooling threshold, as proto's codec does, else from the default pool.
func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(vtMessage)
	if !ok {
		return c.proto.Marshal(v)
	}
	size := m.SizeVT()
	if mem.IsBelowBufferPoolingThreshold(size) {
		buf := make([]byte, size)
		if _, err := m.MarshalToSizedBufferVT(buf); err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(buf)}, nil
	}
	pool := mem.DefaultBufferPool()
	buf := pool.Get(size)
	if _, err := m.MarshalToSizedBufferVT(*buf); err != nil {
		pool.Put(buf)
		return nil, err
	}
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

// Unmarshal decodes data into v, replacing what v held (as proto.Unmarshal
// does; vtproto's UnmarshalVT alone would merge). The decoded message
// copies what it keeps, so data may be reused once this returns.
func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(vtMessage)
	if !ok {
		return c.proto.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	m.Reset()
	return m.UnmarshalVT(buf.ReadOnlyData())
}

// Name is proto's: the content subtype on the wire is unchanged, so a node
// built without this codec reads what one with it writes, and back.
func (c codec) Name() string { return c.proto.Name() }

// serverCodec and callCodec put the codec on the peer server and on every
// call of a peer client.
func serverCodec() grpc.ServerOption { return grpc.ForceServerCodecV2(newCodec()) }
func callCodec() grpc.CallOption     { return grpc.ForceCodecV2(newCodec()) }
