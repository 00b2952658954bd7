package peer

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

// decodeFrame decodes b into in through the server's codec, as a reply
// stream's reader does.
func decodeFrame(in *frameIn, b []byte) error {
	return codec{pbcodec.New()}.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, in)
}

// TestFrameInMatchesVTProto decodes reply stream frames — items encoded
// every way the wire allows, and some it refuses — into one reused frameIn,
// and compares each with what pbcodec's decoder of a plain RespondFrame
// makes of the same bytes: the same frame, or an error for both.
func TestFrameInMatchesVTProto(t *testing.T) {
	mustMarshal := func(m proto.Message) []byte { return pbtest.Marshal(t, m) }
	field, varint := pbtest.Field, pbtest.Varint
	reply := func(job string, out string) *pb.PeerMessage {
		return &pb.PeerMessage{Kind: pb.PeerMessage_KIND_REPLY, JobId: job, Generation: 2, Queue: "q", Consumer: "c1",
			WorkerName: "w", Output: []byte(out), TtlNs: 5e9}
	}
	items := func(its ...*pb.RespondItem) []byte {
		return mustMarshal(&pb.RespondFrame{Body: &pb.RespondFrame_Items{Items: &pb.RespondItems{Items: its}}})
	}
	// frameOf wraps raw RespondItem encodings in a frame of items.
	frameOf := func(raw ...[]byte) []byte {
		var body []byte
		for _, r := range raw {
			body = field(body, 1, r)
		}
		return field(nil, 5, body)
	}
	// itemOf wraps a raw PeerMessage encoding in an item of seq 7.
	itemOf := func(msg []byte) []byte { return field(varint(nil, 1, 7), 2, msg) }
	plainMsg := mustMarshal(reply("job-1", `"x"`))
	open := &pb.RespondOpen{Session: "s", JobId: "job-1", Generation: 2, Queue: "q", HeartbeatIntervalNs: 1e9, TtlNs: 3e9}
	cases := map[string][]byte{
		"outputs": items(&pb.RespondItem{Seq: 1, Message: reply("job-1", `"a"`), Open: open},
			&pb.RespondItem{Seq: 2, Message: reply("job-1", `"b"`)}, &pb.RespondItem{Seq: 3, Message: reply("job-1", `{"k":[1,2]}`)}),
		"other job": items(&pb.RespondItem{Seq: 1, Message: reply("job-2", `"a"`)}),
		"accept":    items(&pb.RespondItem{Seq: 4, Message: &pb.PeerMessage{Kind: pb.PeerMessage_KIND_REPLY, JobId: "job-1", Generation: 2, Consumer: "c1", WorkerName: "w", Accepted: true}}),
		"end": items(&pb.RespondItem{Seq: 5, Message: &pb.PeerMessage{Kind: pb.PeerMessage_KIND_REPLY, JobId: "job-1", Generation: 2, Queue: "q",
			End: &pb.PeerEnd{Code: "bad_output", Detail: "d", Result: []byte(`{"r":1}`)}}}),
		"release": items(&pb.RespondItem{Seq: 6, Message: &pb.PeerMessage{Kind: pb.PeerMessage_KIND_RELEASE, JobId: "job-1", Generation: 2, Queue: "q",
			Consumer: "c1", Rejected: true, Running: true, Reason: "why", Code: "cancelled", CreditEvents: 3, CreditBytes: 9}}),
		"output empty":               items(&pb.RespondItem{Seq: 1, Message: reply("job-1", "")}),
		"item without message":       items(&pb.RespondItem{Seq: 9}),
		"item, open only":            items(&pb.RespondItem{Open: open}),
		"empty item":                 frameOf(nil),
		"no items":                   field(nil, 5, nil),
		"message fields swapped":     frameOf(itemOf(varint(field(nil, 2, []byte("job-3")), 1, 3))),
		"item fields swapped":        frameOf(varint(field(nil, 2, plainMsg), 1, 8)),
		"job id twice":               frameOf(itemOf(field(field(nil, 2, []byte("job-1")), 2, []byte("job-4")))),
		"seq twice":                  frameOf(varint(varint(nil, 1, 1), 1, 2)),
		"message twice (merged)":     frameOf(field(field(nil, 2, plainMsg), 2, mustMarshal(&pb.PeerMessage{TtlNs: 1}))),
		"unknown message field":      frameOf(itemOf(varint(plainMsg, 30, 1))),
		"unknown item field":         frameOf(varint(itemOf(plainMsg), 9, 1)),
		"delivery":                   frameOf(itemOf(mustMarshal(&pb.PeerMessage{Kind: pb.PeerMessage_KIND_FORWARD, JobId: "j", Delivery: &pb.PeerDelivery{JobId: "j"}}))),
		"kind as bytes":              frameOf(itemOf(field(nil, 1, []byte{1}))),
		"job id as varint":           frameOf(itemOf(varint(nil, 2, 1))),
		"kind out of int32":          frameOf(itemOf(varint(nil, 1, 1<<40|3))),
		"truncated":                  items(&pb.RespondItem{Seq: 1, Message: reply("job-1", `"abcdef"`)})[:12],
		"bad end":                    frameOf(itemOf(field(nil, 10, []byte{0xff}))),
		"bad open":                   frameOf(field(nil, 3, []byte{0xff})),
		"open fields swapped":        frameOf(field(nil, 3, varint(field(varint(nil, 6, 5), 2, []byte("job-1")), 3, 2))),
		"open field twice":           frameOf(field(nil, 3, field(field(nil, 1, []byte("s")), 1, []byte("t")))),
		"open unknown field":         frameOf(field(nil, 3, varint(mustMarshal(open), 9, 1))),
		"open session as varint":     frameOf(field(nil, 3, varint(nil, 1, 1))),
		"open ttl negative":          items(&pb.RespondItem{Open: &pb.RespondOpen{JobId: "job-1", TtlNs: -1, HeartbeatIntervalNs: -5}}),
		"empty open":                 frameOf(field(nil, 3, nil)),
		"trailing after items":       append(items(&pb.RespondItem{Seq: 1, Message: reply("job-1", `"a"`)}), varint(nil, 9, 1)...),
		"items twice (merged)":       append(items(&pb.RespondItem{Seq: 1}), items(&pb.RespondItem{Seq: 2})...),
		"open frame":                 mustMarshal(&pb.RespondFrame{Body: &pb.RespondFrame_Open{Open: open}}),
		"heartbeat":                  mustMarshal(&pb.RespondFrame{Body: &pb.RespondFrame_Heartbeat{Heartbeat: &pb.Heartbeat{}}}),
		"leg end":                    mustMarshal(&pb.RespondFrame{Body: &pb.RespondFrame_End{End: &pb.RespondLegEnd{JobId: "job-1", Generation: 2}}}),
		"empty frame":                {},
		"items then open (oneof)":    append(items(&pb.RespondItem{Seq: 1}), mustMarshal(&pb.RespondFrame{Body: &pb.RespondFrame_Open{Open: open}})...),
		"many items (pool grows)":    items(manyItems(reply, 40)...),
		"after many, fewer (reused)": items(&pb.RespondItem{Seq: 1, Message: reply("job-1", `"z"`)}),
	}
	var in frameIn
	fast := 0
	for _, round := range []int{1, 2} {
		for name, b := range cases {
			want := new(pb.RespondFrame)
			werr := pbcodec.New().Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, want)
			err := decodeFrame(&in, b)
			if (err != nil) != (werr != nil) {
				t.Fatalf("round %d, %s: error %v, vtproto's %v", round, name, err, werr)
			}
			if err != nil {
				continue
			}
			got := in.get()
			if !proto.Equal(got, want) {
				t.Fatalf("round %d, %s: decoded %v, vtproto %v", round, name, got, want)
			}
			for i, it := range got.GetItems().GetItems() {
				if w := want.GetItems().GetItems()[i]; (it.GetMessage().GetOutput() == nil) != (w.GetMessage().GetOutput() == nil) ||
					(it.GetMessage() == nil) != (w.GetMessage() == nil) {
					t.Fatalf("round %d, %s, item %d: nil message or output differs from vtproto's", round, name, i)
				}
			}
			if in.fast {
				fast++
			}
		}
	}
	if fast == 0 {
		t.Fatal("no frame took the fast path")
	}
}

