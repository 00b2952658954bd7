package stream_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: every Run
// a test starts must have returned, and every appender must have stopped.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
