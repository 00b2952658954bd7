package worker

import (
	"sync"
	"sync/atomic"

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
// written it, as it would have the frame's alone.
//
// The headers are the batch's, and a batch is reused (batchPool) once
// gRPC let go of all of it: the headers' references are counted on the
// batch, and the last header in bufs, an empty one, is the last buffer
// every holder frees (gRPC's writer frees the buffers in order as it
// writes them, the others all at once), so the count reaches zero only
// when nothing reads bufs any more.
type batch struct {
	bufs mem.BufferSlice
	hdrs [maxBatchFrames + 1]batchHeader
	// hb holds the headers' bytes: the batch's field and each frame's, a
	// tag and a length each (a frame in a batch is at most maxBatchBytes:
	// its length takes 3 bytes, the batch's body's too).
	hb [(1 + maxBatchFrames) * (1 + 3)]byte
	// refs counts the references to the headers in bufs.
	refs atomic.Int32
}

// batchHeader is a header's bytes in bufs: a mem.Buffer whose references
// are counted on its batch. gRPC's send path reads a buffer through
// ReadOnlyData and Len only (as for an arena's view).
type batchHeader struct {
	mem.SliceBuffer
	b *batch
}

// Ref implements mem.Buffer.
func (h *batchHeader) Ref() { h.b.refs.Add(1) }

// Free implements mem.Buffer.
func (h *batchHeader) Free() {
	switch n := h.b.refs.Add(-1); {
	case n == 0:
		h.b.recycle()
	case n < 0:
		panic("worker: batch freed twice")
	}
}

var batchPool = sync.Pool{New: func() any {
	b := &batch{bufs: make(mem.BufferSlice, 0, 2*maxBatchFrames+1)}
	for i := range b.hdrs {
		b.hdrs[i].b = b
	}
	return b
}}

// recycle drops the batch's frames and returns it to the pool.
func (b *batch) recycle() {
	clear(b.bufs)
	b.bufs = b.bufs[:0]
	batchPool.Put(b)
}

// newBatch puts fs together, in order: at most maxBatchFrames frames, each
// at most maxBatchBytes (the queue's take). Each frame's buffer goes to
// the batch: fs are not to be sent again.
func newBatch(fs []*frame) *batch {
	body := 0
	for _, f := range fs {
		n := f.buf[0].Len()
		body += protowire.SizeTag(fieldBatchMessages) + protowire.SizeVarint(uint64(n)) + n
	}
	b := batchPool.Get().(*batch)
	hb := protowire.AppendVarint(protowire.AppendTag(b.hb[:0], fieldBatch, protowire.BytesType), uint64(body))
	start := 0
	for i, f := range fs {
		hb = protowire.AppendTag(hb, fieldBatchMessages, protowire.BytesType)
		hb = protowire.AppendVarint(hb, uint64(f.buf[0].Len()))
		b.hdrs[i].SliceBuffer = hb[start:len(hb):len(hb)]
		start = len(hb)
		b.bufs = append(b.bufs, &b.hdrs[i], f.buf[0])
	}
	if &hb[0] != &b.hb[0] {
		panic("worker: batch headers outgrew their array")
	}
	last := &b.hdrs[len(fs)]
	last.SliceBuffer = nil
	b.bufs = append(b.bufs, last)
	// The references of bufs, which the codec hands gRPC.
	b.refs.Store(int32(len(fs) + 1))
	return b
}
