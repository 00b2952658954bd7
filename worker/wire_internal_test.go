package worker

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/switchyard/switchyard/internal/pbcodec"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// The frames a session encodes by hand are byte for byte what
// proto.Marshal makes of the message structs, zero fields, long fields
// (multi-byte lengths) and large generations included.
func TestJobFramesMatchProtoMarshal(t *testing.T) {
	long := strings.Repeat("é", 200)
	for _, c := range []struct {
		id   string
		gen  uint64
		a, b string
	}{
		{"j", 1, `"x"`, "m"},
		{"", 0, "", ""},
		{"job-1", 0, "", "message"},
		{long, 1 << 63, long, long},
		{"j", 300, "", ""},
	} {
		for _, x := range []struct {
			name string
			got  *frame
			want *pb.WorkerMessage
		}{
			{"accept", jobFrame(fieldAccept, c.id, c.gen, "", ""),
				&pb.WorkerMessage{Msg: &pb.WorkerMessage_Accept{Accept: &pb.Accept{JobId: c.id, Generation: c.gen}}}},
			{"reject", jobFrame(fieldReject, c.id, c.gen, c.a, ""),
				&pb.WorkerMessage{Msg: &pb.WorkerMessage_Reject{Reject: &pb.Reject{JobId: c.id, Generation: c.gen, Reason: c.a}}}},
			{"output", jobFrame(fieldOutput, c.id, c.gen, []byte(c.a), ""),
				&pb.WorkerMessage{Msg: &pb.WorkerMessage_Output{Output: &pb.Output{JobId: c.id, Generation: c.gen, Data: []byte(c.a)}}}},
			{"complete", jobFrame(fieldComplete, c.id, c.gen, []byte(c.a), ""),
				&pb.WorkerMessage{Msg: &pb.WorkerMessage_Complete{Complete: &pb.Complete{JobId: c.id, Generation: c.gen, Result: []byte(c.a)}}}},
			{"fail", jobFrame(fieldFail, c.id, c.gen, c.a, c.b),
				&pb.WorkerMessage{Msg: &pb.WorkerMessage_Fail{Fail: &pb.Fail{JobId: c.id, Generation: c.gen, Code: c.a, Message: c.b}}}},
		} {
			want, err := proto.Marshal(x.want)
			if err != nil {
				t.Fatal(err)
			}
			if got := x.got.buf[0].ReadOnlyData(); !bytes.Equal(got, want) {
				t.Errorf("%s %q/%d: encoded %x, proto.Marshal %x", x.name, c.id, c.gen, got, want)
			}
		}
	}
}

// The session's codec refuses a NodeMessage holding invalid UTF-8, as
// proto's decoder did (the stream ends and the session reconnects):
// pbcodec's session check, whose own test tries every string field.
func TestFrameCodecChecksStrings(t *testing.T) {
	m := &pb.NodeMessage{Msg: &pb.NodeMessage_Job{Job: &pb.Job{JobId: "j_1", Queue: "bad \xff"}}}
	b, err := m.MarshalVT() // proto.Marshal would refuse it
	if err != nil {
		t.Fatal(err)
	}
	if err := withFramesCodec().Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &pb.NodeMessage{}); !errors.Is(err, pbcodec.ErrInvalidUTF8) {
		t.Errorf("offer with invalid UTF-8 decoded (err %v)", err)
	}
}
