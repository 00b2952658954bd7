// Package flowwin sets the HTTP/2 flow-control windows of the gRPC
// connections Switchyard makes and serves itself: node to node (peer) and
// node to worker (the public server and the Go worker SDK).
//
// The windows are static. gRPC's default sizes them by estimating the
// link's bandwidth-delay product, and that estimate is bought with frames:
// a receiver that reads data after a quiet spell sends a connection
// WINDOW_UPDATE and a PING, and the sender answers the PING, each in a
// write of its own and each waking both sides' transport goroutines.
// Switchyard's traffic is bursts — a job's offer, its outputs, its reply
// leg — so that happens once per burst on every connection a job crosses:
// on a job alone on the cluster, three of the consumer host's six write
// syscalls were those frames (docs/perf.md, "Static flow-control
// windows"). A static window sends no PING, and a WINDOW_UPDATE only once
// a quarter of the window was read.
//
// What a static window gives up is growth on links whose bandwidth-delay
// product is larger than the window: one stream then moves at most a
// window per round trip (4 MiB per 80 ms is 50 MB/s). The window is at
// least one largest message, so any message may be sent whole without
// waiting for a window update; a connection's window is four streams'.
package flowwin

import "google.golang.org/grpc"

const (
	// MinStream is the smallest stream window, and the Go worker SDK's.
	MinStream = 4 << 20
	// connStreams is how many full stream windows a connection's window
	// holds.
	connStreams = 4
	// maxWindow is the largest window HTTP/2 allows (2^31-1), rounded down.
	maxWindow = 1 << 30
)

// Windows are the stream and connection windows for connections whose
// largest message is maxMessage bytes.
func Windows(maxMessage int) (stream, conn int32) {
	s := min(max(maxMessage, MinStream), maxWindow)
	return int32(s), int32(min(s*connStreams, maxWindow))
}

// ServerOptions are a gRPC server's static windows.
func ServerOptions(maxMessage int) []grpc.ServerOption {
	s, c := Windows(maxMessage)
	return []grpc.ServerOption{grpc.StaticStreamWindowSize(s), grpc.StaticConnWindowSize(c)}
}

// DialOptions are a gRPC client's static windows.
func DialOptions(maxMessage int) []grpc.DialOption {
	s, c := Windows(maxMessage)
	return []grpc.DialOption{grpc.WithStaticStreamWindowSize(s), grpc.WithStaticConnWindowSize(c)}
}
