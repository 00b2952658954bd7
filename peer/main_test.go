package peer_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a server, client or tracker goroutine
// outlives its test.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
