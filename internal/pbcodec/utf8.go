package pbcodec

import (
	"fmt"
	"unicode/utf8"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// CheckUTF8 fails when a string in m is not valid UTF-8, which proto3
// requires of every string field (map keys and values, list elements and
// nested messages included): proto refuses to marshal or unmarshal such a
// message. It walks m by reflection, so a field added later is checked
// too; that costs about 2 µs for a small message, so the hot messages are
// better checked field by field, with a test that walks their
// descriptors (internal/pbtest.StringPaths).
func CheckUTF8(m protoreflect.Message) error {
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		err = checkValue(fd, v)
		return err == nil
	})
	return err
}

func checkValue(fd protoreflect.FieldDescriptor, v protoreflect.Value) error {
	switch {
	case fd.IsMap():
		var err error
		v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
			if err = checkScalar(fd.MapKey(), k.Value()); err == nil {
				err = checkScalar(fd.MapValue(), mv)
			}
			return err == nil
		})
		return err
	case fd.IsList():
		l := v.List()
		for i := range l.Len() {
			if err := checkScalar(fd, l.Get(i)); err != nil {
				return err
			}
		}
		return nil
	}
	return checkScalar(fd, v)
}

func checkScalar(fd protoreflect.FieldDescriptor, v protoreflect.Value) error {
	switch fd.Kind() {
	case protoreflect.StringKind:
		if !utf8.ValidString(v.String()) {
			return fmt.Errorf("field %s is not valid UTF-8", fd.Name())
		}
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return CheckUTF8(v.Message())
	}
	return nil
}
