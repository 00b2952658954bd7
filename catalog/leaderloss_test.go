package catalog_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard/switchyard/catalog"
	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/internal/ticktest"
)

// cpuLoad keeps every core busy (two spinning goroutines per GOMAXPROCS)
// until the test ends, so that the members' raft ticks, heartbeats and the
// lease renewals all run late, as on a loaded two-core machine. Only with
// SWITCHYARD_CPU_LOAD set (make test-election runs these tests alone with
// it): under go test ./..., the spinners would starve the timing tests of
// the packages tested beside this one.
func cpuLoad(t *testing.T) {
	if os.Getenv("SWITCHYARD_CPU_LOAD") == "" {
		t.Log("no CPU load: set SWITCHYARD_CPU_LOAD=1 (make test-election) to run this under load on every core")
		return
	}
	t.Logf("CPU load: %d spinning goroutines on GOMAXPROCS=%d", 2*runtime.GOMAXPROCS(0), runtime.GOMAXPROCS(0))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var sink atomic.Uint64
	for range 2 * runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			buf := make([]byte, 4096)
			for ctx.Err() == nil {
				sum := sha256.Sum256(buf)
				buf[0] = sum[0]
				sink.Add(uint64(sum[1]))
			}
		})
	}
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
}

// headroom samples how close each catalog's lease comes to its fence
// deadline, and whether it fences, until stop is called.
type headroom struct {
	mu     sync.Mutex
	least  map[string]time.Duration
	fenced map[string]time.Duration
	stop   func()
}

func watchHeadroom(cs []*catalog.Catalog, since time.Time) *headroom {
	h := &headroom{least: map[string]time.Duration{}, fenced: map[string]time.Duration{}}
	for _, c := range cs {
		h.least[c.Name()] = catalog.FenceIn(c)
	}
	var stops []func()
	for _, c := range cs {
		lost := c.LeaseLost()
		stops = append(stops, ticktest.Every(5*time.Millisecond, func() bool {
			select {
			case <-lost:
				h.mu.Lock()
				h.fenced[c.Name()] = time.Since(since)
				h.mu.Unlock()
				return false
			default:
			}
			left := catalog.FenceIn(c)
			h.mu.Lock()
			h.least[c.Name()] = min(h.least[c.Name()], left)
			h.mu.Unlock()
			return true
		}))
	}
	h.stop = func() {
		for _, stop := range stops {
			stop()
		}
	}
	return h
}

// clusterTiming is etcd's default raft timing (heartbeat 100ms, election
// timeout 1s) with the lease the fault suite runs with: 6s, margin 2s, so a
// renewal every 1s and a fence 4s after the last one that went through.
func clusterTiming(c *catalog.Config) {
	c.FastElection = false
	c.LeaseTTL = 6 * time.Second
}

// TestEmbeddedClusterSurvivesLeaderLoss: the etcd leader's member stops,
// round after round, under CPU load on every core, while the others keep
// renewing their leases. Renewals sent during the election (forwarded to a
// leader that no longer answers, and hanging there) time out after their
// own short deadline and are sent again once the two survivors have elected
// a new leader: neither survivor fences, and both write again within the
// election's time. The stopped member then comes back, and the next round
// stops whichever member leads then.
func TestEmbeddedClusterSurvivesLeaderLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("elections with etcd's default timing take seconds")
	}
	cpuLoad(t)
	ms := startOnline(t, clusterTiming)
	const rounds = 3
	for round := 1; round <= rounds; round++ {
		leader, survivors := leaderOf(t, ms)
		gone := leader.cat.Name()
		start := time.Now()
		h := watchHeadroom(catalogs(survivors), start)
		catalog.CrashMember(leader.cat)

		// Losing one member of three keeps the catalog working: each
		// survivor writes again once the two have a leader.
		wrote := make([]time.Duration, len(survivors))
		var wg sync.WaitGroup
		for i, s := range survivors {
			wg.Go(func() {
				for time.Since(start) < 8*time.Second {
					// Generous: under this load a write through raft
					// can take a few hundred milliseconds.
					ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
					err := s.cat.PublishConsumer(ctx, core.ConsumerInfo{Queue: "jobs", ID: fmt.Sprintf("r%d-%s", round, s.cat.Name())})
					cancel()
					if err == nil {
						wrote[i] = time.Since(start)
						return
					}
				}
			})
		}
		wg.Wait()
		// Watch a whole lease past the crash: any renewal that the
		// election kept from going through has fenced by then.
		time.Sleep(time.Until(start.Add(survivors[0].cfg.LeaseTTL)))
		h.stop()
		for i, s := range survivors {
			name := s.cat.Name()
			if d, ok := h.fenced[name]; ok {
				t.Fatalf("round %d: %s fenced %v after %s, the etcd leader, stopped", round, name, d.Round(time.Millisecond), gone)
			}
			if wrote[i] == 0 {
				t.Fatalf("round %d: %s wrote nothing within 8s of losing the leader %s", round, name, gone)
			}
			t.Logf("round %d: leader %s stopped; %s: first write after %v, least time left before its fence deadline %v (of %v)",
				round, gone, name, wrote[i].Round(time.Millisecond), h.least[name].Round(time.Millisecond),
				s.cfg.LeaseTTL-s.cfg.LeaseTTL/3)
		}
		// The stopped member comes back from its data directory.
		if err := leader.cat.Close(context.Background()); err != nil {
			t.Logf("close the stopped %s: %v", gone, err)
		}
		leader.cat = openPlain(t, leader.cfg)
		setState(t, leader.cat, core.StateOnline)
		for _, s := range survivors {
			waitNodeState(t, s.cat, gone, core.StateOnline)
		}
	}
}