func manyItems(reply func(string, string) *pb.PeerMessage, n int) []*pb.RespondItem {
	its := make([]*pb.RespondItem, n)
	for i := range its {
		its[i] = &pb.RespondItem{Seq: uint64(i + 1), Message: reply("job-1", `"x"`)}
	}
	return its
}

// poisonPool is a mem.BufferPool that overwrites what is put back, so a
// slice still read after its buffer was freed shows it.
type poisonPool struct{ put int }

func (p *poisonPool) Get(n int) *[]byte { b := make([]byte, n); return &b }
func (p *poisonPool) Put(b *[]byte) {
	p.put++
	for i := range *b {
		(*b)[i] = '!'
	}
}

// TestFrameInKeepsOnlyItsOwn: an item's output is a slice of the frame's
// buffer, valid until the next decode (the receiver keeps none of it),
// which holds that buffer out of gRPC's pool until then; what the engine
// keeps of an item — its end, its open and its strings — survives the
// next frame decoded into the same frameIn; the strings of a leg are
// decoded once; and a frame of outputs costs no allocation.
func TestFrameInKeepsOnlyItsOwn(t *testing.T) {
	// Above gRPC's pooling threshold (1 KiB), as a pooled buffer is.
	pad := string(bytes.Repeat([]byte("x"), 4096))
	frame := func(out string) []byte {
		b, _ := proto.Marshal(&pb.RespondFrame{Body: &pb.RespondFrame_Items{Items: &pb.RespondItems{Items: []*pb.RespondItem{
			{Seq: 1, Open: &pb.RespondOpen{JobId: "job-1", Session: "s"}, Message: &pb.PeerMessage{Kind: pb.PeerMessage_KIND_REPLY, JobId: "job-1", Queue: "q", Consumer: "c", WorkerName: "w", Output: []byte(out + pad)}},
			{Seq: 2, Message: &pb.PeerMessage{Kind: pb.PeerMessage_KIND_REPLY, JobId: "job-1", Queue: "q", Consumer: "c", End: &pb.PeerEnd{Result: []byte(out)}}},
		}}}})
		return b
	}
	var pool poisonPool
	// decode hands b to the codec as gRPC does: in a pooled buffer it
	// frees once Unmarshal returns.
	decode := func(in *frameIn, b []byte) error {
		buf := pool.Get(len(b))
		copy(*buf, b)
		data := mem.BufferSlice{mem.NewBuffer(buf, &pool)}
		defer data.Free()
		return codec{pbcodec.New()}.Unmarshal(data, in)
	}
	var in frameIn
	if err := decode(&in, frame(`"first"`)); err != nil || !in.fast {
		t.Fatalf("decode: %v, fast %v", err, in.fast)
	}
	its := in.get().GetItems().GetItems()
	out, open, end, id := its[0].GetMessage().GetOutput(), its[0].GetOpen(), its[1].GetMessage().GetEnd(), its[0].GetMessage().GetJobId()
	if string(out) != `"first"`+pad || pool.put != 0 {
		t.Fatalf("the output before the next decode: %.20q, buffers back in the pool %d", out, pool.put)
	}
	if cap(out) != len(out) {
		t.Fatal("an output can be appended to in place, over the frame's next bytes")
	}
	if unsafe.StringData(id) != unsafe.StringData(its[1].GetMessage().GetJobId()) {
		t.Fatal("a leg's job id was allocated for each item")
	}
	if err := decode(&in, frame(`"other"`)); err != nil || !in.fast {
		t.Fatalf("decode: %v, fast %v", err, in.fast)
	}
	if pool.put != 1 {
		t.Fatalf("%d buffers back in the pool after the next decode, want the first frame's", pool.put)
	}
	if !bytes.Equal(end.GetResult(), []byte(`"first"`)) || open.GetJobId() != "job-1" {
		t.Fatalf("the first frame's end or open changed: %q, %v", end.GetResult(), open)
	}
	if unsafe.StringData(id) != unsafe.StringData(in.get().GetItems().GetItems()[0].GetMessage().GetJobId()) {
		t.Fatal("a job id seen before was allocated again")
	}
	if got := in.get().GetItems().GetItems()[0].GetMessage().GetOutput(); string(got) != `"other"`+pad {
		t.Fatalf("the second frame's output: %.20q", got)
	}
	in.clear()
	if pool.put != 2 {
		t.Fatalf("%d buffers back in the pool after clear, want both", pool.put)
	}

	outputs, _ := proto.Marshal(&pb.RespondFrame{Body: &pb.RespondFrame_Items{Items: &pb.RespondItems{Items: manyItems(func(job, out string) *pb.PeerMessage {
		return &pb.PeerMessage{Kind: pb.PeerMessage_KIND_REPLY, JobId: job, Generation: 2, Queue: "q", Consumer: "c", WorkerName: "w", Output: []byte(out), TtlNs: 1e9}
	}, 8)}}})
	c, bs := codec{pbcodec.New()}, mem.BufferSlice{mem.SliceBuffer(outputs)}
	if allocs := testing.AllocsPerRun(100, func() { _ = c.Unmarshal(bs, &in) }); allocs > 0 {
		t.Fatalf("a frame of 8 outputs decoded with %v allocations, want none", allocs)
	}
}

