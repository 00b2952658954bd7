package worker

import (
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// arenaChunk is the size of the pooled chunk a job's frames are encoded
// into: a usual job's (an Accept, a few dozen small outputs, the end)
// fit in one.
const arenaChunk = 4 << 10

// arenaFrames is how many frame headers a job holds inline; frames past
// them are allocated.
const arenaFrames = 20

// arena is where a job's frames are made: their bytes go into a chunk of
// gRPC's buffer pool that they share as views, and their headers into an
// array of the job's. gRPC frees each view once it has written it; the
// chunk returns to the pool when every view is freed and the job released
// its own hold (release). A frame outlives the send that queued it, so it
// must not be made in memory that is reused: the headers stay with the
// job, which the garbage collector keeps while gRPC holds one of them,
// and the chunk is reference-counted. So a job's outputs cost no
// allocation of their own, where a frame each made garbage for the
// collector.
//
// It is not safe for concurrent use: the job's Output guards it.
type arena struct {
	pool mem.BufferPool
	// root holds the current chunk until release (nil: none); chunk is
	// its bytes, of which those from off on are unused.
	root  mem.Buffer
	chunk []byte
	off   int

	frames [arenaFrames]frame
	used   int
}

// jobFrame is the arena's jobFrame: the same bytes, in a view of its
// chunk.
func arenaFrame[T string | []byte](a *arena, field protowire.Number, id string, gen uint64, f3 T, f4 string) *frame {
	n := jobSize(field, id, gen, f3, f4)
	if n > arenaChunk/2 {
		// A large message (a big output) gets a buffer of its own.
		f := a.header()
		buf := a.pool.Get(n)
		*buf = appendJob((*buf)[:0], field, id, gen, f3, f4)
		f.buf[0] = mem.NewBuffer(buf, a.pool)
		return f
	}
	if len(a.chunk)-a.off < n {
		a.release()
		buf := a.pool.Get(arenaChunk)
		a.root, a.chunk = mem.NewBuffer(buf, a.pool), *buf
	}
	start := a.off
	appendJob(a.chunk[start:start], field, id, gen, f3, f4)
	a.off += n
	f := a.header()
	f.buf[0] = a.root.Slice(start, a.off)
	return f
}

// header returns a frame header not used before.
func (a *arena) header() *frame {
	if a.used == len(a.frames) {
		return new(frame)
	}
	a.used++
	return &a.frames[a.used-1]
}

// release drops the job's hold on its current chunk: no frame is made
// from it after.
func (a *arena) release() {
	if a.root != nil {
		a.root.Free()
		a.root, a.chunk, a.off = nil, nil, 0
	}
}
