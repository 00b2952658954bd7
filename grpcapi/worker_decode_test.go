package grpcapi

import (
	"bytes"
	"testing"
	"unsafe"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/switchyard/switchyard/internal/pbcodec"
	"github.com/switchyard/switchyard/internal/pbtest"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// decodeIn decodes b into in through the server's codec, as a session's
// reader does.
func decodeIn(t *testing.T, in *sessionIn, b []byte) error {
	t.Helper()
	return newCodec().Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, in)
}

// asMessage is what it holds, as a WorkerMessage; nil for a refusal.
func asMessage(it *item) *pb.WorkerMessage {
	switch it.kind {
	case itemOutput:
		return &pb.WorkerMessage{Msg: &pb.WorkerMessage_Output{Output: &pb.Output{
			JobId: it.jobID, Generation: it.gen, Data: it.data}}}
	case itemAccept:
		return &pb.WorkerMessage{Msg: &pb.WorkerMessage_Accept{Accept: &pb.Accept{JobId: it.jobID, Generation: it.gen}}}
	case itemComplete:
		return &pb.WorkerMessage{Msg: &pb.WorkerMessage_Complete{Complete: &pb.Complete{
			JobId: it.jobID, Generation: it.gen, Result: it.data}}}
	case itemRefused:
		return nil
	}
	return it.msg
}

// only is the one item of a lone message in in.
func only(t *testing.T, in *sessionIn) *item {
	t.Helper()
	if in.batched || len(in.items) != 1 {
		t.Fatalf("a lone message decoded as %d items (batched %v)", len(in.items), in.batched)
	}
	return &in.items[0]
}

// TestSessionInMatchesProto decodes worker messages, outputs encoded every
// way proto accepts and some it refuses, into one reused sessionIn, and
// compares each with what the session codec (the decoder of a plain
// WorkerMessage) makes of the same bytes: the same message, or an error
// for both. (Where vtproto's decoding and proto's differ, a known field of
// the wrong wire type, the session codec's is the one kept.)
func TestSessionInMatchesProto(t *testing.T) {
	field, varint := pbtest.Field, pbtest.Varint
	other := func(m *pb.WorkerMessage) []byte { return pbtest.Marshal(t, m) }
	out := func(id string, gen uint64, data []byte) []byte {
		return other(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Output{Output: &pb.Output{JobId: id, Generation: gen, Data: data}}})
	}
	wrap := func(body []byte) []byte { return field(nil, 4, body) }
	cases := map[string][]byte{
		"output":                 out("job-1", 3, []byte(`"a"`)),
		"output again, same id":  out("job-1", 4, []byte(`"b"`)),
		"output, other id":       out("job-2", 1, []byte(`{"x":1}`)),
		"output, empty data":     out("job-1", 3, []byte{}),
		"output, no data":        wrap(varint(field(nil, 1, []byte("job-1")), 2, 7)),
		"output, empty":          wrap(nil),
		"output, fields swapped": wrap(field(varint(field(nil, 3, []byte(`1`)), 2, 9), 1, []byte("job-3"))),
		"output, id twice":       wrap(field(field(nil, 1, []byte("job-1")), 1, []byte("job-4"))),
		"output, unknown field":  wrap(varint(field(nil, 1, []byte("job-1")), 9, 1)),
		"output twice (merged)":  append(out("job-1", 3, nil), out("", 0, []byte(`2`))...),
		"output then complete":   append(out("job-1", 3, []byte(`1`)), other(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Complete{Complete: &pb.Complete{JobId: "job-1", Generation: 3}}})...),
		"output, id not UTF-8":   wrap(field(nil, 1, []byte{'j', 0xff})),
		"output, gen as bytes":   wrap(field(nil, 2, []byte{1})),
		"output, truncated":      out("job-1", 3, []byte(`"abc"`))[:8],
		"accept":                 other(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Accept{Accept: &pb.Accept{JobId: "job-1", Generation: 3}}}),
		"complete":               other(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Complete{Complete: &pb.Complete{JobId: "job-1", Generation: 3, Result: []byte(`{"ok":true}`)}}}),
		"fail":                   other(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Fail{Fail: &pb.Fail{JobId: "job-1", Generation: 3, Code: "x", Message: "boom"}}}),
		"heartbeat":              other(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Heartbeat{Heartbeat: &pb.Heartbeat{}}}),
		"accept, id not UTF-8":   field(nil, 2, field(nil, 1, []byte{0xff})),
		"accept, field 3":        field(nil, 2, field(field(nil, 1, []byte("job-1")), 3, []byte("x"))),
		"complete, no result":    other(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Complete{Complete: &pb.Complete{JobId: "job-1", Generation: 3}}}),
		"complete, empty result": field(nil, 5, field(varint(field(nil, 1, []byte("job-1")), 2, 3), 3, nil)),
		"complete, gen twice":    field(nil, 5, varint(varint(nil, 2, 3), 2, 4)),
		"complete, id not UTF-8": field(nil, 5, field(nil, 1, []byte{0xff})),
	}
	var in sessionIn
	for _, round := range []int{1, 2} {
		for name, b := range cases {
			want := new(pb.WorkerMessage)
			werr := pbcodec.NewSession().Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, want)
			err := decodeIn(t, &in, b)
			if (err != nil) != (werr != nil) {
				t.Fatalf("round %d, %s: error %v, the session codec's %v", round, name, err, werr)
			}
			if err != nil {
				continue
			}
			it := only(t, &in)
			if got := asMessage(it); !proto.Equal(got, want) {
				t.Fatalf("round %d, %s: decoded %v, the session codec %v", round, name, got, want)
			}
			if o := want.GetOutput(); o != nil && it.kind == itemOutput && (o.Data == nil) != (it.data == nil) {
				t.Fatalf("round %d, %s: data nil %v, the session codec's nil %v", round, name, it.data == nil, o.Data == nil)
			}
		}
	}
	if len(in.ids) == 0 {
		t.Fatal("no output took the fast path")
	}
}

