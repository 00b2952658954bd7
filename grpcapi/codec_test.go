package grpcapi

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/switchyard/switchyard/internal/pbcodec"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// countingPool is a buffer pool that counts what is out, and overwrites
// every buffer put back: a view read after its chunk returned to the pool
// reads garbage.
type countingPool struct {
	mu  sync.Mutex
	out map[*[]byte]bool
}

func newCountingPool() *countingPool { return &countingPool{out: map[*[]byte]bool{}} }

func (p *countingPool) Get(n int) *[]byte {
	b := make([]byte, n)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.out[&b] = true
	return &b
}

func (p *countingPool) Put(b *[]byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.out[b] {
		panic("put back a buffer that is not out")
	}
	delete(p.out, b)
	for i := range *b {
		(*b)[i] = 0xff
	}
}

func (p *countingPool) outstanding() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.out)
}

func testEvents() []*pb.JobEvent {
	evs := []*pb.JobEvent{
		{Kind: "heartbeat", JobId: "j_1"},
		{Kind: "terminated", JobId: "j_1", DataJson: []byte(`{"reason":"idle"}`)},
		{Kind: "output", JobId: "j_1", Generation: 1, Seq: 2, Snapshot: 3, Attempt: 4, ResumeToken: "k1.abc.def", DataJson: []byte(`{"data":"x"}`)},
		{Kind: "output", JobId: "j_é", Generation: math.MaxUint64, Seq: 1 << 35, Snapshot: 127, Attempt: 128, ResumeToken: "t", DataJson: []byte{}},
		{Kind: "output", JobId: "j_1", Seq: 9, DataJson: bytes.Repeat([]byte("a"), wireChunk/2)},  // just fits a chunk's half
		{Kind: "output", JobId: "j_1", Seq: 10, DataJson: bytes.Repeat([]byte("b"), 3*wireChunk)}, // a buffer of its own
		{},
	}
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 200 {
		evs = append(evs, &pb.JobEvent{
			Kind: "output", JobId: "j_" + strings.Repeat("z", r.IntN(40)),
			Generation: r.Uint64() >> r.IntN(64), Seq: uint64(i), Snapshot: r.Uint64N(1000), Attempt: r.Uint64N(3),
			ResumeToken: strings.Repeat("t", r.IntN(200)), DataJson: bytes.Repeat([]byte("d"), r.IntN(700)),
		})
	}
	return evs
}

func wireOf(pool mem.BufferPool, ev *pb.JobEvent) *wireEvent {
	w := &wireEvent{pool: pool}
	w.set(ev.Kind, ev.JobId, ev.Generation, ev.Seq, ev.Snapshot, ev.Attempt, ev.ResumeToken, ev.DataJson)
	return w
}

// The codec's bytes for a stream's event are proto's, byte for byte, and
// so are proto's codec's for the same value (a server without our codec).
func TestWireEventEncodesAsProto(t *testing.T) {
	c, protoCodec := newCodec(), encoding.GetCodecV2(protocodec.Name)
	w := &wireEvent{pool: mem.DefaultBufferPool()}
	defer w.release()
	for i, ev := range testEvents() {
		want, err := proto.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		w.set(ev.Kind, ev.JobId, ev.Generation, ev.Seq, ev.Snapshot, ev.Attempt, ev.ResumeToken, ev.DataJson)
		got, err := c.Marshal(w)
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if b := got.Materialize(); !bytes.Equal(b, want) {
			t.Fatalf("event %d: encoded\n%x\nproto\n%x", i, b, want)
		}
		got.Free()
		fallback, err := protoCodec.Marshal(w)
		if err != nil {
			t.Fatal(err)
		}
		if b := fallback.Materialize(); !bytes.Equal(b, want) {
			t.Fatalf("event %d: proto's codec encoded %x, want %x", i, b, want)
		}
		fallback.Free()
	}
	// Anything else is proto's.
	st := &pb.JobStatus{JobId: "j_1", State: "running"}
	got, err := c.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := proto.Marshal(st); !bytes.Equal(got.Materialize(), want) {
		t.Errorf("JobStatus %x, want %x", got.Materialize(), want)
	}
	var back pb.JobStatus
	if err := c.Unmarshal(got, &back); err != nil || !proto.Equal(&back, st) {
		t.Errorf("Unmarshal: %v, %v", err, &back)
	}
	if c.Name() != "proto" {
		t.Errorf("name %q", c.Name())
	}
}

