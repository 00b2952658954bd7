package pbwire

import (
	"testing"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/switchyard/switchyard/internal/pbtest"
)

func TestPlain(t *testing.T) {
	field, varint := pbtest.Field, pbtest.Varint
	// read reads b as fields 1 (varint) and 2 (bytes) of at most 3, as a
	// decoder would: ok is Done's verdict.
	read := func(b []byte) (n uint64, s string, ok bool) {
		r := NewPlain(b, 3)
		for r.Next() {
			switch {
			case r.Num == 1 && r.Type == protowire.VarintType:
				if n, ok = r.Varint(); !ok {
					return 0, "", false
				}
			case r.Num == 2 && r.Type == protowire.BytesType:
				v, ok := r.Bytes()
				if !ok {
					return 0, "", false
				}
				s = string(v)
			default:
				return 0, "", false
			}
		}
		return n, s, r.Done()
	}
	good := field(varint(nil, 1, 300), 2, []byte("job"))
	if n, s, ok := read(good); !ok || n != 300 || s != "job" {
		t.Fatalf("plain message read as (%d, %q, %v)", n, s, ok)
	}
	if _, _, ok := read(nil); !ok {
		t.Fatal("an empty message is not plain")
	}
	for name, b := range map[string][]byte{
		"a field twice":        varint(good, 1, 1),
		"a field out of range": varint(good, 4, 1),
		"field number 0":       append(good, 0x00),
		"a truncated value":    good[:len(good)-1],
		"a truncated varint":   append(good, 0x08, 0x80),
		"a truncated tag":      append(good, 0x80),
	} {
		if _, _, ok := read(b); ok {
			t.Errorf("%s: read as plain", name)
		}
	}
}

func TestOnly(t *testing.T) {
	inner := pbtest.Varint(nil, 1, 7)
	msg := pbtest.Field(nil, 4, inner)
	if body, ok := Only(msg, 4); !ok || string(body) != string(inner) {
		t.Fatalf("Only(msg, 4) = %x, %v", body, ok)
	}
	if _, ok := Only(msg, 5); ok {
		t.Error("Only of another field number: ok")
	}
	if _, ok := Only(append(msg, 0x08, 0x01), 4); ok {
		t.Error("Only of a message with a second field: ok")
	}
	if _, ok := Only(msg[:len(msg)-1], 4); ok {
		t.Error("Only of a truncated message: ok")
	}
}
