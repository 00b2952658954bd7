package worker

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/mem"
	protobuf "google.golang.org/protobuf/proto"

	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// TestSendQueueHoldsForReadyJobs: a put flushes at once while no job is
// ready to start; while one is, frames stay queued (up to holdLimit) and
// the start of the last ready job sends them, in the order they were put.
func TestSendQueueHoldsForReadyJobs(t *testing.T) {
	var sent []*frame
	q := newSendQueue(1024, func(f *frame) error { sent = append(sent, f); return nil }, nil, func(error) {})
	put := func() (*frame, bool) {
		f := jobFrame(fieldOutput, "job", 1, `"x"`, "")
		hold, ok := q.put(f, nil, nil)
		if !ok {
			t.Fatal("put refused")
		}
		return f, hold
	}

	// Alone: every put is to be flushed.
	if _, hold := put(); hold {
		t.Fatal("a put with no job ready holds its frame")
	}
	if err := q.flush(flushLimit); err != nil || len(sent) != 1 {
		t.Fatalf("flush: %v, %d sent", err, len(sent))
	}

	// Two jobs ready: frames wait for the second to start.
	sent = nil
	q.readied()
	q.readied()
	var want []*frame
	for range 3 {
		f, hold := put()
		if !hold {
			t.Fatal("a put with jobs ready does not hold")
		}
		want = append(want, f)
	}
	q.started()
	if len(sent) != 0 {
		t.Fatalf("%d frames sent with a job still ready", len(sent))
	}
	q.started()
	if len(sent) != len(want) {
		t.Fatalf("the last ready job's start sent %d frames, want %d", len(sent), len(want))
	}
	for i := range want {
		if sent[i] != want[i] {
			t.Fatalf("frame %d sent out of order", i)
		}
	}

	// Held frames are bounded: the put that reaches holdLimit flushes.
	q.readied()
	for i := 1; i <= holdLimit; i++ {
		if _, hold := put(); hold != (i < holdLimit) {
			t.Fatalf("put %d of %d: hold = %v", i, holdLimit, hold)
		}
	}
	q.started()
}

// batchQueue is a queue to a node that takes batches, recording what it
// sends: each message's frames, a lone frame as one.
func batchQueue(t *testing.T) (*sendQueue, *[][]*frame, *[]*batch) {
	var msgs [][]*frame
	var batches []*batch
	q := newSendQueue(1024, func(f *frame) error { msgs = append(msgs, []*frame{f}); return nil },
		func(b *batch) error {
			// The batch's buffers are header, frame, header, frame...
			var fs []*frame
			for i := 1; i < len(b.bufs); i += 2 {
				fs = append(fs, &frame{buf: [1]mem.Buffer{b.bufs[i]}})
			}
			msgs = append(msgs, fs)
			batches = append(batches, b)
			return nil
		}, func(err error) { t.Fatalf("send failed: %v", err) })
	return q, &msgs, &batches
}

// wireOf is what the stream's codec sends for m, a frame or a batch.
func wireOf(t *testing.T, m any) []byte {
	t.Helper()
	bs, err := withFramesCodec().Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return bs.Materialize()
}

