package pbcodec_test

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/switchyard/switchyard/internal/pbcodec"
	"github.com/switchyard/switchyard/internal/pbtest"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// The session checks refuse invalid UTF-8 in every place a string can sit
// in a NodeMessage or a WorkerMessage, as proto does, and take valid UTF-8
// there: the places are found by walking the descriptors, so a string
// field added later is tried too and fails here until the check covers it.
func TestSessionChecksCover(t *testing.T) {
	t.Run("NodeMessage", func(t *testing.T) {
		checkCovers(t, func() *pb.NodeMessage { return &pb.NodeMessage{} }, pbcodec.NodeMessageUTF8)
	})
	t.Run("WorkerMessage", func(t *testing.T) {
		checkCovers(t, func() *pb.WorkerMessage { return &pb.WorkerMessage{} }, pbcodec.WorkerMessageUTF8)
	})
}

func checkCovers[M proto.Message](t *testing.T, newMsg func() M, check func(M) error) {
	paths := pbtest.StringPaths(newMsg().ProtoReflect().Descriptor(), "")
	if len(paths) < 8 {
		t.Fatalf("only %d string places found: the walk is broken", len(paths))
	}
	for path, set := range paths {
		good := newMsg()
		set(good.ProtoReflect(), "ok ✓")
		if _, err := proto.Marshal(good); err != nil {
			t.Fatal(err)
		}
		if err := check(good); err != nil {
			t.Errorf("%s: valid UTF-8 refused: %v", path, err)
		}
		bad := newMsg()
		set(bad.ProtoReflect(), "bad \xff")
		if _, err := proto.Marshal(bad); err == nil {
			t.Fatalf("%s: proto encoded invalid UTF-8: the test sets the wrong thing", path)
		}
		if err := check(bad); !errors.Is(err, pbcodec.ErrInvalidUTF8) {
			t.Errorf("%s: invalid UTF-8 taken (%v): check it in sessions.go", path, err)
		}
	}
}
