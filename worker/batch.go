package worker

import (
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// WorkerMessage's batch field, and Batch's messages.
const (
	fieldBatch         protowire.Number = 9
	fieldBatchMessages protowire.Number = 1
)

// batch is several frames sent as one WorkerMessage holding a Batch, to a
// node that takes them (Registered.accepts_batches). It is the frames'
// own buffers, each behind the few bytes of its field header: the frames'
// bytes are not copied, and gRPC frees each frame's buffer once it has
// written it, as it would have the frame's alone. The headers are the
// batch's own memory, which the garbage collector keeps while gRPC holds
// the batch.
type batch struct {
	bufs mem.BufferSlice
}

// newBatch puts fs together, in order. Each frame's buffer goes to the
// batch: fs are not to be sent again.
func newBatch(fs []*frame) *batch {
	body, hdrs := 0, 0
	for _, f := range fs {
		n := f.buf[0].Len()
		h := protowire.SizeTag(fieldBatchMessages) + protowire.SizeVarint(uint64(n))
		body += h + n
		hdrs += h
	}
	first := protowire.SizeTag(fieldBatch) + protowire.SizeVarint(uint64(body))
	// Sized exactly: the headers' views into hb stay valid while it fills.
	hb := make([]byte, 0, first+hdrs)
	hb = protowire.AppendVarint(protowire.AppendTag(hb, fieldBatch, protowire.BytesType), uint64(body))
	views := make([]mem.SliceBuffer, len(fs))
	b := &batch{bufs: make(mem.BufferSlice, 0, 2*len(fs))}
	start := 0
	for i, f := range fs {
		hb = protowire.AppendTag(hb, fieldBatchMessages, protowire.BytesType)
		hb = protowire.AppendVarint(hb, uint64(f.buf[0].Len()))
		views[i] = hb[start:len(hb):len(hb)]
		start = len(hb)
		// By pointer: no allocation for the interface.
		b.bufs = append(b.bufs, &views[i], f.buf[0])
	}
	return b
}
