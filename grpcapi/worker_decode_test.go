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

// asMessage is what in holds, as a WorkerMessage.
func asMessage(in *sessionIn) *pb.WorkerMessage {
	if in.isOutput {
		return &pb.WorkerMessage{Msg: &pb.WorkerMessage_Output{Output: &pb.Output{
			JobId: in.out.jobID, Generation: in.out.gen, Data: in.out.data}}}
	}
	return &in.msg
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
			if got := asMessage(&in); !proto.Equal(got, want) {
				t.Fatalf("round %d, %s: decoded %v, the session codec %v", round, name, got, want)
			}
			if o := want.GetOutput(); o != nil && in.isOutput && (o.Data == nil) != (in.out.data == nil) {
				t.Fatalf("round %d, %s: data nil %v, the session codec's nil %v", round, name, in.out.data == nil, o.Data == nil)
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
	if err := decodeIn(t, &in, b); err != nil || !in.isOutput {
		t.Fatalf("decode: %v, output %v", err, in.isOutput)
	}
	first, id := in.out.data, in.out.jobID
	b2, _ := proto.Marshal(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Output{Output: &pb.Output{JobId: "job-1", Generation: 1, Data: []byte(`"other"`)}}})
	copy(b, b2) // the buffer reused, as gRPC's pool would
	if err := decodeIn(t, &in, b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(first, []byte(`"first"`)) {
		t.Fatalf("the first output's data became %q", first)
	}
	if unsafe.StringData(id) != unsafe.StringData(in.out.jobID) {
		t.Fatal("a job id seen before was allocated again")
	}
	c, bs := newCodec(), mem.BufferSlice{mem.SliceBuffer(b)}
	if allocs := testing.AllocsPerRun(100, func() { _ = c.Unmarshal(bs, &in) }); allocs > 1 {
		t.Fatalf("an output decoded with %v allocations, want 1 (its data)", allocs)
	}
}
