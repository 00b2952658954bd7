package tracing_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: an
// exporter's, after Shutdown.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
