package peer

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"

	"github.com/switchyard/switchyard/internal/pbcodec"
)

// The peer connections encode and decode our messages with their
// generated vtproto code (pbcodec), on both ends. Proto's codec sizes each
// message by reflection, twice for one under 1 KiB; its sizing and
// encoding, with its decoding, made up about a quarter of a consumer host's
// CPU under load (docs/perf.md).
// vtproto's decoder does not check UTF-8; it need not here, since a node
// checks every message it queues for a peer (wireValid) and reports one
// without a wire form as undeliverable, and only authenticated nodes reach
// the codec.
func serverCodec() grpc.ServerOption { return grpc.ForceServerCodecV2(codec{pbcodec.New()}) }
func callCodec() grpc.CallOption     { return grpc.ForceCodecV2(pbcodec.New()) }

// codec is the peer server's: pbcodec's, but for a reply stream's frames,
// which the reader decodes into its reused frameIn (reply_decode.go).
type codec struct{ pbcodec.Codec }

// Unmarshal decodes data into v.
func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	if in, ok := v.(*frameIn); ok {
		return in.unmarshal(c.Codec, data)
	}
	return c.Codec.Unmarshal(data, v)
}
