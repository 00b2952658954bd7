package catalog_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/switchyard/switchyard/catalog"
	"github.com/switchyard/switchyard/internal/tcptest"
)

// TestExternalEndpointBlackholed: a node using three etcd members as an
// external cluster (Endpoints) whose connection to one of them goes
// silent — packets dropped, no FIN, no RST, as behind a blackhole route
// or a paused host — stops sending calls there once a keepalive ping goes
// unanswered, and every call succeeds through the other two. Without the
// client's keepalive the dead connection stays "ready" until TCP gives up
// (minutes), and a share of the calls keeps timing out on it. The test
// prints the failover time docs/cluster.md quotes.
func TestExternalEndpointBlackholed(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out a keepalive (about 15s)")
	}
	ms := startCluster(t, nil, "m1", "m2", "m3")
	var holes []*tcptest.Relay
	var endpoints []string
	for _, m := range ms {
		h := tcptest.NewRelay(t, m.cat.ClientAddr())
		holes = append(holes, h)
		endpoints = append(endpoints, "https://"+h.Addr)
	}
	ext := open(t, catalog.Config{Name: "ext", Endpoints: endpoints, LeaseTTL: 10 * time.Second})
	get := func(timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		_, err := ext.Client().Get(ctx, "/probe")
		return err
	}
	// The balancer connects to every endpoint; calls go round robin.
	eventually(t, 10*time.Second, "a connection through every endpoint", func() bool {
		_ = get(time.Second)
		for _, h := range holes {
			if h.Conns() == 0 {
				return false
			}
		}
		return true
	})
	for range 6 {
		if err := get(time.Second); err != nil {
			t.Fatalf("before the blackhole: %v", err)
		}
	}

	const callTimeout, streak, limit = time.Second, 5 * time.Second, 40 * time.Second
	holes[0].Blackhole()
	cut := time.Now()
	var failed int
	var lastFailure time.Duration // end of the last failed call, from the cut
	for {
		start := time.Now()
		err := get(callTimeout)
		if errors.Is(err, rpctypes.ErrLeaderChanged) {
			// A member answered: the call did not hang on the blackholed
			// endpoint. The members' election (spurious on a loaded
			// machine; their peer traffic is not cut) is not the
			// failover under test, so the call is made again.
			t.Logf("call at +%v: %v (not counted)", start.Sub(cut).Round(time.Millisecond), err)
			continue
		}
		if err != nil {
			failed++
			lastFailure = time.Since(cut)
			if !strings.Contains(err.Error(), "deadline") && !strings.Contains(err.Error(), "Unavailable") {
				t.Logf("call at +%v: %v", start.Sub(cut).Round(time.Millisecond), err)
			}
		}
		if time.Since(cut)-lastFailure >= streak {
			break
		}
		if time.Since(cut) > limit {
			t.Fatalf("calls still fail %v after one endpoint of three went silent (%d failed, the last at +%v): no failover to the other endpoints",
				limit, failed, lastFailure.Round(time.Millisecond))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("one endpoint of three blackholed: %d calls of %v failed, the last ending %v after the cut; every call since succeeded (%v of them); keepalive %v + timeout %v",
		failed, callTimeout, lastFailure.Round(time.Millisecond), streak, catalog.ExternalKeepAliveTime, catalog.ExternalKeepAliveTimeout)
	if bound := catalog.ExternalKeepAliveTime + catalog.ExternalKeepAliveTimeout + 2*callTimeout + 3*time.Second; lastFailure > bound {
		t.Errorf("failover took %v, above keepalive + its timeout + slack (%v)", lastFailure.Round(time.Millisecond), bound)
	}
}
