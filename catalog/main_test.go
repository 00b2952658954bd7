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
//
// One goroutine is exempt, by name: etcd's peer version handler serving a
// request that reached a member the crash test stopped with HardStop. It
// waits forever on that member's storage lock, which a crashed member never
// releases; that is the crash being simulated, inside etcd, not a leak of
// ours.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		const peerConnDrain = 10 * time.Second
		crashed := goleak.IgnoreAnyFunction("go.etcd.io/etcd/server/v3/etcdserver/api/etcdhttp.newPeerHandler.versionHandler.func1")
		deadline := time.Now().Add(peerConnDrain)
		err := goleak.Find(crashed)
		for err != nil && time.Now().Before(deadline) {
			time.Sleep(250 * time.Millisecond)
			err = goleak.Find(crashed)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "goleak: Errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
