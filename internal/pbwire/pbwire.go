// Package pbwire holds what the hand-written proto encoders and decoders
// share: the size and the encoding of proto3 fields, whose zero values are
// left out (the worker SDK's frames, the gRPC server's job events), and
// the reader of a message's fields in the plain encoding (the worker
// session's and the reply stream's decoders).
package pbwire

import "google.golang.org/protobuf/encoding/protowire"

// SizeLen is the size of a string or bytes field of n bytes; 0 for an
// empty one.
func SizeLen(num protowire.Number, n int) int {
	if n == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(n)
}

// AppendLen appends a string or bytes field; nothing for an empty one.
func AppendLen[T string | []byte](b []byte, num protowire.Number, v T) []byte {
	if len(v) == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(len(v)))
	return append(b, v...)
}

// SizeUint is the size of a varint field; 0 for a zero one.
func SizeUint(num protowire.Number, v uint64) int {
	if v == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeVarint(v)
}

// AppendUint appends a varint field; nothing for a zero one.
func AppendUint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
}