// TestSendQueueBatches: to a node that takes batches, the frames a
// flusher finds queued together go as one Batch, in order, byte for byte
// the frames' messages, and their arena's chunks go back to the pool, the
// batch to its own, once gRPC freed the batch's buffers; a lone frame
// goes alone, at once.
func TestSendQueueBatches(t *testing.T) {
	q, msgs, batches := batchQueue(t)
	p := &countingPool{pool: mem.NewTieredBufferPool(arenaChunk, 64<<10)}
	a := &arena{pool: p}

	// Alone: sent at once, as itself.
	f := arenaFrame(a, fieldAccept, "job-1", 3, "", "")
	if hold, _ := q.put(f, nil, nil); hold {
		t.Fatal("a lone frame held")
	}
	if err := q.flush(flushLimit); err != nil || len(*msgs) != 1 || len(*batches) != 0 || (*msgs)[0][0] != f {
		t.Fatalf("flush: %v; sent %v, %d batches: want the frame alone", err, *msgs, len(*batches))
	}
	f.buf[0].Free()

	// Queued together (held for a ready job): one batch, in order.
	*msgs = nil
	q.readied()
	var want []*frame
	for i := range 5 {
		f := arenaFrame(a, fieldOutput, "job-1", 3, []byte(strconv.Itoa(i)), "")
		want = append(want, f)
		if hold, _ := q.put(f, nil, nil); !hold {
			t.Fatal("a put with a job ready does not hold")
		}
	}
	f = jobFrame(fieldReject, "job-2", 1, "busy", "") // a frame of its own, not the arena's
	want = append(want, f)
	q.put(f, nil, nil)
	q.started()
	if len(*msgs) != 1 || len(*batches) != 1 {
		t.Fatalf("sent %d messages, %d batches; want the 6 frames in one batch", len(*msgs), len(*batches))
	}
	b := (*batches)[0]
	got := new(pb.WorkerMessage)
	if err := protobuf.Unmarshal(wireOf(t, b), got); err != nil {
		t.Fatalf("the batch does not decode: %v", err)
	}
	items := got.GetBatch().GetMessages()
	if len(items) != len(want) {
		t.Fatalf("the batch holds %d messages, want %d", len(items), len(want))
	}
	for i, f := range want {
		w := new(pb.WorkerMessage)
		if err := protobuf.Unmarshal(wireOf(t, f), w); err != nil {
			t.Fatal(err)
		}
		if !protobuf.Equal(items[i], w) {
			t.Fatalf("message %d of the batch is %v, want %v", i, items[i], w)
		}
		if b.bufs[2*i+1] != f.buf[0] {
			t.Fatalf("frame %d of the batch is not the frame's own buffer", i)
		}
	}
	// As gRPC does: a reference for its writer, the send's own dropped
	// when SendMsg returns, the writer's once written.
	bufs := b.bufs
	bufs.Ref()
	bufs.Free()
	if len(b.bufs) == 0 {
		t.Fatal("the batch was reused while gRPC still held it")
	}
	bufs.Free()
	if len(b.bufs) != 0 {
		t.Fatal("the batch was not reused once gRPC let go of it")
	}
	a.release()
	if p.out != 0 {
		t.Fatalf("%d buffers not back in the pool after the batch was written and the job released", p.out)
	}
}

// TestSendQueueBatchBounds: a flusher's batch holds at most
// maxBatchFrames frames and maxBatchBytes bytes (a frame larger than
// that goes alone), and the frames go in their order across batches.
func TestSendQueueBatchBounds(t *testing.T) {
	q, msgs, _ := batchQueue(t)
	q.readied() // every put holds, or flushes past holdLimit: not flushed here
	var want []*frame
	put := func(data string) {
		f := jobFrame(fieldOutput, "job", 1, data, "")
		want = append(want, f)
		q.mu.Lock() // as put, without its flush
		q.q = append(q.q, f)
		q.mu.Unlock()
	}
	for range maxBatchFrames + 3 {
		put("1")
	}
	big := strings.Repeat("b", maxBatchBytes/3)
	for range 4 {
		put(big)
	}
	put(strings.Repeat("h", maxBatchBytes+1))
	put("2")
	if err := q.flush(0); err != nil {
		t.Fatal(err)
	}
	var sizes []int
	var sent []*frame
	for _, m := range *msgs {
		sizes = append(sizes, len(m))
		n := 0
		for _, f := range m {
			n += f.buf[0].Len()
		}
		if len(m) > 1 && n > maxBatchBytes {
			t.Fatalf("a batch of %d bytes", n)
		}
		sent = append(sent, m...)
	}
	// 64 small; 3 small and 2 big (the third would pass the bound); 2
	// big; the huge one alone; the last.
	if want := []int{maxBatchFrames, 5, 2, 1, 1}; !slices.Equal(sizes, want) {
		t.Fatalf("messages of %v frames, want %v", sizes, want)
	}
	for i := range want {
		if sent[i].buf[0] != want[i].buf[0] {
			t.Fatalf("frame %d sent out of order", i)
		}
	}
	q.started()
}
