package pbwire

import "google.golang.org/protobuf/encoding/protowire"

// Only returns the body of b when b is one length-delimited field num and
// nothing else: a message holding a single submessage (a oneof's one
// case), encoded the plain way.
func Only(b []byte, num protowire.Number) ([]byte, bool) {
	n, typ, l := protowire.ConsumeTag(b)
	if l < 0 || n != num || typ != protowire.BytesType {
		return nil, false
	}
	b = b[l:]
	body, l := protowire.ConsumeBytes(b)
	if l < 0 || l != len(b) {
		return nil, false
	}
	return body, true
}

// Plain reads a message's fields as the hand-written decoders take them,
// the plain way: each field numbered 1 to max (at most 63) at most once.
// A field seen twice, a number out of range or a malformed tag or value is
// not plain (proto would merge it, or keep it as unknown): the caller then
// decodes the message the general way. Reading:
//
//	r := NewPlain(b, 3)
//	for r.Next() {
//		switch {
//		case r.Num == 1 && r.Type == protowire.VarintType:
//			v, ok := r.Varint() // ...
//		default:
//			return false
//		}
//	}
//	return r.Done()
type Plain struct {
	Num  protowire.Number
	Type protowire.Type
	b    []byte
	max  protowire.Number
	seen uint64
	bad  bool
}

// NewPlain reads b, whose field numbers run from 1 to max.
func NewPlain(b []byte, max protowire.Number) Plain { return Plain{b: b, max: max} }

// Next reads the next field's tag into Num and Type: false at the end, or
// when the tag is not plain (Done then reports false).
func (r *Plain) Next() bool {
	if len(r.b) == 0 || r.bad {
		return false
	}
	// A field numbered below 16 has a one-byte tag: no varint to read.
	num, typ, n := protowire.Number(r.b[0]>>3), protowire.Type(r.b[0]&7), 1
	if r.b[0] >= 0x80 {
		num, typ, n = protowire.ConsumeTag(r.b)
	}
	if n < 0 || num < 1 || num > r.max || r.seen&(1<<num) != 0 {
		r.bad = true
		return false
	}
	r.seen |= 1 << num
	r.Num, r.Type, r.b = num, typ, r.b[n:]
	return true
}

// Varint reads the field's value as a varint.
func (r *Plain) Varint() (uint64, bool) {
	v, n := protowire.ConsumeVarint(r.b)
	return v, r.skip(n)
}

// Bytes reads the field's value as length-delimited: a view of b.
func (r *Plain) Bytes() ([]byte, bool) {
	v, n := protowire.ConsumeBytes(r.b)
	return v, r.skip(n)
}

// skip moves past a value of n bytes; n < 0 is a malformed one.
func (r *Plain) skip(n int) bool {
	if n < 0 {
		r.bad = true
		return false
	}
	r.b = r.b[n:]
	return true
}

// Done reports whether every field was read and each was plain.
func (r *Plain) Done() bool { return !r.bad && len(r.b) == 0 }
