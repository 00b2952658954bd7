// Package integration_test runs real nodes (embedded etcd, gRPC and HTTP on
// loopback) with real SDK workers, and the real binary. Nothing of ours is
// mocked here.
//
// Tests that wait more than they work and share nothing with the others
// (the real binary's tests, the browser's, the HTTP edge's timeouts, the
// documentation's walks) call t.Parallel, so go test runs them together,
// GOMAXPROCS at a time, once the sequential tests are done. A test stays
// sequential when it holds a timing (heartbeats, pauses, paced readers) or
// checks the process's goroutines (waitGoroutinesGone, awaitNoGoroutine),
// which another test's would disturb.
package integration_test

import (
	"fmt"
	"net"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/switchyard/switchyard/integration/benchkit"
)

func TestMain(m *testing.M) {
	if addr := os.Getenv(bareSSEEnv); addr != "" {
		// Re-executed by BenchmarkIdleStreams as its plain SSE server.
		ln, err := net.Listen("tcp", addr)
		if err == nil {
			err = benchkit.ServeBareSSE(ln)
		}
		fmt.Fprintln(os.Stderr, "plain SSE server:", err)
		os.Exit(1)
	}
	if role := os.Getenv(benchRoleEnv); role != "" {
		// Re-executed by BenchmarkProcesses as one of the relay's processes.
		fmt.Fprintln(os.Stderr, "relay process:", runBenchRole(role))
		os.Exit(1)
	}
	goleak.VerifyTestMain(m)
}
