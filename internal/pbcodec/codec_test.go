package pbcodec_test

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/switchyard/switchyard/internal/pbcodec"
	"github.com/switchyard/switchyard/internal/pbtest"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// Every message of ours has its vtproto code: a message without it would
// quietly take proto's slower path (make proto generates it for every
// file).
func TestCodecCoversEveryMessage(t *testing.T) {
	for _, mt := range pbtest.Messages(t) {
		if _, ok := mt.New().Interface().(pbcodec.Message); !ok {
			t.Errorf("%s has no vtproto code (size, marshal, unmarshal)", mt.Descriptor().FullName())
		}
	}
}

// For every message of ours, with every field set (each oneof case in turn,
// repeated fields and maps with several entries, nested messages too), the
// codec's bytes decode with proto into the same message, proto's bytes
// decode with the codec into the same message, and decoding into a message
// that held something else replaces it.
func TestCodecMatchesProto(t *testing.T) {
	c := pbcodec.New()
	for _, mt := range pbtest.Messages(t) {
		d := mt.Descriptor()
		for variant := range pbtest.Variants(d) {
			m := mt.New()
			pbtest.Fill(m, variant, 0)
			name := fmt.Sprintf("%s/%d", d.FullName(), variant)
			want := m.Interface()

			enc, err := c.Marshal(want)
			if err != nil {
				t.Fatalf("%s: codec marshal: %v", name, err)
			}
			got := mt.New().Interface()
			if err := proto.Unmarshal(enc.Materialize(), got); err != nil {
				t.Fatalf("%s: proto cannot read the codec's bytes: %v", name, err)
			}
			enc.Free()
			if !proto.Equal(got, want) {
				t.Fatalf("%s: codec → proto\n got %v\nwant %v", name, got, want)
			}

			b, err := proto.Marshal(want)
			if err != nil {
				t.Fatalf("%s: proto marshal: %v", name, err)
			}
			if n := want.(pbcodec.Message).SizeVT(); n != len(b) {
				t.Fatalf("%s: SizeVT %d, proto's bytes %d", name, n, len(b))
			}
			stale := mt.New()
			pbtest.Fill(stale, variant+1, 0)
			into := stale.Interface()
			if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, into); err != nil {
				t.Fatalf("%s: codec cannot read proto's bytes: %v", name, err)
			}
			if !proto.Equal(into, want) {
				t.Fatalf("%s: proto → codec, into a message that held another\n got %v\nwant %v", name, into, want)
			}
		}
	}
}

// A message above gRPC's pooling threshold is encoded into a pooled buffer
// and reads back the same.
func TestCodecLargeMessage(t *testing.T) {
	m := &pb.PeerMessage{JobId: "j_large", Queue: "demo", Output: []byte(strings.Repeat("x", 64<<10))}
	c := pbcodec.New()
	enc, err := c.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if enc.Len() <= 64<<10 {
		t.Fatalf("encoded %d bytes, want more than the data's %d", enc.Len(), 64<<10)
	}
	got := &pb.PeerMessage{}
	if err := c.Unmarshal(enc, got); err != nil {
		t.Fatal(err)
	}
	enc.Free()
	if !proto.Equal(got, m) {
		t.Fatalf("round trip changed the message: %d bytes of data, want %d", len(got.GetOutput()), len(m.GetOutput()))
	}
}

// A message that is not ours goes through proto's codec.
func TestCodecOtherMessages(t *testing.T) {
	c := pbcodec.New()
	in := wrapperspb.String("not ours")
	enc, err := c.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	got := &wrapperspb.StringValue{}
	if err := c.Unmarshal(enc, got); err != nil {
		t.Fatal(err)
	}
	if got.GetValue() != in.GetValue() {
		t.Fatalf("got %q, want %q", got.GetValue(), in.GetValue())
	}
	if _, err := c.Marshal(struct{}{}); err == nil {
		t.Fatal("marshalled a value that is no message")
	}
}