// Every field of JobEvent reaches the wire: an event with each field set,
// whatever fields the message has, copied through set and encoded, is
// proto's. A field added to JobEvent and not to set and marshal fails
// here rather than going missing from every streamed event.
func TestWireEventCoversEveryField(t *testing.T) {
	ev := &pb.JobEvent{}
	m := ev.ProtoReflect()
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		switch fd.Kind() {
		case protoreflect.StringKind:
			m.Set(fd, protoreflect.ValueOfString("s"+string(fd.Name())))
		case protoreflect.BytesKind:
			m.Set(fd, protoreflect.ValueOfBytes([]byte("b"+string(fd.Name()))))
		case protoreflect.Uint64Kind:
			m.Set(fd, protoreflect.ValueOfUint64(uint64(fd.Number())+100))
		default:
			t.Fatalf("JobEvent.%s is a %v: the wire encoder knows strings, bytes and uint64s only", fd.Name(), fd.Kind())
		}
	}
	want, err := proto.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	w := wireOf(mem.DefaultBufferPool(), ev)
	defer w.release()
	got, err := newCodec().Marshal(w)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Free()
	if b := got.Materialize(); !bytes.Equal(b, want) {
		t.Fatalf("JobEvent with its %d fields set: encoded\n%x\nproto\n%x", fields.Len(), b, want)
	}
}

// Proto refuses a string field that is not UTF-8; so does the codec.
func TestWireEventRefusesInvalidUTF8(t *testing.T) {
	ev := &pb.JobEvent{Kind: "output", JobId: "j_\xff"}
	if _, err := proto.Marshal(ev); err == nil {
		t.Fatal("proto marshalled invalid UTF-8")
	}
	w := wireOf(mem.DefaultBufferPool(), ev)
	if _, err := w.marshal(); err == nil {
		t.Fatal("the codec encoded invalid UTF-8")
	}
}

// A chunk returns to the pool only once every message cut from it was
// written (freed) and the writer released it: messages still queued read
// what was encoded, however many batches later.
func TestWireEventChunksReturnToThePool(t *testing.T) {
	pool := newCountingPool()
	w := &wireEvent{pool: pool}
	type queued struct {
		data mem.BufferSlice
		want []byte
	}
	var q []queued
	evs := testEvents()
	r := rand.New(rand.NewPCG(3, 4))
	for i, ev := range evs {
		w.set(ev.Kind, ev.JobId, ev.Generation, ev.Seq, ev.Snapshot, ev.Attempt, ev.ResumeToken, ev.DataJson)
		data, err := w.marshal()
		if err != nil {
			t.Fatal(err)
		}
		want, _ := proto.Marshal(ev)
		q = append(q, queued{data, want})
		if i%5 == 4 {
			w.release() // a flush
		}
		// gRPC writes some of what is queued, in order, now and then.
		for len(q) > 0 && r.IntN(3) == 0 {
			if got := q[0].data.Materialize(); !bytes.Equal(got, q[0].want) {
				t.Fatalf("a queued message changed before it was written: %x, want %x", got, q[0].want)
			}
			q[0].data.Free()
			q = q[1:]
		}
	}
	for _, m := range q {
		if got := m.data.Materialize(); !bytes.Equal(got, m.want) {
			t.Fatalf("a queued message changed before it was written: %x, want %x", got, m.want)
		}
		m.data.Free()
	}
	if n := pool.outstanding(); n != 1 {
		t.Errorf("%d buffers out before the last release, want the current chunk", n)
	}
	w.release()
	if n := pool.outstanding(); n != 0 {
		t.Errorf("%d buffers never returned to the pool", n)
	}
}

// The server's codec checks a worker session's strings both ways, as
// proto's codec did: it refuses to encode a NodeMessage and to decode a
// WorkerMessage holding invalid UTF-8 (pbcodec's session checks, whose
// own test tries every string field).
func TestCodecChecksSessionStrings(t *testing.T) {
	c := newCodec()
	offer := &pb.NodeMessage{Msg: &pb.NodeMessage_Job{Job: &pb.Job{JobId: "j_1", Queue: "bad \xff"}}}
	if _, err := c.Marshal(offer); !errors.Is(err, pbcodec.ErrInvalidUTF8) {
		t.Errorf("offer with invalid UTF-8 encoded (err %v)", err)
	}
	fail := &pb.WorkerMessage{Msg: &pb.WorkerMessage_Fail{Fail: &pb.Fail{JobId: "j_1", Message: "bad \xff"}}}
	b, err := fail.MarshalVT() // proto.Marshal would refuse it
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &pb.WorkerMessage{}); !errors.Is(err, pbcodec.ErrInvalidUTF8) {
		t.Errorf("fail with invalid UTF-8 decoded (err %v)", err)
	}
}

// A job offer as a session sends it is encoded to proto's bytes.
func TestNodeMessageJobMatchesProto(t *testing.T) {
	m := &pb.NodeMessage{Msg: &pb.NodeMessage_Job{Job: &pb.Job{
		JobId: "j_1", Generation: 3, Queue: "demo", Input: []byte(`"hi"`), Options: []byte(`{"a":1}`),
		Capabilities: []string{"model=demo", "gpu=é"}, TtlMs: 30000, MaxOutputBytes: 1 << 20,
		OutputCredit: &pb.OutputCredit{Events: 16, Bytes: 1 << 16},
		Traceparent:  "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", Tracestate: "a=b",
		AffinityKey: "k", Priority: -2,
	}}}
	want, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	got, err := newCodec().Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Materialize(), want) {
		t.Fatalf("encoded %x, proto's %x", got.Materialize(), want)
	}
}
