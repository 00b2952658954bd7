// Package integration_test runs real nodes (embedded etcd, gRPC and HTTP on
// loopback) with real SDK workers, and the real binary. Nothing of ours is
// mocked here.
package integration_test

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
