package grpcapi

import (
	"errors"
	"unicode/utf8"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/switchyard/switchyard/internal/pbcodec"
	"github.com/switchyard/switchyard/internal/pbwire"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// codec is the public gRPC server's codec (grpc.ForceServerCodecV2): a
// worker session's codec (pbcodec.SessionCodec: its messages through their
// generated vtproto code, invalid UTF-8 refused as proto's codec would,
// anything else through proto's codec), but for the job events a stream's
// writer sends (wireEvent), which it encodes itself, and a worker
// session's inbound messages after the register (sessionIn), which it
// decodes with sessionIn's own decoder for outputs. The bytes are
// proto's; the clients' codec is unchanged.
type codec struct{ pbcodec.SessionCodec }

func newCodec() codec { return codec{pbcodec.NewSession()} }

// Marshal encodes v.
func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	switch v := v.(type) {
	case *wireEvent:
		return v.marshal()
	case *wireBatch:
		return v.marshal(), nil
	}
	return c.SessionCodec.Marshal(v)
}

// Unmarshal decodes data into v: a worker session's sessionIn by its own
// decoder, anything else as the session codec does. It refuses a
// WorkerMessage holding a Batch: the generated decoder recurses into a
// batch's messages without a bound, so only sessionIn, which refuses a
// batch inside a batch undecoded, takes one (a session reads every message
// into a sessionIn).
func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	switch v := v.(type) {
	case *sessionIn:
		return v.unmarshal(c.SessionCodec, data)
	case *pb.WorkerMessage:
		buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
		defer buf.Free()
		if has, err := hasField(buf.ReadOnlyData(), fieldBatch); err != nil {
			return err
		} else if has {
			return errBatchOutsideSession
		}
		return c.SessionCodec.Unmarshal(mem.BufferSlice{buf}, v)
	}
	return c.SessionCodec.Unmarshal(data, v)
}

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

// size is the event's encoded size. It refuses a string field that is not
// valid UTF-8, as proto's codec does.
func (w *wireEvent) size() (int, error) {
	e := &w.JobEvent
	if !utf8.ValidString(e.Kind) || !utf8.ValidString(e.JobId) || !utf8.ValidString(e.ResumeToken) {
		return 0, errInvalidUTF8
	}
	return pbwire.SizeLen(1, len(e.Kind)) + pbwire.SizeLen(2, len(e.JobId)) + pbwire.SizeUint(3, e.Generation) +
		pbwire.SizeUint(4, e.Seq) + pbwire.SizeUint(5, e.Snapshot) + pbwire.SizeUint(6, e.Attempt) +
		pbwire.SizeLen(7, len(e.ResumeToken)) + pbwire.SizeLen(8, len(e.DataJson)), nil
}

// marshal encodes the event as proto would (fields in number order, zero
// values left out).
func (w *wireEvent) marshal() (mem.BufferSlice, error) {
	n, err := w.size()
	if err != nil {
		return nil, err
	}
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
	b = pbwire.AppendLen(b, 1, e.Kind)
	b = pbwire.AppendLen(b, 2, e.JobId)
	b = pbwire.AppendUint(b, 3, e.Generation)
	b = pbwire.AppendUint(b, 4, e.Seq)
	b = pbwire.AppendUint(b, 5, e.Snapshot)
	b = pbwire.AppendUint(b, 6, e.Attempt)
	b = pbwire.AppendLen(b, 7, e.ResumeToken)
	return pbwire.AppendLen(b, 8, e.DataJson)
}

// wireBatch is the JobEventBatch a batched stream's writer sends: the
// events added since its last send, each encoded as wireEvent encodes it,
// framed as the batch's field 1, into one pooled buffer as it is added.
// Sending it is one message whose encoding is that buffer, handed to gRPC
// as it is (marshal): gRPC frees it once written, and the next event
// starts another. Only the writer touches it; marshal runs within its Send.
// Only the server's codec encodes it.
type wireBatch struct {
	pool mem.BufferPool
	buf  *[]byte // the encoding so far, from the pool; nil: none
	n    int     // the events in it
}

// framedSize is what an event of n bytes adds to a batch.
func framedSize(n int) int { return protowire.SizeTag(1) + protowire.SizeBytes(n) }

// len is the batch's encoded size.
func (b *wireBatch) len() int {
	if b.buf == nil {
		return 0
	}
	return len(*b.buf)
}

// add appends e, whose encoded size is n (wireEvent.size).
func (b *wireBatch) add(e *wireEvent, n int) {
	need := b.len() + framedSize(n)
	switch {
	case b.buf == nil:
		b.buf = b.pool.Get(max(need, wireChunk))
		*b.buf = (*b.buf)[:0]
	case cap(*b.buf) < need:
		grown := b.pool.Get(max(need, 2*cap(*b.buf)))
		*grown = append((*grown)[:0], *b.buf...)
		b.pool.Put(b.buf)
		b.buf = grown
	}
	buf := protowire.AppendTag(*b.buf, 1, protowire.BytesType)
	buf = protowire.AppendVarint(buf, uint64(n))
	*b.buf = e.append(buf)
	b.n++
}

// marshal hands the batch's encoding over to the caller (gRPC, which frees
// it once written) and empties the batch.
func (b *wireBatch) marshal() mem.BufferSlice {
	if b.buf == nil {
		return nil
	}
	buf := b.buf
	b.buf, b.n = nil, 0
	return mem.BufferSlice{mem.NewBuffer(buf, b.pool)}
}

// release returns an unsent batch's buffer to the pool and empties it.
func (b *wireBatch) release() {
	if b.buf != nil {
		b.pool.Put(b.buf)
		b.buf, b.n = nil, 0
	}
}
