package catalog_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any goroutine outlives the tests: every
// Catalog owns its goroutines and Close must end them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
