package integration_test

import (
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/switchyard/switchyard/internal/grpctest"
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
