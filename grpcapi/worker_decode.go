package grpcapi

import (
	"unicode/utf8"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/switchyard/switchyard/internal/pbcodec"
	"github.com/switchyard/switchyard/internal/pbwire"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// sessionIn is what a worker session's reader decodes each message after
// the register into, one per session, reused for every message: the
// server's codec (codec.Unmarshal) fills it. An Output, most of what a
// worker sends, is decoded by hand into out (isOutput set), with no message
// allocated around it and its job id taken from ids when the session saw
// it before; only its data is allocated, a fresh slice each time, since
// the engine keeps it. Every other message, and an Output whose encoding
// is anything but the plain one (a field twice, an unknown field, a wire
// type proto would refuse), is decoded into msg by the session's codec
// (pbcodec.SessionCodec), as before. Either way the strings are checked
// for UTF-8, as proto's codec would.
//
// Nothing of it may be kept past the handling of the message but
// out.data, msg's contents (a fresh message each time: the codec resets
// msg, which drops what it held) and the job id strings.
type sessionIn struct {
	isOutput bool
	out      outputIn
	msg      pb.WorkerMessage
	// ids interns the job ids of the session's outputs: each is checked
	// for UTF-8 once. Cleared when it holds maxInternedIDs.
	ids map[string]string
}

// outputIn is an Output's fields.
type outputIn struct {
	jobID string
	gen   uint64
	data  []byte
}

// maxInternedIDs bounds a session's ids: over the jobs a worker runs at
// once (its concurrency), so a session seldom decodes an id twice while
// its job runs.
const maxInternedIDs = 1024

// unmarshal decodes data into in, replacing what it held.
func (in *sessionIn) unmarshal(c pbcodec.SessionCodec, data mem.BufferSlice) error {
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	ok := in.decodeOutput(buf.ReadOnlyData())
	buf.Free()
	if ok {
		return nil
	}
	in.isOutput, in.out = false, outputIn{}
	return c.Unmarshal(data, &in.msg)
}

// decodeOutput decodes b as a WorkerMessage holding an Output, encoded the
// plain way: the output field once, its fields each at most once, of their
// own wire types, nothing else. False for anything else (then in.out is
// unspecified).
func (in *sessionIn) decodeOutput(b []byte) bool {
	body, ok := pbwire.Only(b, 4)
	if !ok {
		return false
	}
	var o outputIn
	r := pbwire.NewPlain(body, 3)
	for r.Next() {
		switch {
		case r.Num == 2 && r.Type == protowire.VarintType:
			if o.gen, ok = r.Varint(); !ok {
				return false
			}
		case r.Num != 2 && r.Type == protowire.BytesType:
			v, ok := r.Bytes()
			if !ok {
				return false
			}
			if r.Num == 1 {
				o.jobID = in.intern(v)
				if o.jobID == "" && len(v) > 0 {
					return false // not UTF-8
				}
			} else {
				// A fresh slice: the engine keeps it. Empty but present
				// is not nil, as vtproto's decoder has it.
				o.data = append(make([]byte, 0, len(v)), v...)
			}
		default:
			return false
		}
	}
	if !r.Done() {
		return false
	}
	in.isOutput, in.out = true, o
	return true
}

// intern returns b as a string, the session's earlier copy if it has one;
// "" when b is not UTF-8.
func (in *sessionIn) intern(b []byte) string {
	if s, ok := in.ids[string(b)]; ok {
		return s
	}
	if !utf8.Valid(b) {
		return ""
	}
	if in.ids == nil {
		in.ids = make(map[string]string, 64)
	} else if len(in.ids) >= maxInternedIDs {
		clear(in.ids) // keeps its buckets: no growth again
	}
	s := string(b)
	in.ids[s] = s
	return s
}
