package core_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any test leaves a goroutine behind: every
// timer callback the engine arms must have finished or been stopped.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