// BenchmarkFrameDecode decodes a reply stream's frame of 10 outputs of 32
// B, as a reader does: into one reused frameIn (frameIn), or into a new
// RespondFrame by vtproto (vtproto).
func BenchmarkFrameDecode(b *testing.B) {
	its := make([]*pb.RespondItem, 10)
	for i := range its {
		its[i] = &pb.RespondItem{Seq: uint64(i + 1), Message: &pb.PeerMessage{Kind: pb.PeerMessage_KIND_REPLY, JobId: "0196f0a1-7c2e-7d3f-8a4b-5c6d7e8f9a0b",
			Generation: 1, Queue: "demo", Consumer: "c-0196f0a1-7c2e", WorkerName: "tokens", Output: bytes.Repeat([]byte("x"), 32), TtlNs: 30e9}}
	}
	raw, _ := proto.Marshal(&pb.RespondFrame{Body: &pb.RespondFrame_Items{Items: &pb.RespondItems{Items: its}}})
	bs := mem.BufferSlice{mem.SliceBuffer(raw)}
	b.Run("frameIn", func(b *testing.B) {
		c := codec{pbcodec.New()}
		var in frameIn
		b.ReportAllocs()
		for b.Loop() {
			_ = c.Unmarshal(bs, &in)
		}
	})
	b.Run("vtproto", func(b *testing.B) {
		c := pbcodec.New()
		b.ReportAllocs()
		for b.Loop() {
			_ = c.Unmarshal(bs, new(pb.RespondFrame))
		}
	})
}
