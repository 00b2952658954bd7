package peer_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/peer"
)

// signaller is a Handler that reports each message and forward handled.
type signaller struct{ handled chan struct{} }

func (s signaller) HandleForward(string, core.Delivery) error { return nil }
func (s signaller) HandleMessage(string, core.Message)        { s.handled <- struct{}{} }

// benchPair starts node b's peer server and node a's router to it, over
// loopback with real authentication.
func benchPair(b *testing.B, forceUnary bool) (*peer.Router, signaller) {
	b.Helper()
	h := signaller{handled: make(chan struct{}, 1)}
	srv, err := peer.NewServer(peer.ServerConfig{Node: "b", Secret: secret, MaxMessageBytes: 1 << 20, MaxConcurrentStreams: 100, Handler: h})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	c := peer.NewClient(peer.ClientConfig{Node: "a", Secret: secret, MaxMessageBytes: 1 << 20})
	addr := ln.Addr().String()
	r, err := peer.NewRouter(peer.RouterConfig{Client: c, Addr: func(string) (string, bool) { return addr, true }, ForceUnary: forceUnary})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = r.Close()
		_ = c.Close()
		srv.Stop()
		<-done
	})
	return r, h
}

// BenchmarkDeliver measures one delivery at a time from one node to
// another (the latency of a hop, not a pipelined throughput): a deliver
// sent by Send until the receiver's handler has it, and a synchronous
// Forward until its verdict is back, each over a lane's Deliver stream
// ("streamed") and over unary calls ("unary", RouterConfig.ForceUnary).
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