// TestEmbeddedClusterQuorumLossFencesAndRecovers: two of three members
// stop, under CPU load. The node left with a member that has no quorum
// cannot renew its lease and fences, before the lease could expire. When
// the two members come back, it recovers: Recover revokes the lost lease,
// takes a new one and a new incarnation, and its writes go through again;
// the others see its record under the new incarnation.
func TestEmbeddedClusterQuorumLossFencesAndRecovers(t *testing.T) {
	if testing.Short() {
		t.Skip("elections with etcd's default timing take seconds")
	}
	cpuLoad(t)
	ms := startOnline(t, clusterTiming)
	left, stopped := ms[0], ms[1:]
	addConsumer(t, left.cat, "jobs", "before", catalogs(ms)...)
	before := left.cat.Incarnation()

	start := time.Now()
	for _, m := range stopped {
		catalog.CrashMember(m.cat)
	}
	// A member that led keeps renewing locally until it notices, one
	// election timeout on, that it lost its quorum (etcd still counts
	// those renewals when a new leader takes over), so the fence comes up
	// to LeaseTTL-FenceMargin after that; TestFenceBeforeExpiry holds the
	// fence to the lease's expiry.
	select {
	case <-left.cat.LeaseLost():
	case <-time.After(2 * left.cfg.LeaseTTL):
		t.Fatalf("%s, whose member lost its quorum, did not fence within 2 lease TTLs", left.cat.Name())
	}
	fenced := time.Since(start)
	t.Logf("%s fenced %v after losing its quorum (fence deadline %v after the last renewal that went through)",
		left.cat.Name(), fenced.Round(time.Millisecond), left.cfg.LeaseTTL-left.cfg.LeaseTTL/3)
	// Without a quorum there is nothing to recover to.
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	if err := left.cat.Recover(ctx); err == nil {
		t.Fatal("Recover without a quorum = nil")
	}
	cancel()
	if left.cat.LeaseValid() {
		t.Fatal("LeaseValid after a failed Recover")
	}

	// The two members come back.
	var wg sync.WaitGroup
	for _, m := range stopped {
		if err := m.cat.Close(context.Background()); err != nil {
			t.Logf("close the stopped %s: %v", m.cat.Name(), err)
		}
		wg.Go(func() { m.cat = openPlain(t, m.cfg) })
	}
	wg.Wait()
	back := time.Now()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := left.cat.Recover(ctx)
		cancel()
		if err == nil {
			break
		}
		if time.Since(back) > 10*time.Second {
			t.Fatalf("Recover still failing 10s after the quorum came back: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("%s recovered %v after the members were back: incarnation %s → %s", left.cat.Name(), time.Since(back).Round(time.Millisecond), before, left.cat.Incarnation())
	if left.cat.Incarnation() == before {
		t.Fatal("the recovered node kept its incarnation")
	}
	if !left.cat.LeaseValid() {
		t.Fatal("LeaseValid false after Recover")
	}
	select {
	case <-left.cat.LeaseLost():
		t.Fatal("LeaseLost closed after Recover")
	default:
	}
	// The lost lease's records went with it.
	if ok, _ := getLinearizable(t, ms[1].cat, catalog.ConsumerKey("jobs", "before")); ok {
		t.Fatal("a consumer record of the lost lease survived the recovery")
	}
	setState(t, left.cat, core.StateOnline)
	addConsumer(t, left.cat, "jobs", "after", catalogs(ms)...)
	for _, m := range stopped {
		eventually(t, 2*time.Second, m.cat.Name()+" sees the new incarnation", func() bool {
			n, ok := m.cat.Node(left.cat.Name())
			return ok && n.State == core.StateOnline && n.Incarnation == left.cat.Incarnation()
		})
	}
	// The recovered lease is renewed: it outlives a whole TTL.
	time.Sleep(left.cfg.LeaseTTL)
	if !left.cat.LeaseValid() {
		t.Fatal("the recovered lease was not renewed")
	}
}
