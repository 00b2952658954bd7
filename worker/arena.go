package worker

import (
	"sync/atomic"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// arenaChunk is the size of the pooled chunk a job's frames are encoded
// into: a usual job's (an Accept, a few dozen small outputs, the end)
// fit in one.
const arenaChunk = 4 << 10

// arenaFrames is how many frames (header and view) a job holds inline;
// frames past them are allocated.
const arenaFrames = 20

// arena is where a job's frames are made: their bytes go into a chunk of
// gRPC's buffer pool that they share as views, and their headers and
// views into an array of the job's. gRPC frees each view once it has
// written it; the chunk returns to the pool when every view is freed and
// the job released its own hold (release). A frame outlives the send that
// queued it, so it must not be made in memory that is reused: the headers
// and views stay with the job, which the garbage collector keeps while
// gRPC holds one of them, and the chunk is reference-counted. So a job's
// outputs cost no allocation of their own, where a frame each made
// garbage for the collector, and no object of gRPC's pool either: a view
// of gRPC's own (mem.Buffer's Slice) is taken from a sync.Pool and put
// back by gRPC's writer, on another P, per frame.
//
// It is not safe for concurrent use: the job's Output guards it.
type arena struct {
	pool mem.BufferPool
	// cur is the current chunk (nil: none); its bytes from off on are
	// unused. made counts the views made of it.
	cur  *chunk
	off  int
	made int32
	// first is the job's first chunk: most jobs need no other.
	first chunk

	frames [arenaFrames]arenaFrameHeader
	used   int
}

// arenaFrameHeader is a frame made in an arena, and the view it sends.
type arenaFrameHeader struct {
	f frame
	v view
}

// chunkBias is what a chunk's count starts at, the arena's hold: more
// than the views an arena can make of a chunk (each at least a byte).
// The views made are subtracted from it on release, so making a view
// takes no atomic operation.
const chunkBias = 1 << 30

// chunk is a buffer of the pool that views share; it goes back to the
// pool when its count reaches zero.
type chunk struct {
	buf  *[]byte
	pool mem.BufferPool
	// refs is chunkBias while the arena holds the chunk, less the views
	// made of it and freed; on release, less chunkBias and plus the views
	// made: then the views not freed yet.
	refs atomic.Int32
}

func (c *chunk) add(n int32) {
	if c.refs.Add(n) == 0 {
		c.pool.Put(c.buf)
	}
}

// view is a frame's bytes in a chunk: a mem.Buffer whose references
// (gRPC's, while it writes the frame) are counted on the view, and whose
// last Free frees the view's part of the chunk. gRPC's send path reads a
// buffer through ReadOnlyData and Len only; Slice and the reads of the
// embedded SliceBuffer would hand out bytes without a reference.
type view struct {
	mem.SliceBuffer
	c *chunk
	// refs counts the references past the first (so a view is made with
	// no atomic store); -1 once the last is freed.
	refs atomic.Int32
}

// Ref implements mem.Buffer.
func (v *view) Ref() {
	if v.refs.Add(1) <= 0 {
		panic("worker: Ref of a freed frame")
	}
}

// Free implements mem.Buffer.
func (v *view) Free() {
	switch n := v.refs.Add(-1); {
	case n == -1:
		v.c.add(-1)
	case n < -1:
		panic("worker: frame freed twice")
	}
}

// arenaFrame is the arena's jobFrame: the same bytes, in a view of its
// chunk.
func arenaFrame[T string | []byte](a *arena, field protowire.Number, id string, gen uint64, f3 T, f4 string) *frame {
	n := jobSize(field, id, gen, f3, f4)
	h := a.header()
	if n > arenaChunk/2 {
		// A large message (a big output) gets a buffer of its own.
		buf := a.pool.Get(n)
		*buf = appendJob((*buf)[:0], field, id, gen, f3, f4)
		h.f.buf[0] = mem.NewBuffer(buf, a.pool)
		return &h.f
	}
	if a.cur == nil || len(*a.cur.buf)-a.off < n {
		a.release()
		c := &a.first
		if c.buf != nil {
			c = new(chunk)
		}
		c.buf, c.pool = a.pool.Get(arenaChunk), a.pool
		c.refs.Store(chunkBias)
		a.cur = c
	}
	start := a.off
	appendJob((*a.cur.buf)[start:start], field, id, gen, f3, f4)
	a.off += n
	a.made++
	h.v = view{SliceBuffer: (*a.cur.buf)[start:a.off], c: a.cur}
	h.f.buf[0] = &h.v
	return &h.f
}

// header returns a frame not used before.
func (a *arena) header() *arenaFrameHeader {
	if a.used == len(a.frames) {
		return new(arenaFrameHeader)
	}
	a.used++
	return &a.frames[a.used-1]
}

// release drops the job's hold on its current chunk: no frame is made
// from it after.
func (a *arena) release() {
	if a.cur != nil {
		a.cur.add(a.made - chunkBias)
		a.cur, a.off, a.made = nil, 0, 0
	}
}
