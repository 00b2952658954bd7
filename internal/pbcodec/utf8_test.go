package pbcodec_test

import (
	"errors"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/switchyard/switchyard/internal/pbcodec"
	"github.com/switchyard/switchyard/internal/pbtest"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// The codec refuses invalid UTF-8 in every place a string can sit in a
// worker session's messages, NodeMessage and WorkerMessage, both ways, as
// proto does, and takes valid UTF-8 there: the places are found by walking
// the descriptors, so a string field added later is tried too and fails
// here until the check covers it.
func TestSessionUTF8Covers(t *testing.T) {
	t.Run("NodeMessage", func(t *testing.T) {
		checkCovers(t, func() proto.Message { return &pb.NodeMessage{} })
	})
	t.Run("WorkerMessage", func(t *testing.T) {
		checkCovers(t, func() proto.Message { return &pb.WorkerMessage{} })
	})
}

func checkCovers(t *testing.T, newMsg func() proto.Message) {
	c := pbcodec.New()
	paths := pbtest.StringPaths(newMsg().ProtoReflect().Descriptor(), "")
	if len(paths) < 8 {
		t.Fatalf("only %d string places found: the walk is broken", len(paths))
	}
	for path, set := range paths {
		good := newMsg()
		set(good.ProtoReflect(), "ok ✓")
		if _, err := c.Marshal(good); err != nil {
			t.Errorf("%s: valid UTF-8 refused by Marshal: %v", path, err)
		}
		b, err := proto.Marshal(good)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, newMsg()); err != nil {
			t.Errorf("%s: valid UTF-8 refused by Unmarshal: %v", path, err)
		}

		bad := newMsg()
		set(bad.ProtoReflect(), "bad \xff")
		if _, err := proto.Marshal(bad); err == nil {
			t.Fatalf("%s: proto encoded invalid UTF-8: the test sets the wrong thing", path)
		}
		if _, err := c.Marshal(bad); !errors.Is(err, pbcodec.ErrInvalidUTF8) {
			t.Errorf("%s: invalid UTF-8 encoded (err %v): check it in utf8.go", path, err)
		}
		vt := bad.(pbcodec.Message) // its own encoder does not check UTF-8
		raw := make([]byte, vt.SizeVT())
		if _, err := vt.MarshalToSizedBufferVT(raw); err != nil {
			t.Fatal(err)
		}
		if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(raw)}, newMsg()); !errors.Is(err, pbcodec.ErrInvalidUTF8) {
			t.Errorf("%s: invalid UTF-8 decoded (err %v): check it in utf8.go", path, err)
		}
	}
}

// The session codec checks every message it decodes: a session's own
// through the hand check, anything else (here a JobService request with
// invalid UTF-8, which Codec, trusting its peers, takes) through proto's
// codec, which refuses it.
func TestSessionCodecChecksOtherMessages(t *testing.T) {
	req := &pb.SubmitRequest{Queue: "bad \xff"}
	raw := make([]byte, req.SizeVT())
	if _, err := req.MarshalToSizedBufferVT(raw); err != nil {
		t.Fatal(err)
	}
	if err := pbcodec.New().Unmarshal(mem.BufferSlice{mem.SliceBuffer(raw)}, &pb.SubmitRequest{}); err != nil {
		t.Fatalf("Codec refused what it does not check: %v", err)
	}
	if err := pbcodec.NewSession().Unmarshal(mem.BufferSlice{mem.SliceBuffer(raw)}, &pb.SubmitRequest{}); err == nil {
		t.Fatal("the session codec took a request with invalid UTF-8")
	}
}
