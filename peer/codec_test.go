package peer

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/wrapperspb"

	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// ourMessages lists every message type of our proto package.
func ourMessages(t *testing.T) []protoreflect.MessageType {
	t.Helper()
	pkg := pb.File_switchyard_v1_peer_proto.Package()
	var mts []protoreflect.MessageType
	protoregistry.GlobalTypes.RangeMessages(func(mt protoreflect.MessageType) bool {
		if mt.Descriptor().ParentFile().Package() == pkg {
			mts = append(mts, mt)
		}
		return true
	})
	if len(mts) < 20 {
		t.Fatalf("found %d message types in package %s: the registry walk is broken", len(mts), pkg)
	}
	return mts
}

// Every message of ours has its vtproto code: a message without it would
// quietly take proto's slower path (make proto generates it for every
// file).
func TestCodecCoversEveryMessage(t *testing.T) {
	for _, mt := range ourMessages(t) {
		if _, ok := mt.New().Interface().(vtMessage); !ok {
			t.Errorf("%s has no vtproto code (size, marshal, unmarshal)", mt.Descriptor().FullName())
		}
	}
}

// For every message of ours, with every field set (each oneof case in turn,
// repeated fields and maps with several entries, nested messages too), the
// codec's bytes decode with proto into the same message, proto's bytes
// decode with the codec into the same message, and decoding into a message
// that held something else replaces it.
func TestCodecMatchesProto(t *testing.T) {
	c := newCodec()
	for _, mt := range ourMessages(t) {
		d := mt.Descriptor()
		for variant := range max(1, maxOneofCases(d)) {
			m := mt.New()
			fill(m, variant, 0)
			name := fmt.Sprintf("%s/%d", d.FullName(), variant)
			want := m.Interface()

			enc, err := c.Marshal(want)
			if err != nil {
				t.Fatalf("%s: codec marshal: %v", name, err)
			}
			got := mt.New().Interface()
			if err := proto.Unmarshal(enc.Materialize(), got); err != nil {
				t.Fatalf("%s: proto cannot read the codec's bytes: %v", name, err)
			}
			enc.Free()
			if !proto.Equal(got, want) {
				t.Fatalf("%s: codec → proto\n got %v\nwant %v", name, got, want)
			}

			b, err := proto.Marshal(want)
			if err != nil {
				t.Fatalf("%s: proto marshal: %v", name, err)
			}
			if n := want.(vtMessage).SizeVT(); n != len(b) {
				t.Fatalf("%s: SizeVT %d, proto's bytes %d", name, n, len(b))
			}
			stale := mt.New()
			fill(stale, variant+1, 0)
			into := stale.Interface()
			if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, into); err != nil {
				t.Fatalf("%s: codec cannot read proto's bytes: %v", name, err)
			}
			if !proto.Equal(into, want) {
				t.Fatalf("%s: proto → codec, into a message that held another\n got %v\nwant %v", name, into, want)
			}
		}
	}
}

// A message above gRPC's pooling threshold is encoded into a pooled buffer
// and reads back the same.
func TestCodecLargeMessage(t *testing.T) {
	m := &pb.PeerMessage{JobId: "j_large", Queue: "demo", Output: []byte(strings.Repeat("x", 64<<10))}
	c := newCodec()
	enc, err := c.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if enc.Len() <= 64<<10 {
		t.Fatalf("encoded %d bytes, want more than the data's %d", enc.Len(), 64<<10)
	}
	got := &pb.PeerMessage{}
	if err := c.Unmarshal(enc, got); err != nil {
		t.Fatal(err)
	}
	enc.Free()
	if !proto.Equal(got, m) {
		t.Fatalf("round trip changed the message: %d bytes of data, want %d", len(got.GetOutput()), len(m.GetOutput()))
	}
}

// A message that is not ours goes through proto's codec.
func TestCodecOtherMessages(t *testing.T) {
	c := newCodec()
	in := wrapperspb.String("not ours")
	enc, err := c.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	got := &wrapperspb.StringValue{}
	if err := c.Unmarshal(enc, got); err != nil {
		t.Fatal(err)
	}
	if got.GetValue() != in.GetValue() {
		t.Fatalf("got %q, want %q", got.GetValue(), in.GetValue())
	}
	if _, err := c.Marshal(struct{}{}); err == nil {
		t.Fatal("marshalled a value that is no message")
	}
}

func maxOneofCases(d protoreflect.MessageDescriptor) int {
	n := 0
	for i := range d.Oneofs().Len() {
		n = max(n, d.Oneofs().Get(i).Fields().Len())
	}
	return n
}

// fill sets every field of m to a value derived from its number and
// variant; of each oneof it sets the case variant selects. Nested messages
// are filled to a depth of 3.
func fill(m protoreflect.Message, variant, depth int) {
	d := m.Descriptor()
	for i := range d.Fields().Len() {
		fd := d.Fields().Get(i)
		if o := fd.ContainingOneof(); o != nil && !o.IsSynthetic() {
			if o.Fields().Get(variant%o.Fields().Len()) != fd {
				continue
			}
		}
		switch {
		case fd.IsMap():
			mp := m.Mutable(fd).Map()
			for k := range 2 {
				key := scalar(fd.MapKey(), variant+k)
				if fd.MapValue().Message() != nil {
					v := mp.NewValue()
					if depth < 3 {
						fill(v.Message(), variant+k, depth+1)
					}
					mp.Set(key.MapKey(), v)
				} else {
					mp.Set(key.MapKey(), scalar(fd.MapValue(), variant+k))
				}
			}
		case fd.IsList():
			l := m.Mutable(fd).List()
			for k := range 2 {
				if fd.Message() != nil {
					v := l.NewElement()
					if depth < 3 {
						fill(v.Message(), variant+k, depth+1)
					}
					l.Append(v)
				} else {
					l.Append(scalar(fd, variant+k))
				}
			}
		case fd.Message() != nil:
			if depth < 3 {
				fill(m.Mutable(fd).Message(), variant, depth+1)
			} else {
				m.Mutable(fd)
			}
		default:
			m.Set(fd, scalar(fd, variant))
		}
	}
}

// scalar is a non-zero value of fd's kind.
func scalar(fd protoreflect.FieldDescriptor, variant int) protoreflect.Value {
	n := int64(fd.Number())*7 + int64(variant) + 1
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.EnumKind:
		vs := fd.Enum().Values()
		return protoreflect.ValueOfEnum(vs.Get(int(n) % vs.Len()).Number())
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(int32(-n))
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(-n << 33)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(uint32(n))
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(uint64(n) << 40)
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(float32(n) / 3)
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(float64(n) / 3)
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(fmt.Sprintf("%s-%d-é", fd.Name(), n))
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte(fmt.Sprintf("\x00%s\xff%d", fd.Name(), n)))
	}
	panic(fmt.Sprintf("fill: field %s has kind %v", fd.FullName(), fd.Kind()))
}
