package integration_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sse "github.com/tmaxmax/go-sse"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/internal/syncbuf"
	"github.com/switchyard/switchyard/internal/tcptest"
	"github.com/switchyard/switchyard/worker"
)

// The zombie test: a consumer host that can no longer renew its catalog lease
// (cut off from etcd while its process, its peer port and its worker keep
// running) must fence itself, cancelling its worker's job, before any other
// node can see its lease expire and hand the job to another worker.
//
// Per seeded run: node A embeds etcd; node B reaches it only through a TCP
// proxy the test can cut, and has a 2s lease (fence margin TTL/3, so B fences
// 1.33s after its last renewal was sent and the lease expires in etcd no
// earlier than 2s after it). Worker W1 on B takes a job posted to A and runs
// silently until its context is cancelled. W2 connects to A. The proxy is
// cut at a seeded point of B's renewal cycle. The order that must hold:
//
//	B fences (W1's ctx cancelled, W1 returns) < A sees B's records gone
//	  < the job, which produced no output, is re-dispatched and W2 starts
//
// margin = W2 start − W1 cancel must be positive in every run, and W1's
// handler must have returned before W2 starts: zero double executions. The
// requester must see output from W2's generation only, ending in done. By
// the arithmetic the margin is about FenceMargin (667ms) plus etcd's expiry
// sweep and the re-dispatch; it is printed per run and as min/median/max.
//
// The table's columns, as offsets from the cut: phase (the cut's position
// after B's last renewal, implied by the fence time: TTL − margin − fence),
// B fence, W1 cancelled, A sees B's node record gone, W2 starts, the margin,
// and renewal→gone (phase + gone: when A saw the lease end, counted from the
// implied last renewal; the catalog promises ≥ TTL). New connections after
// the cut are refused (odd seeds) or blackholed (even seeds).
// SWITCHYARD_ZOMBIE_RUNS sets the number of runs (default 10).
func TestZombieHostFencesBeforeRedispatch(t *testing.T) {
	runs := 10
	if s := os.Getenv("SWITCHYARD_ZOMBIE_RUNS"); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n > 0 {
			runs = n
		}
	}
	// Runs last: a zombie's worker session may still be withdrawing its
	// consumer record after the zombie's Close returned (see zombieRun).
	t.Cleanup(func() { awaitNoGoroutine(t, "core.(*Worker).Detach(", 15*time.Second) })
	a := MustStartNode(t, func(c *switchyard.Config) {
		c.Name, c.ClusterSecret = "za", testSecret
		c.PeerHeartbeatInterval, c.PeerFailureThreshold = 100*time.Millisecond, 5
	})
	var results []zombieResult
	for seed := 1; seed <= runs; seed++ {
		var r zombieResult
		ok := t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { r = zombieRun(t, a, uint64(seed)) })
		if !ok {
			// A run that failed leaves state behind (its zombie may still
			// be running a job): the later runs would tell nothing more.
			break
		}
		results = append(results, r)
	}
	if len(results) == 0 {
		return
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%7.0fms", float64(d)/float64(time.Millisecond)) }
	t.Logf("zombie runs (lease TTL %v, fence margin %v; times from the cut, per run):", zombieTTL, zombieTTL/3)
	t.Logf("  %-4s %-9s %-9s %-9s %-9s %-9s %-9s %-9s %s", "seed", "new-conn", "phase", "B fence", "W1 cncl", "A: B gone", "W2 start", "margin", "renewal→gone")
	var margins []time.Duration
	for _, r := range results {
		margins = append(margins, r.margin)
		t.Logf("  %-4d %-9s %s %s %s %s %s %s %s", r.seed, r.mode, ms(r.phase), ms(r.fence), ms(r.w1Cancel), ms(r.gone), ms(r.w2Start), ms(r.margin), ms(r.phase+r.gone))
	}
	slices.Sort(margins)
	t.Logf("margin W2 start − W1 cancel over %d runs: min %v  median %v  max %v",
		len(margins), margins[0].Round(time.Millisecond), margins[len(margins)/2].Round(time.Millisecond), margins[len(margins)-1].Round(time.Millisecond))
}

// zombieTTL is B's lease TTL: the smallest a node accepts.
const zombieTTL = 2 * time.Second

type zombieResult struct {
	seed uint64
	mode string
	// Offsets from the cut. phase is the cut's position after B's last
	// renewal as implied by the fence time (fence − (TTL − margin)).
	phase, fence, w1Cancel, gone, w2Start time.Duration
	margin                                time.Duration
}

