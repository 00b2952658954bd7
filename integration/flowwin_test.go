package integration_test

import (
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/internal/grpctest"
	"github.com/switchyard/switchyard/peer"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
	"github.com/switchyard/switchyard/worker"
)

// TestWorkerSessionSendsNoBandwidthPings: the node's gRPC server and the Go
// worker SDK use static flow-control windows (internal/flowwin), so no side
// of a worker session sends the PINGs of gRPC's bandwidth-delay estimate,
// which a gRPC connection with the default windows sends for a burst of
// data it reads — as the plain JobService client below does, the control
// that shows the count sees them.
func TestWorkerSessionSendsNoBandwidthPings(t *testing.T) {
	n := MustStartNode(t, nil)
	var session grpctest.Frames
	MustStartWorker(t, n, worker.Config{DialOptions: []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(session.Dial),
	}}, worker.Tokens(time.Millisecond)) // an output a millisecond: a burst each

	var plain grpctest.Frames
	c := jobsClient(t, n, grpc.WithContextDialer(plain.Dial))
	for range 5 {
		evs := submitAll(t, t.Context(), c, "demo", `{"input":"a b c d e f g h","ttl_ms":10000}`)
		if k := kinds(evs); len(k) != 10 || k[len(k)-1] != "done" {
			t.Fatalf("job events: %v", k)
		}
	}

	if got := plain.Sent(); got.BDPPings == 0 {
		t.Fatalf("the plain client sent no bandwidth PINGs (%+v) while it read %+v: the count cannot see them", got, plain.Received())
	}
	sent, recv := session.Sent(), session.Received()
	if sent.Data < 5*8 || recv.Data < 5 {
		t.Fatalf("the worker session carried too little to tell: sent %+v, received %+v", sent, recv)
	}
	if sent.BDPPings != 0 || recv.BDPPings != 0 {
		t.Errorf("bandwidth PINGs on the worker session: the worker sent %d, the node %d (frames: sent %+v, received %+v)", sent.BDPPings, recv.BDPPings, sent, recv)
	}
}

// TestPeerConnectionsSendNoBandwidthPings: the peer server and client use
// static windows too, so neither end of a connection between two nodes
// sends the bandwidth-estimate PINGs, while jobs submitted on one node run
// on the other's worker and their outputs cross in bursts. The control is
// a peer connection of the test's own to a node, through the same
// handshake but with gRPC's default windows: its Pings' answers make it
// send them, so the count sees them past the handshake.
func TestPeerConnectionsSendNoBandwidthPings(t *testing.T) {
	var conns [2]grpctest.Frames // each node's connections to the other
	nodes := startCluster(t, 2, func(i int, c *switchyard.Config) { c.PeerDialer = conns[i].Dial })
	n1, n2 := nodes[0], nodes[1]
	MustStartWorker(t, n2, worker.Config{Name: "w2"}, worker.Tokens(time.Millisecond)) // an output a millisecond: a burst each
	waitFor(t, 5*time.Second, "n2 dispatches demo in n1's view", func() bool {
		d, ok := n1.Catalog().Dispatch("demo")
		return ok && d.Dispatcher == "n2"
	})

	var control grpctest.Frames
	cc := grpctest.Dial(t, n2.PeerAddr(), grpc.WithContextDialer(control.Dial),
		grpc.WithTransportCredentials(peer.Credentials(peer.CredentialsConfig{Secret: []byte(testSecret), Node: "control", Peer: "n2"})))
	ctx := metadata.AppendToOutgoingContext(t.Context(), peer.MetadataVersion, strconv.Itoa(peer.Version))
	for range 3 {
		if res, err := pb.NewPeerServiceClient(cc).Ping(ctx, &pb.PingRequest{}); err != nil || res.GetNode() != "n2" {
			t.Fatalf("control Ping = %v, %v; want n2", res, err)
		}
	}
	if sent, recv := control.Sent(), control.Received(); sent.BDPPings == 0 || recv.Data < 3 {
		t.Fatalf("the control peer connection sent no bandwidth PINGs (%+v) while it read %+v: the count cannot see them past the handshake", sent, recv)
	}

	// DATA frames each way, on either node's connections.
	toN2 := func() int { return conns[0].Sent().Data + conns[1].Received().Data }
	toN1 := func() int { return conns[1].Sent().Data + conns[0].Received().Data }
	beforeN2, beforeN1 := toN2(), toN1()
	c := jobsClient(t, n1)
	for range 5 {
		evs := submitAll(t, t.Context(), c, "demo", `{"input":"a b c d e f g h","ttl_ms":10000}`)
		if k := kinds(evs); len(k) != 10 || k[len(k)-1] != "done" {
			t.Fatalf("job events: %v", k)
		}
	}

	// A frame a job each way at the least (a forward, its outputs): the
	// counted connections are the ones the jobs crossed.
	if fwd, out := toN2()-beforeN2, toN1()-beforeN1; fwd < 5 || out < 5 {
		t.Fatalf("the peer connections carried too little to tell: %d DATA frames to n2 and %d to n1 while 5 jobs crossed", fwd, out)
	}
	for i := range conns {
		sent, recv := conns[i].Sent(), conns[i].Received()
		if sent.BDPPings != 0 || recv.BDPPings != 0 {
			t.Errorf("bandwidth PINGs on n%d's peer connections: it sent %d, the other node %d (frames: sent %+v, received %+v)", i+1, sent.BDPPings, recv.BDPPings, sent, recv)
		}
	}
}
