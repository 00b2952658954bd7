// Package pbcodec is the gRPC codec for our messages: each goes through
// the size, marshal and unmarshal code protoc-gen-go-vtproto generates
// for it (make proto), anything else through gRPC's proto codec. The
// bytes and the content subtype are proto's, so either end may use it
// alone.
//
// vtproto's code does not check that strings are UTF-8, where proto
// refuses such a message both ways. The codec checks a worker session's
// two message types both ways (sessions.go), since a worker or its node
// may send anything; the peer connections' messages it does not, since
// every node checks what it queues for a peer and only authenticated
// nodes reach the codec. CheckUTF8 walks any message by reflection.
package pbcodec

import (
	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"

	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// Message is what protoc-gen-go-vtproto generates for each of our
// messages, with the Reset every generated message has.
type Message interface {
	Reset()
	SizeVT() int
	MarshalToSizedBufferVT(dAtA []byte) (int, error)
	UnmarshalVT(dAtA []byte) error
}

// Codec is an encoding.CodecV2 (see the package comment).
type Codec struct{ proto encoding.CodecV2 }

// New returns the codec.
func New() Codec { return Codec{proto: encoding.GetCodecV2(protocodec.Name)} }

// Marshal encodes v into one buffer: freshly allocated below gRPC's
// pooling threshold, as proto's codec does, else from the default pool.
// It sizes the message once, where proto's codec sizes a message under
// that threshold twice, by reflection.
func (c Codec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(Message)
	if !ok {
		return c.proto.Marshal(v)
	}
	if err := sessionUTF8(v); err != nil {
		return nil, err
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
// does; UnmarshalVT alone would merge). The decoded message copies what
// it keeps, so data may be reused once this returns.
func (c Codec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(Message)
	if !ok {
		return c.proto.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	m.Reset()
	if err := m.UnmarshalVT(buf.ReadOnlyData()); err != nil {
		return err
	}
	return sessionUTF8(v)
}

// Name is proto's: the content subtype on the wire is unchanged.
func (c Codec) Name() string { return c.proto.Name() }

// SessionCodec is the codec of a worker session's stream, on the node's
// end and the Go worker SDK's: a NodeMessage or a WorkerMessage goes
// through Codec (its strings checked for UTF-8), anything else through
// proto's codec, which checks every string where vtproto's code does not
// (a JobService request on the same server, say).
type SessionCodec struct{ c Codec }

// NewSession returns the codec.
func NewSession() SessionCodec { return SessionCodec{New()} }

// Marshal encodes v.
func (s SessionCodec) Marshal(v any) (mem.BufferSlice, error) {
	if isSession(v) {
		return s.c.Marshal(v)
	}
	return s.c.proto.Marshal(v)
}

// Unmarshal decodes data into v, replacing what v held.
func (s SessionCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if isSession(v) {
		return s.c.Unmarshal(data, v)
	}
	return s.c.proto.Unmarshal(data, v)
}

// Name is proto's: the content subtype on the wire is unchanged.
func (s SessionCodec) Name() string { return s.c.Name() }

func isSession(v any) bool {
	switch v.(type) {
	case *pb.NodeMessage, *pb.WorkerMessage:
		return true
	}
	return false
}
