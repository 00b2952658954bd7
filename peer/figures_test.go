package peer_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/peer"
)

// Figures carries a node's figures to a peer as they were read, only to a
// member of the cluster, and is counted as kind "figures", not routing.
func TestFigures(t *testing.T) {
	want := core.NodeFigures{
		Node:        "b",
		JobsEnded:   map[string]uint64{"completed": 7, "failed": 1, "cancelled": 0, "expired": 2},
		FirstOutput: core.Histogram{Bounds: []float64{0.001, 0.002, 0.004}, Counts: []uint64{1, 4, 9}, Count: 10},
		StreamsOpen: 3,
		Queues:      []core.QueueStat{{Name: "chat", Depth: 0, Bound: 2}, {Name: "demo", Depth: 5, Bound: 16}},
	}
	srv := startNode(t, "b", "127.0.0.1:0", nil, func(c *peer.Config) {
		c.Figures = func() core.NodeFigures { return want }
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	if _, err := newClient(t, "a", []byte("another-secret-of-16+")).Figures(ctx, "b", srv.addr); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("Figures with the wrong secret: %v, want Unauthenticated", err)
	}
	got, err := newClient(t, "a", secret).Figures(ctx, "b", srv.addr)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("figures\n got %+v\nwant %+v", got, want)
	}
	if n := counter(t, srv.reg, "switchyard_peer_messages_total", map[string]string{"kind": "figures"}); n != 1 {
		t.Errorf("figures calls counted %v, want 1", n)
	}

	// A node that reads none says so.
	bare := startServer(t, "c")
	if _, err := newClient(t, "a", secret).Figures(ctx, "c", bare.addr); status.Code(err) != codes.Unavailable {
		t.Errorf("Figures of a node without figures: %v, want Unavailable", err)
	}
}