// TestSessionInOutputDataIsItsOwn: an output's data is a slice of its
// own, which the next message decoded into the same sessionIn (from the
// same buffer, as gRPC may reuse it) does not touch, and a job id seen
// before is the same string.
func TestSessionInOutputDataIsItsOwn(t *testing.T) {
	b, _ := proto.Marshal(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Output{Output: &pb.Output{JobId: "job-1", Generation: 1, Data: []byte(`"first"`)}}})
	var in sessionIn
	if err := decodeIn(t, &in, b); err != nil || only(t, &in).kind != itemOutput {
		t.Fatalf("decode: %v, %+v", err, in.items)
	}
	first, id := in.items[0].data, in.items[0].jobID
	b2, _ := proto.Marshal(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Output{Output: &pb.Output{JobId: "job-1", Generation: 1, Data: []byte(`"other"`)}}})
	copy(b, b2) // the buffer reused, as gRPC's pool would
	if err := decodeIn(t, &in, b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(first, []byte(`"first"`)) {
		t.Fatalf("the first output's data became %q", first)
	}
	if unsafe.StringData(id) != unsafe.StringData(in.items[0].jobID) {
		t.Fatal("a job id seen before was allocated again")
	}
	c, bs := newCodec(), mem.BufferSlice{mem.SliceBuffer(b)}
	if allocs := testing.AllocsPerRun(100, func() { _ = c.Unmarshal(bs, &in) }); allocs > 1 {
		t.Fatalf("an output decoded with %v allocations, want 1 (its data)", allocs)
	}
}

// batchOf encodes a WorkerMessage holding a Batch of items, each an
// encoded WorkerMessage, as the worker SDK puts one together.
func batchOf(items ...[]byte) []byte {
	var body []byte
	for _, it := range items {
		body = pbtest.Field(body, 1, it)
	}
	return pbtest.Field(nil, 9, body)
}

