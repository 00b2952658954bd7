// Package pbtest is test plumbing over our protobuf messages, imported by
// tests only: every message type of ours, every field of one filled, every
// place a string can sit in one. Tests that hold hand-written encoders,
// checks and codecs to proto's behaviour walk the descriptors with it, so
// a field added later is tried too; and they encode by hand, with Field
// and Varint, what proto's encoder would not write (fields out of order or
// twice, a field of the wrong wire type) to see both decoders agree.
package pbtest

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// Marshal is m encoded by proto; the test fails if it cannot be.
func Marshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Field appends field num, length-delimited, holding v to b, even when v
// is empty (proto3's encoder would leave an empty one out).
func Field(b []byte, num protowire.Number, v []byte) []byte {
	return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), v)
}

// Varint appends field num, a varint, holding v to b, even when v is 0.
func Varint(b []byte, num protowire.Number, v uint64) []byte {
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
}

// Messages lists every message type of our proto package.
func Messages(t *testing.T) []protoreflect.MessageType {
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

// StringPaths lists every place a string can sit in a message of
// descriptor md: its string fields, the keys and values of string maps,
// the elements of string lists, and the same in nested messages. Each
// path is a function that puts bad into that place of a message.
func StringPaths(md protoreflect.MessageDescriptor, prefix string) map[string]func(protoreflect.Message, string) {
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
			for sub, set := range StringPaths(fd.Message(), name+".") {
				paths[sub] = func(m protoreflect.Message, bad string) { set(m.Mutable(fd).Message(), bad) }
			}
		}
	}
	return paths
}

// Variants is how many messages Fill makes different for d: one per case
// of its largest oneof, at least one.
func Variants(d protoreflect.MessageDescriptor) int {
	n := 1
	for i := range d.Oneofs().Len() {
		n = max(n, d.Oneofs().Get(i).Fields().Len())
	}
	return n
}

// Fill sets every field of m to a value derived from its number and
// variant; of each oneof it sets the case variant selects. Nested messages
// are filled to a depth of 3.
func Fill(m protoreflect.Message, variant, depth int) {
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
						Fill(v.Message(), variant+k, depth+1)
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
						Fill(v.Message(), variant+k, depth+1)
					}
					l.Append(v)
				} else {
					l.Append(scalar(fd, variant+k))
				}
			}
		case fd.Message() != nil:
			if depth < 3 {
				Fill(m.Mutable(fd).Message(), variant, depth+1)
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
