package peer_test

import (
	"context"
	"testing"
	"time"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/peer"
)

// signaller is a core.Receiver that reports each message handled.
type signaller struct {
	recorder
	handled chan struct{}
}

func (s *signaller) HandleForward(string, core.Delivery) error { return nil }
func (s *signaller) HandleMessage(string, core.Message)        { s.handled <- struct{}{} }

// benchPair starts node b's peer transport and node a's, a sending to b
// over loopback with real authentication.
func benchPair(b *testing.B, forceUnary bool) (tnode, *signaller) {
	b.Helper()
	h := &signaller{handled: make(chan struct{}, 1)}
	srv := startNode(b, "b", "127.0.0.1:0", h, nil)
	r := startNode(b, "a", "", nil, func(c *peer.Config) {
		*c = peer.Config{Node: "a", Secret: secret, MaxMessageBytes: 1 << 20, ForceUnary: forceUnary,
			Addr: func(string) (string, bool) { return srv.addr, true }}
	})
	return r, h
}

// BenchmarkDeliver measures one delivery at a time from one node to
// another (the latency of a hop, not a pipelined throughput): a deliver
// sent by Send until the receiver's handler has it, and a synchronous
// Forward until its verdict is back, each over a delivery stream's gRPC stream
// ("streamed") and over unary calls ("unary", Config.ForceUnary).
// It reports µs per delivery.
func BenchmarkDeliver(b *testing.B) {
	modes := []struct {
		name  string
		unary bool
	}{{"streamed", false}, {"unary", true}}
	for _, mode := range modes {
		b.Run("send/"+mode.name, func(b *testing.B) {
			r, h := benchPair(b, mode.unary)
			m := deliverMsg("q", "j", 0)
			r.Send("b", m) // open the connection (and the stream)
			<-h.handled
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				r.Send("b", m)
				<-h.handled
			}
			b.ReportMetric(float64(time.Since(start).Microseconds())/float64(b.N), "µs/delivery")
		})
	}
	for _, mode := range modes {
		b.Run("forward/"+mode.name, func(b *testing.B) {
			r, _ := benchPair(b, mode.unary)
			ctx := context.Background()
			d := core.Delivery{JobID: "j", Queue: "q", Ingress: "a", TTL: time.Minute}
			if err := r.Forward(ctx, "b", d); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				if err := r.Forward(ctx, "b", d); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(time.Since(start).Microseconds())/float64(b.N), "µs/delivery")
		})
	}
}