// TestSessionInBatch decodes batches into one reused sessionIn: their
// messages come out in order, each what the session codec makes of it
// alone (outputs, accepts and completes by hand, the rest by the codec),
// an empty batch holds none, and a batch inside a batch, a register in a
// batch and a batch beside another field are decoded as items the
// session refuses.
func TestSessionInBatch(t *testing.T) {
	msg := func(m *pb.WorkerMessage) []byte { return pbtest.Marshal(t, m) }
	accept := msg(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Accept{Accept: &pb.Accept{JobId: "job-1", Generation: 2}}})
	out := func(data string) []byte {
		return msg(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Output{Output: &pb.Output{JobId: "job-1", Generation: 2, Data: []byte(data)}}})
	}
	complete := msg(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Complete{Complete: &pb.Complete{JobId: "job-1", Generation: 2, Result: []byte(`{"n":2}`)}}})
	fail := msg(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Fail{Fail: &pb.Fail{JobId: "job-2", Generation: 1, Code: "model_error", Message: "boom"}}})
	heartbeat := msg(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Heartbeat{Heartbeat: &pb.Heartbeat{}}})
	reg := msg(register("q"))
	// An output with its job id twice (the last one counts): the codec's
	// path, in a batch.
	oddOutput := pbtest.Field(nil, 4, pbtest.Field(pbtest.Field(nil, 1, []byte("job-0")), 1, []byte("job-1")))

	var in sessionIn
	decode := func(name string, b []byte) {
		t.Helper()
		if err := decodeIn(t, &in, b); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !in.batched {
			t.Fatalf("%s: not decoded as a batch", name)
		}
	}
	// want checks in.items against msgs; a nil one is a refused item.
	want := func(name string, msgs ...[]byte) {
		t.Helper()
		if len(in.items) != len(msgs) {
			t.Fatalf("%s: %d items, want %d", name, len(in.items), len(msgs))
		}
		for i, b := range msgs {
			it := &in.items[i]
			if b == nil {
				if it.kind != itemRefused || it.detail == "" {
					t.Fatalf("%s: item %d is %+v, want refused", name, i, it)
				}
				continue
			}
			w := new(pb.WorkerMessage)
			if err := proto.Unmarshal(b, w); err != nil {
				t.Fatal(err)
			}
			if got := asMessage(it); !proto.Equal(got, w) {
				t.Fatalf("%s: item %d is %v, want %v", name, i, got, w)
			}
		}
	}

	all := [][]byte{accept, out(`"a"`), out(`"b"`), heartbeat, oddOutput, out(`"c"`), complete, fail}
	decode("mixed", batchOf(all...))
	want("mixed", all...)
	for i, k := range []itemKind{itemAccept, itemOutput, itemOutput, itemMessage, itemMessage, itemOutput, itemComplete, itemMessage} {
		if in.items[i].kind != k {
			t.Fatalf("mixed: item %d decoded as kind %d, want %d", i, in.items[i].kind, k)
		}
	}
	// The same batch through proto: the batch's messages are those.
	viaProto := new(pb.WorkerMessage)
	if err := proto.Unmarshal(batchOf(all...), viaProto); err != nil || len(viaProto.GetBatch().GetMessages()) != len(all) {
		t.Fatalf("proto reads the batch as %v (%v)", viaProto, err)
	}

	decode("empty", batchOf())
	want("empty")
	decode("empty, no body", pbtest.Field(nil, 9, nil))
	want("empty, no body")

	// A batch inside a batch is refused where it stands, undecoded: the
	// items before it are there.
	decode("nested", batchOf(accept, batchOf(out(`"x"`)), out(`"y"`)))
	want("nested", accept, nil, out(`"y"`))
	// A register in a batch decodes: the session's handling refuses it.
	decode("register", batchOf(accept, reg))
	want("register", accept, reg)
	if in.items[1].msg.GetRegister() == nil {
		t.Fatal("a register in a batch is not one")
	}
	// An unknown field of the batch is skipped, as proto would.
	decode("unknown field", pbtest.Field(nil, 9, pbtest.Varint(pbtest.Field(nil, 1, accept), 7, 1)))
	want("unknown field", accept)

	// A batch beside another field: refused, not merged.
	for name, b := range map[string][]byte{
		"batch twice":        append(batchOf(accept), batchOf(out(`"z"`))...),
		"batch then output":  append(batchOf(accept), out(`"z"`)...),
		"output then batch":  append(out(`"z"`), batchOf(accept)...),
		"batch then unknown": pbtest.Varint(batchOf(accept), 30, 1),
	} {
		if err := decodeIn(t, &in, b); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(in.items) != 1 || in.items[0].kind != itemRefused || in.items[0].detail != detailBatchNotAlone {
			t.Fatalf("%s: decoded %+v, want refused", name, in.items)
		}
	}

	// Malformed: an error, as the codec's for any message it cannot read.
	for name, b := range map[string][]byte{
		"truncated item":    batchOf(accept)[:6],
		"item not UTF-8":    batchOf(pbtest.Field(nil, 6, pbtest.Field(nil, 3, []byte{0xff}))),
		"malformed item":    batchOf([]byte{0x22, 0x05, 0x0a}),
		"malformed in body": pbtest.Field(nil, 9, []byte{0x0a, 0x80}),
	} {
		if err := decodeIn(t, &in, b); err == nil {
			t.Fatalf("%s: decoded as %+v", name, in.items)
		}
	}

	// A lone message after a batch is one item again.
	if err := decodeIn(t, &in, accept); err != nil || only(t, &in).kind != itemAccept {
		t.Fatalf("accept after a batch: %v, %+v", err, in.items)
	}
}