// zombieRun is one seeded run against node a; see the test's comment.
func zombieRun(t *testing.T, a *switchyard.Node, seed uint64) zombieResult {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	blackhole := seed%2 == 0
	res := zombieResult{seed: seed, mode: "refused"}
	if blackhole {
		res.mode = "blackhole"
	}
	name, queue := fmt.Sprintf("zb%d", seed), fmt.Sprintf("zq%d", seed)

	proxy := tcptest.NewRelay(t, a.Catalog().ClientAddr())
	logs := &syncbuf.Buffer{}
	b := startZombieNode(t, name, proxy.Addr, logs)

	waitFor(t, 10*time.Second, name+" online in A's view and A in "+name+"'s", func() bool {
		nb, ok1 := a.Catalog().Node(name)
		na, ok2 := b.Catalog().Node("za")
		return ok1 && ok2 && nb.State == "online" && na.State == "online"
	})

	// Record when B fences and when A sees B's node record go.
	var fencedAt, goneAt atomic.Pointer[time.Time]
	stopWatch := make(chan struct{})
	var watchers sync.WaitGroup
	watchers.Go(func() {
		select {
		case <-b.Catalog().LeaseLost():
			now := time.Now()
			fencedAt.Store(&now)
		case <-stopWatch:
		}
	})
	changed, unsubscribe := a.Catalog().Watch()
	watchers.Go(func() {
		defer unsubscribe()
		for {
			if _, ok := a.Catalog().Node(name); !ok {
				now := time.Now()
				goneAt.Store(&now)
				return
			}
			select {
			case <-changed:
			case <-stopWatch:
				return
			}
		}
	})
	t.Cleanup(func() { close(stopWatch); watchers.Wait() })

	// W1 on B: silent until its context ends.
	var (
		mu                         sync.Mutex
		w1Gen, w2Gen               uint64
		w1Starts, w2Starts         int
		w1Start, w1Cancel, w1End   time.Time
		w2Start                    time.Time
		w2SawW1Running             bool
		w1Running                  atomic.Bool
		w1Started                  = make(chan struct{})
		w2Started                  = make(chan struct{})
		w1Cancelled                = make(chan struct{})
		w1StartOnce, w2StartOnce   sync.Once
		w1CancelOnce               sync.Once
		w1StartedAfterW2, w2Extras bool
	)
	stopW1 := MustStartWorker(t, b, worker.Config{Name: "w1", Queue: queue}, func(ctx context.Context, job *worker.Job, _ *worker.Output) (any, error) {
		w1Running.Store(true)
		mu.Lock()
		w1Starts++
		w1Gen, w1Start = job.Generation, time.Now()
		if !w2Start.IsZero() {
			w1StartedAfterW2 = true
		}
		mu.Unlock()
		w1StartOnce.Do(func() { close(w1Started) })
		<-ctx.Done()
		mu.Lock()
		w1Cancel = time.Now()
		mu.Unlock()
		w1CancelOnce.Do(func() { close(w1Cancelled) })
		mu.Lock()
		w1End = time.Now()
		mu.Unlock()
		w1Running.Store(false)
		return nil, ctx.Err()
	})
	waitFor(t, 10*time.Second, name+" dispatches "+queue+" in A's view", func() bool {
		d, ok := a.Catalog().Dispatch(queue)
		return ok && d.Dispatcher == name
	})

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res1 := post(ctx, t, a, queue, `{"ttl_ms":60000,"input":"zombie"}`, true)
	defer res1.Body.Close()
	if res1.StatusCode != 200 {
		t.Fatalf("POST: %d", res1.StatusCode)
	}
	stream := readStream(res1.Body)
	select {
	case <-w1Started:
	case <-time.After(10 * time.Second):
		t.Fatal("W1 never started the job")
	}

	// W2 on A: streams three outputs and completes.
	MustStartWorker(t, a, worker.Config{Name: "w2", Queue: queue}, func(ctx context.Context, job *worker.Job, out *worker.Output) (any, error) {
		running := w1Running.Load()
		mu.Lock()
		w2Starts++
		if w2Starts > 1 {
			w2Extras = true
		}
		w2Gen, w2Start, w2SawW1Running = job.Generation, time.Now(), running
		mu.Unlock()
		w2StartOnce.Do(func() { close(w2Started) })
		for i := range 3 {
			if err := out.Send(ctx, fmt.Sprintf("w2-%d", i)); err != nil {
				return nil, err
			}
		}
		return map[string]any{"by": "w2"}, nil
	})
	waitFor(t, 10*time.Second, "W2's consumer in A's view", func() bool {
		return len(a.Catalog().Consumers(queue)) == 2
	})

	// Cut at a seeded point of B's renewal cycle ((TTL − margin)/4 long).
	renew := (zombieTTL - zombieTTL/3) / 4
	time.Sleep(time.Duration(rng.Int64N(int64(renew))))
	cutAt := time.Now()
	if blackhole {
		proxy.Cut()
	} else {
		proxy.Refuse()
	}
	// Once the run is decided the partition heals and W1 leaves while B is
	// still open. (Its session's Detach withdraws W1's consumer record in
	// etcd, for up to the catalog's RequestTimeout while B's etcd client is
	// still backing off, and B's Close does not wait for it: the test waits
	// for it at the end.)
	defer func() {
		proxy.Heal()
		stopW1()
	}()

	// Bound: B fences within TTL − margin of the cut; the lease expires in
	// etcd within TTL (plus etcd's expiry sweep); the job is re-dispatched at
	// once. 20s is generous on a loaded 2-core machine.
	select {
	case <-w2Started:
	case <-time.After(20 * time.Second):
		t.Fatalf("the job was not re-dispatched to W2 within 20s of the cut (W1 cancelled: %v)\n%s", isClosed(w1Cancelled), logs.String())
	}
	select {
	case <-w1Cancelled:
	case <-time.After(5 * time.Second):
		t.Errorf("W1's job was never cancelled although its node's lease was lost and W2 runs the job: double execution")
	}
	evs, err := stream.wait(30 * time.Second)
	if err != nil {
		t.Errorf("requester stream: %v", err)
	}

	mu.Lock()
	defer mu.Unlock()
	f, g := fencedAt.Load(), goneAt.Load()
	if f == nil {
		t.Fatalf("B never fenced\n%s", logs.String())
	}
	if g == nil {
		t.Fatalf("A never saw B's node record go\n%s", logs.String())
	}
	since := func(x time.Time) time.Duration {
		if x.IsZero() {
			return -1
		}
		return x.Sub(cutAt)
	}
	res.fence, res.gone, res.w1Cancel, res.w2Start = since(*f), since(*g), since(w1Cancel), since(w2Start)
	res.phase = (zombieTTL - zombieTTL/3) - res.fence
	res.margin = w2Start.Sub(w1Cancel)
	if w1Cancel.IsZero() {
		res.margin = -1
	}
	at := func(x time.Time) string {
		if x.IsZero() {
			return "never"
		}
		return "+" + x.Sub(cutAt).Round(time.Millisecond).String()
	}
	margin := "none"
	if !w1Cancel.IsZero() {
		margin = res.margin.Round(time.Millisecond).String()
	}
	t.Logf("seed %d (%s): W1 started gen %d %v before the cut, which came %v after the implied last renewal; B fenced %s, W1 cancelled %s (returned %s), A saw B gone %s, W2 started gen %d %s: margin %s",
		seed, res.mode, w1Gen, cutAt.Sub(w1Start).Round(time.Millisecond), res.phase.Round(time.Millisecond), at(*f), at(w1Cancel),
		at(w1End), at(*g), w2Gen, at(w2Start), margin)

	// Safety, in order.
	if w1Cancel.IsZero() || !w1Cancel.Before(w2Start) {
		t.Errorf("W2 started at %s, before W1 was cancelled (%s): margin %s, not > 0", at(w2Start), at(w1Cancel), margin)
	}
	if w2SawW1Running || w1End.IsZero() || !w1End.Before(w2Start) {
		t.Errorf("W2 started (%s) while W1's handler was still running (W1 returned: %s): double execution", at(w2Start), at(w1End))
	}
	if !f.Before(*g) {
		t.Errorf("A saw B's records go (%s) before B fenced (%s)", at(*g), at(*f))
	}
	if w1Starts != 1 || w2Starts != 1 || w1StartedAfterW2 || w2Extras {
		t.Errorf("starts: W1 %d, W2 %d (W1 restarted after W2: %v); want one each", w1Starts, w2Starts, w1StartedAfterW2)
	}
	if w2Gen <= w1Gen {
		t.Errorf("W2 ran generation %d, not after W1's %d", w2Gen, w1Gen)
	}

	// The requester: accepted, W2's three outputs (its generation only),
	// done.
	var kinds []string
	for _, ev := range evs {
		kinds = append(kinds, ev.Type)
		if ev.Type == "output" {
			if att := field[uint64](t, ev, "attempt"); att != w2Gen {
				t.Errorf("output from attempt %d, want W2's %d only: %s", att, w2Gen, ev.Data)
			}
		}
	}
	if got := strings.Join(kinds, ","); got != "accepted,output,output,output,done" {
		t.Errorf("requester events %s, want accepted,output×3,done", got)
	}
	if t.Failed() {
		t.Logf("B's log:\n%s", logs.String())
	}
	return res
}

