package catalog_test

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain fails the package if any goroutine outlives the tests: every
// Catalog owns its goroutines and Close must end them.
//
// Goroutines are given up to peerConnDrain to end. The members of an
// embedded cluster talk over HTTP connections that etcd does not close when
// a member stops: each ends by itself within rafthttp's read timeout (5s),
// once the other side closes it or its read times out.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		const peerConnDrain = 10 * time.Second
		deadline := time.Now().Add(peerConnDrain)
		err := goleak.Find()
		for err != nil && time.Now().Before(deadline) {
			time.Sleep(250 * time.Millisecond)
			err = goleak.Find()
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "goleak: Errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