// TestSessionInBatchAllocations: a batch of outputs costs an allocation
// per output, its data, and nothing per item around it.
func TestSessionInBatchAllocations(t *testing.T) {
	var items [][]byte
	for i := range 16 {
		items = append(items, pbtest.Marshal(t, &pb.WorkerMessage{Msg: &pb.WorkerMessage_Output{Output: &pb.Output{
			JobId: "job-1", Generation: 1, Data: []byte(`"0123456789012345678901234567890"`)[:1+i]}}}))
	}
	b := batchOf(items...)
	var in sessionIn
	c, bs := newCodec(), mem.BufferSlice{mem.SliceBuffer(b)}
	if err := c.Unmarshal(bs, &in); err != nil || len(in.items) != 16 {
		t.Fatalf("decode: %v, %d items", err, len(in.items))
	}
	if allocs := testing.AllocsPerRun(100, func() { _ = c.Unmarshal(bs, &in) }); allocs > 16 {
		t.Fatalf("a batch of 16 outputs decoded with %v allocations, want 16 (their data)", allocs)
	}
}

// TestCodecRefusesBatchInPlainMessage: the server's codec decodes a
// batch only into a sessionIn; into a plain WorkerMessage, whose generated
// decoder has no bound on nesting, it refuses one.
func TestCodecRefusesBatchInPlainMessage(t *testing.T) {
	accept := pbtest.Marshal(t, &pb.WorkerMessage{Msg: &pb.WorkerMessage_Accept{Accept: &pb.Accept{JobId: "j", Generation: 1}}})
	deep := accept
	for range 1000 {
		deep = batchOf(deep)
	}
	c := newCodec()
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(deep)}, new(pb.WorkerMessage)); err == nil {
		t.Fatal("a nested batch decoded into a WorkerMessage")
	}
	var in sessionIn
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(deep)}, &in); err != nil || len(in.items) != 1 || in.items[0].detail != detailNestedBatch {
		t.Fatalf("a nested batch into a sessionIn: %v, %+v", err, in.items)
	}
	m := new(pb.WorkerMessage)
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(accept)}, m); err != nil || m.GetAccept().GetJobId() != "j" {
		t.Fatalf("an accept into a WorkerMessage: %v, %v", err, m)
	}
}
