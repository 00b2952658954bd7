package resume

import (
	"encoding/binary"
	"time"
)

// payloadV1 is the version byte leading every payload this build writes.
// Bump it, and keep decoding the old one for at least MaxTTL, if the layout
// ever changes.
const payloadV1 = 1

// Payload layout, version 1. Integers are unsigned varints
// (encoding/binary), so small values cost a byte or two:
//
//	version    1 byte, payloadV1
//	generation uvarint
//	seq        uvarint
//	snapshot   uvarint
//	issued     uvarint, unix seconds
//	lifetime   uvarint, seconds from issued to expiry, 1..MaxTTL
//	caller     16 bytes
//	filter     16 bytes
//	stream     uvarint length 1..MaxStreamLen, then the bytes, ending the payload
//
// maxPayloadLen is the longest this can get.
const maxPayloadLen = 1 + 3*binary.MaxVarintLen64 + maxIssuedLen + maxLifetimeLen + 16 + 16 + 1 + MaxStreamLen

// Bounds that keep the worst-case payload, and so the worst-case token,
// within MaxTokenLen.
const (
	// maxIssued is the latest issue time Sign accepts, in unix seconds
	// (about the year 141,000), so that it fits maxIssuedLen varint bytes
	// and issued plus lifetime can never overflow.
	maxIssued = 1<<42 - 1
	// maxIssuedLen is the varint length of maxIssued.
	maxIssuedLen = 6
	// maxLifetimeLen is the varint length of MaxTTL in seconds (86400).
	maxLifetimeLen = 3
)

// appendPayload appends the version 1 encoding of p, issued at issued with
// lifetime seconds to live, to dst.
func appendPayload(dst []byte, p *Position, issued, lifetime uint64) []byte {
	dst = append(dst, payloadV1)
	dst = binary.AppendUvarint(dst, p.Generation)
	dst = binary.AppendUvarint(dst, p.Seq)
	dst = binary.AppendUvarint(dst, p.Snapshot)
	dst = binary.AppendUvarint(dst, issued)
	dst = binary.AppendUvarint(dst, lifetime)
	dst = append(dst, p.Caller[:]...)
	dst = append(dst, p.Filter[:]...)
	dst = binary.AppendUvarint(dst, uint64(len(p.Stream)))
	return append(dst, p.Stream...)
}

// decodePayload decodes a payload, returning the reason it is rejected, or
// "" if it is not. Verify calls it only on payloads whose MAC it has checked,
// so a failure here means a signer bug or a version this build does not
// know, never a forgery.
func decodePayload(b []byte) (Position, Reason) {
	var p Position
	if len(b) == 0 {
		return p, ReasonBadPayload
	}
	if b[0] != payloadV1 {
		return p, ReasonUnsupportedVersion
	}
	d := decoder{b: b[1:]}
	p.Generation = d.uvarint()
	p.Seq = d.uvarint()
	p.Snapshot = d.uvarint()
	issued := d.uvarint()
	lifetime := d.uvarint()
	d.fixed(p.Caller[:])
	d.fixed(p.Filter[:])
	n := d.uvarint()
	if d.err || issued > maxIssued || lifetime == 0 || lifetime > uint64(MaxTTL/time.Second) ||
		n == 0 || n > MaxStreamLen || uint64(len(d.b)) != n {
		return Position{}, ReasonBadPayload
	}
	p.Stream = string(d.b)
	p.IssuedAt = time.Unix(int64(issued), 0).UTC()
	p.ExpiresAt = time.Unix(int64(issued+lifetime), 0).UTC()
	return p, ""
}

// decoder reads a payload front to back, remembering the first failure.
type decoder struct {
	b   []byte
	err bool
}

// uvarint reads an unsigned varint.
func (d *decoder) uvarint() uint64 {
	if d.err {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = true
		return 0
	}
	d.b = d.b[n:]
	return v
}

// fixed reads len(dst) bytes into dst.
func (d *decoder) fixed(dst []byte) {
	if d.err || len(d.b) < len(dst) {
		d.err = true
		return
	}
	d.b = d.b[copy(dst, d.b):]
}
