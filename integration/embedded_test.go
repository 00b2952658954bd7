package integration_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/internal/tcptest"
)

// startEmbeddedCluster opens one node per name, each embedding a member of one
// etcd cluster (--initial-cluster) on loopback, with the cluster secret
// testSecret. Node i's member serves clients on addrs[2*i] and peers on
// addrs[2*i+1]. The nodes open together, since each member waits for a
// quorum; at the end of the test they close together, and the members' raft
// connections are waited out, so that goleak in TestMain does not fail when
// the test runs last or alone.
//
// No FastCatalog: its election timeout (100 ms) passes by itself between
// three members on a loaded machine, and the leader changes under the
// catalog's first writes. etcd's own timing (1 s) costs a second at start.
func startEmbeddedCluster(t *testing.T, names ...string) (nodes []*switchyard.Node, addrs []string) {
	t.Helper()
	before := goleak.IgnoreCurrent()
	addrs = tcptest.FreeAddrs(t, 2*len(names))
	var members []string
	for i, name := range names {
		members = append(members, fmt.Sprintf("%s=https://%s", name, addrs[2*i+1]))
	}
	ic := strings.Join(members, ",")
	nodes = make([]*switchyard.Node, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() {
			cfg := switchyard.DefaultConfig()
			cfg.Name, cfg.ClusterSecret = name, testSecret
			cfg.HTTPAddr, cfg.GRPCAddr, cfg.PeerAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
			cfg.DataDir, cfg.DrainTimeout, cfg.Logger = t.TempDir(), 2*time.Second, testLogger()
			cfg.EtcdClientAddr, cfg.EtcdPeerAddr, cfg.EtcdInitialCluster = addrs[2*i], addrs[2*i+1], ic
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			nodes[i], errs[i] = switchyard.Open(ctx, cfg)
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		var cw sync.WaitGroup
		for _, n := range nodes {
			if n != nil {
				cw.Go(func() {
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					defer cancel()
					_ = n.Close(ctx)
				})
			}
		}
		cw.Wait()
		// The members' raft HTTP connections outlive Close by up to etcd's
		// peer read timeout (5s: its conn renews the read deadline net/http
		// sets to abort them).
		waitGoroutinesGone(t, before)
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("open node %s: %v", names[i], err)
		}
	}
	return nodes, addrs
}
