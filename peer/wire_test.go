package peer

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/switchyard/switchyard/internal/pbtest"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// TestWireValidCovers proves wireValid's field-by-field checks of
// PeerMessage and PeerDelivery miss no string: for every place a string
// can sit in them (found by walking their descriptors, so a field added
// later is tried too), invalid UTF-8 there fails wireValid with
// errNoWireForm, as it fails proto.Marshal, and valid UTF-8 passes both.
func TestWireValidCovers(t *testing.T) {
	for _, m := range []proto.Message{&pb.PeerMessage{}, &pb.PeerDelivery{}} {
		md := m.ProtoReflect().Descriptor()
		paths := pbtest.StringPaths(md, "")
		if len(paths) < 5 {
			t.Fatalf("%s: only %d string places found: the walk is broken", md.FullName(), len(paths))
		}
		for path, set := range paths {
			good := m.ProtoReflect().New()
			set(good, "ok ✓")
			if err := wireValid(good.Interface()); err != nil {
				t.Errorf("%s.%s: valid UTF-8 refused: %v", md.FullName(), path, err)
			}
			bad := m.ProtoReflect().New()
			set(bad, "bad \xff")
			if _, err := proto.Marshal(bad.Interface()); err == nil {
				t.Fatalf("%s.%s: proto.Marshal took invalid UTF-8: the test sets the wrong thing", md.FullName(), path)
			}
			if err := wireValid(bad.Interface()); !errors.Is(err, errNoWireForm) {
				t.Errorf("%s.%s: invalid UTF-8 not caught by wireValid (err %v): add it to peerMessageUTF8 or deliveryUTF8", md.FullName(), path, err)
			}
		}
	}
}

func BenchmarkWireValid(b *testing.B) {
	m := &pb.PeerMessage{Kind: pb.PeerMessage_KIND_REPLY, JobId: "j_0123456789abcdef", Generation: 3, Queue: "bench",
		Consumer: "c_0123456789abcdef", WorkerName: "bench-worker", Output: []byte(`{"text":"one"}`)}
	b.Run("fields", func(b *testing.B) {
		for b.Loop() {
			if err := wireValid(m); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("reflection", func(b *testing.B) {
		for b.Loop() {
			if err := checkUTF8(m.ProtoReflect()); err != nil {
				b.Fatal(err)
			}
		}
	})
}
