// Package integration_test runs real nodes (embedded etcd, gRPC and HTTP on
// loopback) with real SDK workers, and the real binary. Nothing of ours is
// mocked here.
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
