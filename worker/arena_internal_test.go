package worker

import (
	"bytes"
	"strings"
	"testing"

	"google.golang.org/grpc/mem"
)

// countingPool is a buffer pool that counts what it lends and gets back.
type countingPool struct {
	out  int
	pool mem.BufferPool
}

func (p *countingPool) Get(n int) *[]byte { p.out++; return p.pool.Get(n) }
func (p *countingPool) Put(b *[]byte)     { p.out--; p.pool.Put(b) }

// A job's frames made in its arena are byte for byte those jobFrame makes,
// across chunks and for a message larger than half a chunk, and every
// chunk goes back to the pool once gRPC freed each frame and the job
// released the arena, whichever comes last.
func TestArenaFrames(t *testing.T) {
	for _, releaseFirst := range []bool{false, true} {
		p := &countingPool{pool: mem.NewTieredBufferPool(arenaChunk, 64<<10)}
		a := &arena{pool: p}
		var frames []*frame
		check := func(got, want *frame) {
			t.Helper()
			if g, w := got.buf[0].ReadOnlyData(), want.buf[0].ReadOnlyData(); !bytes.Equal(g, w) {
				t.Fatalf("arena frame %x, jobFrame %x", g, w)
			}
			frames = append(frames, got)
		}
		check(arenaFrame(a, fieldAccept, "job-1", 7, "", ""), jobFrame(fieldAccept, "job-1", 7, "", ""))
		for i := range 3 * arenaFrames { // more than a chunk, and than the inline headers
			data := []byte(`"` + strings.Repeat("w", i*7) + `"`)
			check(arenaFrame(a, fieldOutput, "job-1", 7, data, ""), jobFrame(fieldOutput, "job-1", 7, data, ""))
		}
		big := []byte(`"` + strings.Repeat("b", arenaChunk) + `"`)
		check(arenaFrame(a, fieldOutput, "job-1", 7, big, ""), jobFrame(fieldOutput, "job-1", 7, big, ""))
		check(arenaFrame(a, fieldFail, "job-1", 7, "code", "message"), jobFrame(fieldFail, "job-1", 7, "code", "message"))
		if p.out < 3 {
			t.Fatalf("%d buffers lent: the test made too few frames to cross chunks", p.out)
		}
		if releaseFirst {
			a.release()
		}
		for _, f := range frames {
			// As gRPC does: a reference for its writer, the send's own
			// dropped when SendMsg returns, the writer's once written.
			f.buf[0].Ref()
			f.buf[0].Free()
			f.buf[0].Free()
		}
		if !releaseFirst {
			if p.out != 1 {
				t.Fatalf("%d buffers out before the release, want the current chunk only", p.out)
			}
			a.release()
		}
		if p.out != 0 {
			t.Fatalf("%d buffers not returned to the pool", p.out)
		}
	}
}

// A frame's view counts gRPC's references: its chunk stays out of the
// pool until the last is freed, and a Free past it, or a Ref after it,
// panics as gRPC's own buffers do.
func TestArenaViewRefs(t *testing.T) {
	p := &countingPool{pool: mem.NewTieredBufferPool(arenaChunk, 64<<10)}
	a := &arena{pool: p}
	f := arenaFrame(a, fieldOutput, "job-1", 7, []byte(`"w"`), "")
	a.release()
	b := f.buf[0]
	b.Ref()
	b.Ref()
	b.Free()
	b.Free()
	if p.out != 1 {
		t.Fatalf("%d buffers out with a reference left, want 1", p.out)
	}
	b.Free()
	if p.out != 0 {
		t.Fatalf("%d buffers out after the last Free, want 0", p.out)
	}
	mustPanic := func(what string, fn func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Fatalf("%s did not panic", what)
			}
		}()
		fn()
	}
	mustPanic("Free after the last", b.Free)
	g := arenaFrame(&arena{pool: p}, fieldOutput, "job-1", 7, []byte(`"w"`), "")
	g.buf[0].Free()
	mustPanic("Ref after the last Free", g.buf[0].Ref)
}