// startZombieNode starts an in-process node whose catalog is reached through
// etcdAddr and whose lease is zombieTTL. Its Close may report the catalog it
// lost, so a close error is logged rather than failed on.
func startZombieNode(t *testing.T, name, etcdAddr string, logs io.Writer) *switchyard.Node {
	t.Helper()
	cfg := switchyard.DefaultConfig()
	cfg.Name, cfg.ClusterSecret = name, testSecret
	cfg.HTTPAddr, cfg.GRPCAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.DataDir = t.TempDir()
	cfg.EtcdEndpoints = []string{"https://" + etcdAddr}
	cfg.LeaseTTL = zombieTTL
	cfg.PeerHeartbeatInterval, cfg.PeerFailureThreshold = 100*time.Millisecond, 5
	cfg.DrainTimeout = 2 * time.Second
	cfg.Workers.HeartbeatInterval = 200 * time.Millisecond
	cfg.Workers.IdleTimeout = time.Second
	var w io.Writer = logs
	if os.Getenv("SWITCHYARD_TEST_LOG") != "" {
		w = io.MultiWriter(logs, os.Stderr)
	}
	cfg.Logger = slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := switchyard.Open(ctx, cfg)
	if err != nil {
		t.Fatalf("open node %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := n.Close(ctx); err != nil {
			t.Logf("close zombie node %s: %v", name, err)
		}
	})
	return n
}

