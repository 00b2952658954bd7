package peer_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/peer"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// syncBuffer is a log destination the server's goroutines and the test
// share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) lines(substr string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, l := range strings.Split(s.b.String(), "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return out
}

// A caller of a protocol version the node does not serve, or naming none,
// is refused on every call (unary and stream) with FailedPrecondition,
// after authentication; the refusal is counted, and logged once a minute
// per caller with both versions. A caller of the node's own version is
// served.
func TestPeerProtocolVersionIsChecked(t *testing.T) {
	logs := &syncBuffer{}
	h := &recorder{}
	b := startNode(t, "b", "127.0.0.1:0", h, func(c *peer.Config) {
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	raw, err := grpc.NewClient(b.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	bare := pb.NewPeerServiceClient(raw)
	as := func(node string, version ...string) context.Context {
		kv := []string{peer.MetadataNode, node, peer.MetadataAuth, peer.Token(secret, node)}
		for _, v := range version {
			kv = append(kv, peer.MetadataVersion, v)
		}
		return metadata.NewOutgoingContext(ctx, metadata.Pairs(kv...))
	}
	p, _ := peer.MessageToPB(final("j", 0))
	post := &pb.PostRequest{Session: "s", Messages: []*pb.PeerMessage{p}}

	refused := []struct {
		name string
		call func() error
	}{
		{"ping of version 2", func() error { _, err := bare.Ping(as("a", "2"), &pb.PingRequest{}); return err }},
		{"post of version 2", func() error { _, err := bare.Post(as("a", "2"), post); return err }},
		{"deliver of version 2", func() error {
			st, err := bare.Deliver(as("a", "2"))
			if err == nil {
				_, err = st.Recv()
			}
			return err
		}},
		{"respond of version 0", func() error {
			st, err := bare.Respond(as("a", "0"))
			if err == nil {
				_, err = st.Recv()
			}
			return err
		}},
		{"post naming no version", func() error { _, err := bare.Post(as("c"), post); return err }},
		{"post naming two", func() error { _, err := bare.Post(as("c", "1", "1"), post); return err }},
	}
	for _, tc := range refused {
		err := tc.call()
		if status.Code(err) != codes.FailedPrecondition {
			t.Errorf("%s: got %v, want FailedPrecondition", tc.name, err)
			continue
		}
		if msg := status.Convert(err).Message(); !strings.Contains(msg, "versions 1 to 1") {
			t.Errorf("%s: %q does not name the versions the node serves", tc.name, msg)
		}
	}
	wantCounters(t, b.reg, map[string]float64{
		"switchyard_peer_version_refusals_total": float64(len(refused)),
		"switchyard_peer_auth_failures_total":    0,
	})
	if len(h.messages()) != 0 {
		t.Errorf("the receiver got %d messages from refused calls", len(h.messages()))
	}
	// One line per caller, however many calls it made: a's names its
	// version 2 (its first refusal) and the node's range; c's names none.
	if got := logs.lines("node serves"); len(got) != 2 ||
		!strings.Contains(got[0], "peer=a peer_version=2 min_version=1 version=1") ||
		!strings.Contains(got[1], "peer=c peer_version=none") {
		t.Errorf("refusal log lines:\n%s\nwant one for a (version 2) and one for c (none), each naming versions 1 to 1", strings.Join(got, "\n"))
	}
	// Authentication comes first: a wrong secret is Unauthenticated,
	// whatever the version.
	bad := metadata.NewOutgoingContext(ctx, metadata.Pairs(peer.MetadataNode, "a", peer.MetadataAuth, peer.Token([]byte("another-secret-of-16+"), "a"), peer.MetadataVersion, "2"))
	if _, err := bare.Ping(bad, &pb.PingRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("wrong secret and version: got %v, want Unauthenticated", err)
	}

	// The node's own version is served, by hand and through a router.
	if _, err := bare.Post(as("a", "1"), post); err != nil {
		t.Errorf("post of version 1: %v", err)
	}
	r := newRouter(t, "d", secret, newBook("b", b.addr).Addr, nil)
	r.Send("b", final("k", 0))
	if err := r.Forward(ctx, "b", core.Delivery{JobID: "f", Queue: "q", Ingress: "d"}); err != nil {
		t.Errorf("forward of version %d: %v", peer.Version, err)
	}
	waitFor(t, 5*time.Second, "the router's message", func() bool { return len(h.messages()) == 2 })
}
