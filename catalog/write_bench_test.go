package catalog_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard/switchyard/catalog"
	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/internal/tcptest"
)

// BenchmarkCatalogWrite is the cost of a catalog write (a node record put
// under the node's lease, through raft) on a 3-member embedded cluster,
// from a member's in-process client and from a node that uses the members
// as a client (Endpoints), with p50/p99.
func BenchmarkCatalogWrite(b *testing.B) {
	addrs := tcptest.FreeAddrs(b, 6)
	names := []string{"m1", "m2", "m3"}
	var ic []string
	for i, n := range names {
		ic = append(ic, n+"=https://"+addrs[2*i+1])
	}
	cats := make([]*catalog.Catalog, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, n := range names {
		wg.Go(func() {
			cats[i], errs[i] = catalog.Open(ctx, catalog.Config{Name: n, Dir: b.TempDir(), ClientAddr: addrs[2*i], PeerAddr: addrs[2*i+1],
				InitialCluster: strings.Join(ic, ","), LeaseTTL: 10 * time.Second, Secret: testSecret})
		})
	}
	wg.Wait()
	defer func() {
		var cw sync.WaitGroup
		for _, c := range cats {
			if c != nil {
				cw.Go(func() { _ = c.Close(context.Background()) })
			}
		}
		cw.Wait()
	}()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	client, err := catalog.Open(ctx, catalog.Config{Name: "cl", Endpoints: []string{"https://" + cats[0].ClientAddr()}, LeaseTTL: 10 * time.Second, Secret: testSecret})
	if err != nil {
		b.Fatal(err)
	}
	defer client.Close(context.Background())
	for _, tc := range []struct {
		name string
		c    *catalog.Catalog
	}{{"member", cats[1]}, {"client", client}} {
		b.Run(tc.name, func(b *testing.B) {
			var lat []time.Duration
			i := 0
			for b.Loop() {
				start := time.Now()
				if err := tc.c.PublishNode(context.Background(), core.NodeInfo{State: core.StateOnline, PeerAddr: fmt.Sprintf("127.0.0.1:%d", 1000+i%1000)}); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
				i++
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
}
