package grpcapi

import (
	"testing"

	"go.uber.org/goleak"
)

// Every sender goroutine must end with its stream.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