// sseStream reads a job's SSE stream in the background, stamping each event
// with the time it arrived.
type sseStream struct {
	done chan struct{}

	mu  sync.Mutex
	evs []sse.Event
	at  []time.Time
	err error
}

func readStream(r io.Reader) *sseStream {
	s := &sseStream{done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for ev, err := range sse.Read(r, nil) {
			now := time.Now()
			s.mu.Lock()
			if err != nil {
				s.err = err
				s.mu.Unlock()
				return
			}
			s.evs, s.at = append(s.evs, ev), append(s.at, now)
			s.mu.Unlock()
		}
	}()
	return s
}

// snapshot returns the events received so far and their arrival times.
func (s *sseStream) snapshot() ([]sse.Event, []time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.evs), slices.Clone(s.at)
}

// count returns how many events of type kind arrived so far.
func (s *sseStream) count(kind string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, ev := range s.evs {
		if ev.Type == kind {
			n++
		}
	}
	return n
}

// wait returns the stream's events once it ended, or an error after timeout.
func (s *sseStream) wait(timeout time.Duration) ([]sse.Event, error) {
	select {
	case <-s.done:
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.evs, s.err
	case <-time.After(timeout):
		return nil, fmt.Errorf("stream did not end within %v", timeout)
	}
}

// mustEnd waits up to timeout for the stream to end and returns its events
// and their arrival times; a stream that does not end in time, or ends in a
// transport error, fails the test (what names the stream) with the events
// so far.
func (s *sseStream) mustEnd(t *testing.T, what string, timeout time.Duration) ([]sse.Event, []time.Time) {
	t.Helper()
	evs, err := s.wait(timeout)
	if err != nil {
		got, _ := s.snapshot()
		t.Fatalf("%s: %v; events so far: %s", what, err, strings.Join(types(got), ","))
	}
	_, at := s.snapshot()
	return evs, at
}

// awaitNoGoroutine waits until no goroutine's stack mentions fn.
func awaitNoGoroutine(t *testing.T, fn string, timeout time.Duration) {
	t.Helper()
	start := time.Now()
	buf := make([]byte, 1<<22)
	for {
		n := runtime.Stack(buf, true)
		if !bytes.Contains(buf[:n], []byte(fn)) {
			if d := time.Since(start); d > 100*time.Millisecond {
				t.Logf("waited %v for %s to return", d.Round(time.Millisecond), fn)
			}
			return
		}
		if time.Since(start) > timeout {
			t.Errorf("%s still running after %v", fn, timeout)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
