package peer_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/internal/syncbuf"
	"github.com/switchyard/switchyard/peer"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// firstRecvErr is a stream's refusal: the error of opening it (err), else
// of its first Recv. Called as firstRecvErr(c.Deliver(ctx)).
func firstRecvErr[T any](st interface{ Recv() (T, error) }, err error) error {
	if err == nil {
		_, err = st.Recv()
	}
	return err
}

// A caller of a protocol version the node does not serve, or naming none,
// is refused on every call (unary and stream) with FailedPrecondition,
// after authentication; the refusal is counted, and logged once a minute
// per caller with both versions. A caller of the node's own version is
// served.
func TestPeerProtocolVersionIsChecked(t *testing.T) {
	logs := &syncbuf.Buffer{}
	h := &recorder{}
	b := startNode(t, "b", "127.0.0.1:0", h, func(c *peer.Config) {
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Clients that pass the handshake as a and as c, and add no version
	// of their own: each call names the version it claims.
	bare := map[string]pb.PeerServiceClient{"a": dialPeer(t, b.addr, "a", "b", secret), "c": dialPeer(t, b.addr, "c", "b", secret)}
	as := func(node string, version ...string) (context.Context, pb.PeerServiceClient) {
		var kv []string
		for _, v := range version {
			kv = append(kv, peer.MetadataVersion, v)
		}
		return metadata.NewOutgoingContext(ctx, metadata.Pairs(kv...)), bare[node]
	}
	p, _ := peer.MessageToPB(final("j", 0))
	post := &pb.PostRequest{Session: "s", Messages: []*pb.PeerMessage{p}}

	refused := []struct {
		name string
		call func() error
	}{
		{"ping of version 2", func() error { ctx, c := as("a", "2"); _, err := c.Ping(ctx, &pb.PingRequest{}); return err }},
		{"post of version 2", func() error { ctx, c := as("a", "2"); _, err := c.Post(ctx, post); return err }},
		{"deliver of version 2", func() error { ctx, c := as("a", "2"); return firstRecvErr(c.Deliver(ctx)) }},
		{"respond of version 0", func() error { ctx, c := as("a", "0"); return firstRecvErr(c.Respond(ctx)) }},
		{"post naming no version", func() error { ctx, c := as("c"); _, err := c.Post(ctx, post); return err }},
		{"post naming two", func() error { ctx, c := as("c", "1", "1"); _, err := c.Post(ctx, post); return err }},
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
	if got := logs.Lines("node serves"); len(got) != 2 ||
		!strings.Contains(got[0], "peer=a peer_version=2 min_version=1 version=1") ||
		!strings.Contains(got[1], "peer=c peer_version=none") {
		t.Errorf("refusal log lines:\n%s\nwant one for a (version 2) and one for c (none), each naming versions 1 to 1", strings.Join(got, "\n"))
	}
	// Authentication comes first: a wrong secret fails the connection's
	// handshake, whatever the version a call would name.
	if _, err := dialPeer(t, b.addr, "a", "b", []byte("another-secret-of-16+")).Ping(metadata.NewOutgoingContext(ctx, metadata.Pairs(peer.MetadataVersion, "2")), &pb.PingRequest{}); status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "does not prove the cluster secret") {
		t.Errorf("wrong secret and version: got %v, want the handshake refused", err)
	}

	// The node's own version is served, by hand and through a router.
	v1, c := as("a", "1")
	if _, err := c.Post(v1, post); err != nil {
		t.Errorf("post of version 1: %v", err)
	}
	r := newRouter(t, "d", secret, newBook("b", b.addr).Addr, nil)
	r.Send("b", final("k", 0))
	if err := r.Forward(ctx, "b", core.Delivery{JobID: "f", Queue: "q", Ingress: "d"}); err != nil {
		t.Errorf("forward of version %d: %v", peer.Version, err)
	}
	waitFor(t, 5*time.Second, "the router's message", func() bool { return len(h.messages()) == 2 })
}
