package grpcapi

import (
	"errors"
	"unicode/utf8"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/switchyard/switchyard/internal/pbcodec"
	"github.com/switchyard/switchyard/internal/pbwire"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// WorkerMessage's oneof fields that sessionIn decodes by hand.
const (
	fieldAccept   protowire.Number = 2
	fieldOutput   protowire.Number = 4
	fieldComplete protowire.Number = 5
	fieldBatch    protowire.Number = 9
)

// sessionIn is what a worker session's reader decodes each message into,
// one per session, reused for every message: the server's codec
// (codec.Unmarshal) fills it. The message's worker messages land in items,
// in order: one for a lone message, a batch's each (pb.Batch). An Output,
// an Accept and a Complete, most of what a worker sends, are decoded by
// hand into an item, with no message allocated around them and the job id
// taken from ids when the session saw it before; only an output's data
// and a result are allocated, a fresh slice each time, since the engine
// keeps them. Every other message, and one of those three whose encoding
// is anything but the plain one (a field twice, an unknown field, a wire
// type proto would refuse), is decoded by the session's codec
// (pbcodec.SessionCodec): into msg when it came alone, into a fresh
// message in a batch. Either way the strings are checked for UTF-8, as
// proto's codec would.
//
// A Batch is decoded only here, never by the generated code, which has no
// bound on nesting: a batch inside a batch is not decoded at all but
// becomes a refused item, as does a message that holds a batch beside
// another field (its handling ends the session: unexpected_message).
//
// Nothing of it may be kept past the handling of the message but the
// items' data, the messages they point to (fresh each time: the codec
// resets msg, which drops what it held) and the job id strings.
type sessionIn struct {
	items []item
	// batched is set when the message was a Batch.
	batched bool
	msg     pb.WorkerMessage
	// ids interns the job ids of the session's outputs, accepts and
	// completes: each is checked for UTF-8 once. Cleared when it holds
	// maxInternedIDs.
	ids map[string]string
}

// itemKind is what an item holds.
type itemKind uint8

const (
	itemMessage  itemKind = iota // msg
	itemOutput                   // jobID, gen, data
	itemAccept                   // jobID, gen
	itemComplete                 // jobID, gen, data (the result; nil: none)
	itemRefused                  // detail: the session ends
)

// item is one worker message of what the session read.
type item struct {
	kind   itemKind
	jobID  string
	gen    uint64
	data   []byte
	msg    *pb.WorkerMessage
	detail string
}

// maxInternedIDs bounds a session's ids: over the jobs a worker runs at
// once (its concurrency), so a session seldom decodes an id twice while
// its job runs.
const maxInternedIDs = 1024

// maxKeptItems bounds the items slice a session keeps between messages,
// so one huge batch does not hold its slice for the session's life.
const maxKeptItems = 1024

// Refusals of a batch's form: each ends the session (unexpected_message).
const (
	detailNestedBatch   = "a batch inside a batch; a batch holds only single messages"
	detailBatchNotAlone = "a batch must be its worker message's only field"
)

// errBatchOutsideSession: a WorkerMessage holding a Batch decoded into a
// plain message (codec.Unmarshal), where nothing bounds its nesting.
var errBatchOutsideSession = errors.New("grpcapi: a worker message holding a batch decodes only into a session's sessionIn")

// unmarshal decodes data into in, replacing what it held.
func (in *sessionIn) unmarshal(c pbcodec.SessionCodec, data mem.BufferSlice) error {
	if cap(in.items) > maxKeptItems {
		in.items = nil
	}
	clear(in.items) // drop the last message's data and messages
	in.items, in.batched = in.items[:0], false
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	b := buf.ReadOnlyData()
	if it, ok := in.decodeJob(b); ok {
		in.items = append(in.items, it)
		return nil
	}
	if body, ok := pbwire.Only(b, fieldBatch); ok {
		in.batched = true
		return in.decodeBatch(c, body)
	}
	if has, err := hasField(b, fieldBatch); err != nil || has {
		in.items = append(in.items, item{kind: itemRefused, detail: detailBatchNotAlone})
		return err
	}
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &in.msg); err != nil {
		return err
	}
	in.items = append(in.items, item{kind: itemMessage, msg: &in.msg})
	return nil
}

// decodeBatch decodes a Batch's body into in.items. Fields other than its
// messages are skipped, as proto skips unknown fields.
func (in *sessionIn) decodeBatch(c pbcodec.SessionCodec, b []byte) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if num != 1 || typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
			continue
		}
		m, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if it, ok := in.decodeJob(m); ok {
			in.items = append(in.items, it)
			continue
		}
		if has, err := hasField(m, fieldBatch); err != nil {
			return err
		} else if has {
			in.items = append(in.items, item{kind: itemRefused, detail: detailNestedBatch})
			continue
		}
		msg := new(pb.WorkerMessage)
		if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(m)}, msg); err != nil {
			return err
		}
		in.items = append(in.items, item{kind: itemMessage, msg: msg})
	}
	return nil
}

// decodeJob decodes b as a WorkerMessage holding an Output, an Accept or a
// Complete, encoded the plain way: the oneof's field once, its fields each
// at most once, of their own wire types, nothing else (an Accept has no
// field 3). False for anything else.
func (in *sessionIn) decodeJob(b []byte) (item, bool) {
	var it item
	if len(b) == 0 {
		return it, false
	}
	// Each of the three has a one-byte tag.
	switch protowire.Number(b[0] >> 3) {
	case fieldOutput:
		it.kind = itemOutput
	case fieldAccept:
		it.kind = itemAccept
	case fieldComplete:
		it.kind = itemComplete
	default:
		return it, false
	}
	body, ok := pbwire.Only(b, protowire.Number(b[0]>>3))
	if !ok {
		return it, false
	}
	last := protowire.Number(3)
	if it.kind == itemAccept {
		last = 2
	}
	r := pbwire.NewPlain(body, last)
	for r.Next() {
		switch {
		case r.Num == 2 && r.Type == protowire.VarintType:
			if it.gen, ok = r.Varint(); !ok {
				return it, false
			}
		case r.Num != 2 && r.Type == protowire.BytesType:
			v, ok := r.Bytes()
			if !ok {
				return it, false
			}
			if r.Num == 1 {
				it.jobID = in.intern(v)
				if it.jobID == "" && len(v) > 0 {
					return it, false // not UTF-8
				}
			} else if it.kind == itemOutput || len(v) > 0 {
				// A fresh slice: the engine keeps it. An output's empty
				// but present data is not nil, as vtproto's decoder has
				// it; an empty result is none.
				it.data = append(make([]byte, 0, len(v)), v...)
			}
		default:
			return it, false
		}
	}
	return it, r.Done()
}

// hasField reports whether b, a message's encoding, holds field num at its
// top level. It fails when the top level is malformed, which is then not
// to be decoded at all: the generated decoder would recurse into a field
// 9 before it found what is wrong after it.
func hasField(b []byte, num protowire.Number) (bool, error) {
	has := false
	for len(b) > 0 {
		n, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return false, protowire.ParseError(l)
		}
		has = has || n == num
		b = b[l:]
		if l = protowire.ConsumeFieldValue(n, typ, b); l < 0 {
			return false, protowire.ParseError(l)
		}
		b = b[l:]
	}
	return has, nil
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
