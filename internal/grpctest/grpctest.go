// Package grpctest serves gRPC in tests, as net/http/httptest serves HTTP:
// a server on a loopback port for as long as the test runs, a client
// connection to one, a stream read to its end, and a count of the HTTP/2
// frames a connection carries (Frames).
package grpctest

import (
	"errors"
	"io"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Serve serves srv, its services registered, on a free 127.0.0.1 port and
// returns the address. When tb ends, srv is stopped (every connection and
// stream closed at once) and Serve has returned; cleanups registered
// before Serve run after that.
func Serve(tb testing.TB, srv *grpc.Server) string {
	tb.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(lis)
	}()
	tb.Cleanup(func() {
		srv.Stop()
		<-served
	})
	return lis.Addr().String()
}

// Dial is a client connection to addr without TLS, with opts, closed when
// tb ends (after the cleanups registered later, so they may still use it).
func Dial(tb testing.TB, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	tb.Helper()
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = conn.Close() })
	return conn
}

// RecvEach calls recv (a stream's Recv) until the stream ends (io.EOF),
// passing each message to each in order; any other error fails tb.
func RecvEach[T any](tb testing.TB, recv func() (T, error), each func(T)) {
	tb.Helper()
	for {
		m, err := recv()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			tb.Fatalf("recv: %v", err)
		}
		each(m)
	}
}
