package peer

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// stringPaths lists every place a string can sit in a message of
// descriptor md: its string fields, the keys and values of string maps,
// the elements of string lists, and the same in nested messages. Each
// path is a function that puts bad into that place of a message.
func stringPaths(md protoreflect.MessageDescriptor, prefix string) map[string]func(protoreflect.Message, string) {
	paths := map[string]func(protoreflect.Message, string){}
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		name := prefix + string(fd.Name())
		switch {
		case fd.IsMap():
			if fd.MapKey().Kind() == protoreflect.StringKind {
				paths[name+"[key]"] = func(m protoreflect.Message, bad string) {
					m.Mutable(fd).Map().Set(protoreflect.ValueOfString(bad).MapKey(), fd.MapValue().Default())
				}
			}
			if fd.MapValue().Kind() == protoreflect.StringKind {
				paths[name+"[value]"] = func(m protoreflect.Message, bad string) {
					m.Mutable(fd).Map().Set(protoreflect.ValueOfString("k").MapKey(), protoreflect.ValueOfString(bad))
				}
			}
		case fd.IsList():
			if fd.Kind() == protoreflect.StringKind {
				paths[name+"[]"] = func(m protoreflect.Message, bad string) {
					m.Mutable(fd).List().Append(protoreflect.ValueOfString(bad))
				}
			}
		case fd.Kind() == protoreflect.StringKind:
			paths[name] = func(m protoreflect.Message, bad string) { m.Set(fd, protoreflect.ValueOfString(bad)) }
		case fd.Kind() == protoreflect.MessageKind:
			for sub, set := range stringPaths(fd.Message(), name+".") {
				paths[sub] = func(m protoreflect.Message, bad string) { set(m.Mutable(fd).Message(), bad) }
			}
		}
	}
	return paths
}

// TestWireValidCovers proves wireValid's field-by-field checks of
// PeerMessage and PeerDelivery miss no string: for every place a string
// can sit in them (found by walking their descriptors, so a field added
// later is tried too), invalid UTF-8 there fails wireValid with
// errNoWireForm, as it fails proto.Marshal, and valid UTF-8 passes both.
func TestWireValidCovers(t *testing.T) {
	for _, m := range []proto.Message{&pb.PeerMessage{}, &pb.PeerDelivery{}} {
		md := m.ProtoReflect().Descriptor()
		paths := stringPaths(md, "")
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
