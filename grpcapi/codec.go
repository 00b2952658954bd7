package grpcapi

import (
	"errors"
	"unicode/utf8"

	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// codec is the public gRPC server's codec (grpc.ForceServerCodecV2): gRPC's
// proto codec, but for the job events a stream's writer sends (wireEvent),
// which it encodes itself. The bytes are proto's; the clients' codec is
// unchanged.
type codec struct{ proto encoding.CodecV2 }

func newCodec() codec { return codec{proto: encoding.GetCodecV2(protocodec.Name)} }

// Marshal encodes v.
func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if w, ok := v.(*wireEvent); ok {
		return w.marshal()
	}
	return c.proto.Marshal(v)
}

// Unmarshal decodes data into v.
func (c codec) Unmarshal(data mem.BufferSlice, v any) error { return c.proto.Unmarshal(data, v) }

// Name is proto's: the content subtype is unchanged.
func (c codec) Name() string { return c.proto.Name() }

// wireChunk is the size of the pooled buffers a stream's writer encodes its
// events into (one of the default buffer pool's tiers).
const wireChunk = 4 << 10

var errInvalidUTF8 = errors.New("grpcapi: string field contains invalid UTF-8")

// wireEvent is the JobEvent a job stream's writer sends. The server's codec
// encodes it without proto's reflection, into a pooled chunk the events of
// one batch share: each message is a view of the chunk, which returns to
// the pool once gRPC wrote every view and the writer released it (release,
// at each flush and when the stream ends). That is two allocations fewer
// per message than proto's codec, which allocates a buffer for every
// message under 1 KiB. Any other codec marshals the embedded JobEvent.
//
// Only the writer touches it; Marshal runs within its Send.
type wireEvent struct {
	pb.JobEvent
	pool mem.BufferPool
	// root is the current chunk, held until release (nil: none); chunk is
	// its bytes, of which those from off on are unused.
	root  mem.Buffer
	chunk []byte
	off   int
}

// set sets every field of the event.
func (w *wireEvent) set(kind, job string, gen, seq, snap, attempt uint64, token string, data []byte) {
	e := &w.JobEvent
	e.Kind, e.JobId, e.Generation, e.Seq, e.Snapshot, e.Attempt, e.ResumeToken, e.DataJson = kind, job, gen, seq, snap, attempt, token, data
}

// release drops the writer's hold on its current chunk.
func (w *wireEvent) release() {
	if w.root != nil {
		w.root.Free()
		w.root, w.chunk, w.off = nil, nil, 0
	}
}

// marshal encodes the event as proto would (fields in number order, zero
// values left out).
func (w *wireEvent) marshal() (mem.BufferSlice, error) {
	e := &w.JobEvent
	if !utf8.ValidString(e.Kind) || !utf8.ValidString(e.JobId) || !utf8.ValidString(e.ResumeToken) {
		return nil, errInvalidUTF8
	}
	n := sizeString(e.Kind) + sizeString(e.JobId) + sizeUint(e.Generation) + sizeUint(e.Seq) +
		sizeUint(e.Snapshot) + sizeUint(e.Attempt) + sizeString(e.ResumeToken) + sizeString(e.DataJson)
	switch {
	case n == 0:
		return nil, nil
	case n > wireChunk/2:
		// A large event (a big output) gets a buffer of its own.
		buf := w.pool.Get(n)
		*buf = w.append((*buf)[:0])
		return mem.BufferSlice{mem.NewBuffer(buf, w.pool)}, nil
	case len(w.chunk)-w.off < n:
		w.release()
		buf := w.pool.Get(wireChunk)
		w.root, w.chunk = mem.NewBuffer(buf, w.pool), *buf
	}
	start := w.off
	w.append(w.chunk[start:start])
	w.off += n
	return mem.BufferSlice{w.root.Slice(start, w.off)}, nil
}

// append appends the encoded event to b.
func (w *wireEvent) append(b []byte) []byte {
	e := &w.JobEvent
	b = appendString(b, 1, e.Kind)
	b = appendString(b, 2, e.JobId)
	b = appendUint(b, 3, e.Generation)
	b = appendUint(b, 4, e.Seq)
	b = appendUint(b, 5, e.Snapshot)
	b = appendUint(b, 6, e.Attempt)
	b = appendString(b, 7, e.ResumeToken)
	return appendString(b, 8, e.DataJson)
}

// The fields are numbered 1 to 8: every tag is one byte.

func sizeString[S string | []byte](s S) int {
	if len(s) == 0 {
		return 0
	}
	return 1 + protowire.SizeBytes(len(s))
}

func sizeUint(v uint64) int {
	if v == 0 {
		return 0
	}
	return 1 + protowire.SizeVarint(v)
}

func appendString[S string | []byte](b []byte, num protowire.Number, s S) []byte {
	if len(s) == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendUint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
}
