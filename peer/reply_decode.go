package peer

import (
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/switchyard/switchyard/internal/pbcodec"
	"github.com/switchyard/switchyard/internal/pbwire"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// frameIn is what a reply stream's reader decodes each RespondFrame into,
// one per reply stream, reused for every frame: the server's codec
// (codec.Unmarshal) fills it. A frame of items, most of what a host sends,
// is decoded by hand into messages kept from frame to frame, its strings
// (job id, queue, consumer, worker name: the same for every item of a leg;
// an open's session) taken from the stream's interned copies, and each output's bytes a slice
// of the frame's own buffer, kept until the next decode: the receiver
// reads an output during HandleMessage and keeps none (core.Receiver).
// Only an end and an open are allocated, fresh each time, since the engine
// keeps them (an open's strings interned too). Every other frame, and a frame of items encoded any other
// way than the plain one (a field twice, an unknown field, a wire type
// vtproto's decoder would refuse), is decoded by vtproto into slow, as
// before.
//
// What frame returns is valid until the next decode: the reader handles
// each frame before it reads the next, and keeps nothing of its messages
// but strings, an end and an open.
type frameIn struct {
	fast bool
	// The fast path's frame: body holds items, whose Items are the first
	// n of pool (each item's Message is its own message in msgs, or nil).
	frame pb.RespondFrame
	body  pb.RespondFrame_Items
	items pb.RespondItems
	pool  []*pb.RespondItem
	msgs  []*pb.PeerMessage
	n     int
	slow  pb.RespondFrame
	// buf holds the fast path's frame, its outputs' bytes included, until
	// the next decode (nil after a slow one).
	buf mem.Buffer
	ids interned
	// last holds the job id, queue, consumer, worker name and session last
	// decoded: a frame's items are mostly one leg's, so the next item's are
	// the same, found without hashing.
	last [5]string
}

// interned holds the strings of a stream's items, each decoded once.
// Cleared when it holds maxInterned, which is well over the legs a reply
// stream carries at once (a host's jobs in flight for this node).
type interned map[string]string

const maxInterned = 4096

func (t *interned) get(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if s, ok := (*t)[string(b)]; ok {
		return s
	}
	if *t == nil {
		*t = make(interned, 64)
	} else if len(*t) >= maxInterned {
		clear(*t) // keeps its buckets: no growth again
	}
	s := string(b)
	(*t)[s] = s
	return s
}

// str is v as a string: the one last decoded into slot if equal, else
// the interned copy.
func (in *frameIn) str(slot int, v []byte) string {
	if s := in.last[slot]; s == string(v) {
		return s
	}
	s := in.ids.get(v)
	in.last[slot] = s
	return s
}

// get is the frame last decoded.
func (in *frameIn) get() *pb.RespondFrame {
	if in.fast {
		return &in.frame
	}
	return &in.slow
}

// unmarshal decodes data into in, replacing what it held.
func (in *frameIn) unmarshal(c pbcodec.Codec, data mem.BufferSlice) error {
	in.clear()
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	if in.decodeItems(buf.ReadOnlyData()) {
		in.fast, in.buf = true, buf
		return nil
	}
	buf.Free()
	in.clear()
	in.fast = false
	return c.Unmarshal(data, &in.slow)
}

// clear drops what the last frame held (its outputs, ends and opens), so
// that nothing of it is kept alive by the reused messages, and gives its
// buffer back to the pool.
func (in *frameIn) clear() {
	if in.buf != nil {
		in.buf.Free()
		in.buf = nil
	}
	for i := range in.n {
		in.pool[i].Reset()
		in.msgs[i].Reset()
	}
	in.n = 0
	in.items.Items = nil
	in.slow.Reset()
}

// decodeItems decodes b as a RespondFrame holding items, encoded the plain
// way (see frameIn): false for anything else, then in.n items hold
// whatever was decoded so far.
func (in *frameIn) decodeItems(b []byte) bool {
	body, ok := pbwire.Only(b, 5)
	if !ok {
		return false
	}
	for len(body) > 0 {
		num, typ, n := protowire.ConsumeTag(body)
		if n < 0 || num != 1 || typ != protowire.BytesType {
			return false
		}
		body = body[n:]
		v, n := protowire.ConsumeBytes(body)
		if n < 0 || !in.decodeItem(in.next(), v) {
			return false
		}
		body = body[n:]
	}
	in.items.Items = in.pool[:in.n]
	in.body.Items = &in.items
	in.frame.Body = &in.body
	return true
}

// next is the next item of the pool, counted in in.n, with its message.
func (in *frameIn) next() *pb.RespondItem {
	if in.n == len(in.pool) {
		in.pool = append(in.pool, &pb.RespondItem{})
		in.msgs = append(in.msgs, &pb.PeerMessage{})
	}
	it := in.pool[in.n]
	it.Message = in.msgs[in.n]
	in.n++
	return it
}

// decodeItem decodes b into it: its seq, its message (nil if absent) and
// its open (a fresh one: the stream's handler may keep it).
func (in *frameIn) decodeItem(it *pb.RespondItem, b []byte) bool {
	m := it.Message
	it.Message = nil
	r := pbwire.NewPlain(b, 3)
	for r.Next() {
		var ok bool
		switch {
		case r.Num == 1 && r.Type == protowire.VarintType:
			it.Seq, ok = r.Varint()
		case r.Num == 2 && r.Type == protowire.BytesType:
			var v []byte
			if v, ok = r.Bytes(); ok && in.decodeMessage(m, v) {
				it.Message = m
			} else {
				return false
			}
		case r.Num == 3 && r.Type == protowire.BytesType:
			var v []byte
			if v, ok = r.Bytes(); ok {
				it.Open, ok = in.decodeOpen(v)
			}
		}
		if !ok {
			return false
		}
	}
	return r.Done()
}

// decodeOpen decodes b as a leg's open, a fresh one (the stream's handler
// keeps it), its strings the stream's interned copies: false when it is
// not encoded the plain way.
func (in *frameIn) decodeOpen(b []byte) (*pb.RespondOpen, bool) {
	o := &pb.RespondOpen{}
	r := pbwire.NewPlain(b, 6)
	for r.Next() {
		var ok bool
		switch r.Type {
		case protowire.BytesType:
			var v []byte
			if v, ok = r.Bytes(); !ok {
				return nil, false
			}
			switch r.Num {
			case 1:
				o.Session = in.str(4, v)
			case 2:
				o.JobId = in.str(0, v)
			case 4:
				o.Queue = in.str(1, v)
			default:
				return nil, false
			}
		case protowire.VarintType:
			var v uint64
			if v, ok = r.Varint(); !ok {
				return nil, false
			}
			switch r.Num {
			case 3:
				o.Generation = v
			case 5:
				o.HeartbeatIntervalNs = int64(v)
			case 6:
				o.TtlNs = int64(v)
			default:
				return nil, false
			}
		default:
			return nil, false
		}
	}
	return o, r.Done()
}

// decodeMessage decodes b into m (reset), a reply or a release: each field
// a reply stream carries at most once, of its own wire type; a delivery or
// an unknown field sends the frame the slow way.
func (in *frameIn) decodeMessage(m *pb.PeerMessage, b []byte) bool {
	r := pbwire.NewPlain(b, 20)
	for r.Next() {
		switch r.Type {
		case protowire.VarintType:
			v, ok := r.Varint()
			if !ok {
				return false
			}
			switch r.Num {
			case 1:
				m.Kind = pb.PeerMessage_Kind(int32(v))
			case 3:
				m.Generation = v
			case 8:
				m.Accepted = v != 0
			case 11:
				m.Rejected = v != 0
			case 20:
				m.Running = v != 0
			case 14:
				m.TtlNs = int64(v)
			case 15:
				m.CreditEvents = v
			case 16:
				m.CreditBytes = v
			default:
				return false
			}
		case protowire.BytesType:
			v, ok := r.Bytes()
			if !ok {
				return false
			}
			switch r.Num {
			case 2:
				m.JobId = in.str(0, v)
			case 4:
				m.Queue = in.str(1, v)
			case 6:
				m.Consumer = in.str(2, v)
			case 7:
				m.WorkerName = in.str(3, v)
			case 9:
				// A slice of the frame's buffer, capped so that nothing
				// appends into what follows. Empty but present is not
				// nil, as vtproto's decoder has it.
				m.Output = v[:len(v):len(v)]
				if m.Output == nil {
					m.Output = []byte{}
				}
			case 10:
				m.End = &pb.PeerEnd{}
				if m.End.UnmarshalVT(v) != nil {
					return false
				}
			case 12:
				m.Reason = string(v)
			case 13:
				m.Code = in.ids.get(v)
			default:
				return false
			}
		default:
			return false
		}
	}
	return r.Done()
}
