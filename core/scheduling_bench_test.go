package core_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/internal/promtest"
)

// The scheduling benchmarks: one engine (the dispatcher's own code, its
// real clock and timers) and simulated workers that accept every offer at
// once and end it after the job's duration. They print the tables
// (docs/scheduling.md has a run): BenchmarkAffinity the hit ratio, the
// keys moved when a worker leaves and the balance; BenchmarkFairShare two
// subjects posting 10:1 into a saturated queue, and a high-priority job
// under a low-priority backlog. Figures, never a pass or fail on a time.

var (
	benchJobMean = flag.Duration("sched.job", 10*time.Millisecond, "BenchmarkAffinity and BenchmarkFairShare: a job's mean duration (uniform from half to 1.5 times)")
	benchJobs    = flag.Int("sched.jobs", 5000, "BenchmarkAffinity: jobs in each phase")
)

const (
	benchWorkers = 8
	benchSlots   = 4
	benchKeys    = 1000
)

// simWorker is a worker that runs every job it is offered for a duration.
// Its methods run under the engine's lock: they only arm timers.
type simWorker struct {
	w   *core.Worker
	idx int
	b   *bench
}

func (s *simWorker) SendOffer(o core.Offer) error {
	p := s.b.offered(s.idx, o, time.Now())
	d := s.b.duration()
	w := s.w
	time.AfterFunc(0, func() { w.Accept(o.JobID, o.Gen) })
	time.AfterFunc(d, func() {
		s.b.ended(s.idx, p, d)
		w.End(o.JobID, o.Gen, "", "", nil)
	})
	return nil
}
func (s *simWorker) SendCancel(string, uint64, core.Code) error         { return nil }
func (s *simWorker) SendCredit(string, uint64, core.OutputCredit) error { return nil }
func (s *simWorker) Close(error)                                        {}

// placement is what the benchmark saw of one job.
type placement struct {
	name, subject, key string
	submitted, bound   time.Time
	ended              time.Time
	worker             int
}

// bench is one engine with its simulated workers and what they saw.
type bench struct {
	tb      testing.TB
	e       *core.Engine
	reg     *prometheus.Registry
	workers []*simWorker
	mean    time.Duration

	mu     sync.Mutex
	rng    *rand.Rand
	jobs   map[string]*placement
	byName map[string]*placement
	busy   []time.Duration
	done   chan struct{}
	want   int
	count  int
}

func newBench(tb testing.TB, sched core.SchedulingConfig) *bench {
	reg := prometheus.NewRegistry()
	cfg := testConfig(reg)
	cfg.Scheduling = sched
	cfg.Limits.MaxQueueDepth = 100_000
	cfg.Limits.MaxQueueBytes = 1 << 30
	e, err := core.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	b := &bench{
		tb: tb, e: e, reg: reg, mean: *benchJobMean, rng: rand.New(rand.NewPCG(1, 2)),
		jobs: map[string]*placement{}, byName: map[string]*placement{}, busy: make([]time.Duration, benchWorkers),
	}
	for i := range benchWorkers {
		s := &simWorker{idx: i, b: b}
		w, err := e.AttachWorker(context.Background(), core.WorkerSpec{Queue: "q", Name: fmt.Sprintf("w%d", i), Concurrency: benchSlots}, s)
		if err != nil {
			tb.Fatal(err)
		}
		s.w = w
		b.workers = append(b.workers, s)
	}
	return b
}

func (b *bench) close() { b.e.Close() }

func (b *bench) duration() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return time.Duration(float64(b.mean) * (0.5 + b.rng.Float64()))
}

// offered records a job's binding: its input is its name.
func (b *bench) offered(worker int, o core.Offer, now time.Time) *placement {
	var name string
	_ = json.Unmarshal(o.Input, &name)
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.byName[name]
	if p != nil {
		p.bound, p.worker = now, worker
	}
	return p
}

func (b *bench) ended(worker int, p *placement, d time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if p == nil || b.byName[p.name] != p {
		return // a job of an earlier run
	}
	b.busy[worker] += d
	p.ended = time.Now()
	b.count++
	if b.count == b.want && b.done != nil {
		close(b.done)
	}
}

// expect arms the wait for n more ends.
func (b *bench) expect(n int) <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.done, b.want, b.count = make(chan struct{}), n, 0
	return b.done
}

// submit posts a job as owner; subject is what the figures group it by
// (the owner, but for the benchmark's first-come-first-served baseline).
func (b *bench) submit(name, subject, owner string, weight, priority int, key string) {
	in, _ := json.Marshal(name)
	e := &core.Envelope{Version: 1, TTL: 5 * time.Minute, Input: in, Priority: priority, AffinityKey: key}
	p := &placement{name: name, subject: subject, key: key, worker: -1, submitted: time.Now()}
	// Registered before Submit: the offer can come within it.
	b.mu.Lock()
	b.byName[name] = p
	b.mu.Unlock()
	j, _, err := b.e.Submit(context.Background(), "q", e, core.SubmitOptions{Owner: owner, Share: core.Share{Weight: weight}})
	if err != nil {
		b.tb.Fatalf("Submit: %v", err)
	}
	b.mu.Lock()
	b.jobs[j.ID] = p
	b.mu.Unlock()
}

func (b *bench) wait(done <-chan struct{}) {
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		b.tb.Fatal("the jobs did not end")
	}
}

func (b *bench) affinityCounts() map[string]float64 {
	out := map[string]float64{}
	for _, s := range promtest.All(b.tb, b.reg, "switchyard_dispatch_affinity_total") {
		out[s.Labels["result"]] = s.Value
	}
	return out
}

// zipf draws key ranks 0..n-1 with probability ∝ 1/(rank+1)^s.
type zipf struct{ cdf []float64 }

func newZipf(n int, s float64) *zipf {
	z := &zipf{cdf: make([]float64, n)}
	sum := 0.0
	for i := range n {
		sum += 1 / math.Pow(float64(i+1), s)
		z.cdf[i] = sum
	}
	for i := range z.cdf {
		z.cdf[i] /= sum
	}
	return z
}

func (z *zipf) draw(r *rand.Rand) int {
	i, _ := slices.BinarySearch(z.cdf, r.Float64())
	return min(i, len(z.cdf)-1)
}

// affinityRun is one phase of BenchmarkAffinity's figures.
type affinityRun struct {
	counts  map[string]float64
	perKey  map[string]map[int]int // key → worker → jobs
	busy    []time.Duration
	waitP99 time.Duration
	// load is the workers' busy time over their slots' time, from the
	// first post to the last end: the load the posts achieved.
	load float64
}

// runAffinity posts jobs with Zipf-distributed keys as a Poisson stream at
// load × the workers' capacity, and waits for them to end.
func (b *bench) runAffinity(jobs int, load float64, z *zipf, seed uint64) affinityRun {
	r := rand.New(rand.NewPCG(seed, 7))
	before := b.affinityCounts()
	b.mu.Lock()
	b.jobs, b.byName = map[string]*placement{}, map[string]*placement{}
	b.busy = make([]time.Duration, benchWorkers)
	b.mu.Unlock()
	done := b.expect(jobs)
	slots := 0
	for _, s := range b.workers {
		if s.w != nil {
			slots += benchSlots
		}
	}
	rate := load * float64(slots) / b.mean.Seconds() // jobs a second
	start, at := time.Now(), 0.0
	for i := range jobs {
		at += r.ExpFloat64() / rate
		if d := time.Until(start.Add(time.Duration(at * float64(time.Second)))); d > 0 {
			time.Sleep(d)
		}
		b.submit(fmt.Sprintf("a%d", i), "", "", 1, 0, fmt.Sprintf("key-%d", z.draw(r)))
	}
	b.wait(done)
	after := b.affinityCounts()
	out := affinityRun{counts: map[string]float64{}, perKey: map[string]map[int]int{}}
	for k, v := range after {
		out.counts[k] = v - before[k]
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	var waits []time.Duration
	for _, p := range b.jobs {
		if out.perKey[p.key] == nil {
			out.perKey[p.key] = map[int]int{}
		}
		out.perKey[p.key][p.worker]++
		waits = append(waits, p.bound.Sub(p.submitted))
	}
	out.busy = slices.Clone(b.busy)
	out.waitP99 = percentile(waits, 99)
	var busy time.Duration
	for _, d := range b.busy {
		busy += d
	}
	out.load = float64(busy) / (float64(time.Since(start)) * float64(slots))
	return out
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(math.Ceil(p/100*float64(len(s))))-1)]
}

// modal is the worker that ran most of a key's jobs.
func modal(m map[int]int) int {
	best, n := -1, -1
	for w, c := range m {
		if c > n || c == n && w < best {
			best, n = w, c
		}
	}
	return best
}

// BenchmarkAffinity prints the affinity table: 8 workers × 4 slots, 1,000
// keys with Zipf popularity, jobs posted as a Poisson stream at a share of
// the workers' capacity; then one worker leaves and as many jobs again.
func BenchmarkAffinity(b *testing.B) {
	type row struct {
		zipf, load, factor float64
		wait               time.Duration
	}
	def := core.DefaultSchedulingConfig()
	rows := []row{
		{0.8, 0.5, def.AffinityLoadFactor, def.AffinityWait},
		{1.0, 0.5, def.AffinityLoadFactor, def.AffinityWait},
		{0.8, 0.8, def.AffinityLoadFactor, def.AffinityWait},
		{0.8, 0.5, def.AffinityLoadFactor, 0},
	}
	for range b.N {
		fmt.Printf("\naffinity: %d workers × %d slots, %d keys (Zipf), jobs of %v mean, %d jobs per phase; defaults: --affinity-load-factor %v, --affinity-wait %v\n",
			benchWorkers, benchSlots, benchKeys, *benchJobMean, *benchJobs, def.AffinityLoadFactor, def.AffinityWait)
		fmt.Printf("%-5s %-11s %-6s %-7s | %-8s %-22s %-8s %-9s | %-12s %-14s | %-8s %s\n",
			"zipf", "load (got)", "factor", "wait", "hit", "misses full/gone/none", "max/mean", "wait p99",
			"moved (ring)", "moved (jobs)", "hit 7w", "targets")
		for _, r := range rows {
			b.StopTimer()
			sched := def
			sched.AffinityLoadFactor, sched.AffinityWait = r.factor, r.wait
			bn := newBench(b, sched)
			z := newZipf(benchKeys, r.zipf)
			b.StartTimer()
			one := bn.runAffinity(*benchJobs, r.load, z, 1)
			// Worker 7 leaves; the same load on the seven left.
			gone := bn.workers[7]
			ids := map[string]int{}
			for _, s := range bn.workers {
				ids[s.w.ID] = benchSlots
			}
			before := map[string]string{}
			for k := range benchKeys {
				key := fmt.Sprintf("key-%d", k)
				before[key] = core.AffinityOrder(key, ids)[0]
			}
			delete(ids, gone.w.ID)
			gone.w.Detach(context.Background())
			gone.w = nil
			two := bn.runAffinity(*benchJobs, r.load, z, 2)
			bn.close()

			ringMoved := 0
			for key, first := range before {
				if core.AffinityOrder(key, ids)[0] != first {
					ringMoved++
				}
			}
			both, moved := 0, 0
			for key, m := range one.perKey {
				n2 := two.perKey[key]
				if sum(m) < 3 || sum(n2) < 3 {
					continue
				}
				both++
				if modal(m) != modal(n2) {
					moved++
				}
			}
			total := one.counts[core.AffinityHit] + one.counts[core.AffinityFull] + one.counts[core.AffinityGone] + one.counts[core.AffinityNoneCapable]
			maxBusy, sumBusy := time.Duration(0), time.Duration(0)
			for _, d := range one.busy {
				maxBusy = max(maxBusy, d)
				sumBusy += d
			}
			total2 := two.counts[core.AffinityHit] + two.counts[core.AffinityFull] + two.counts[core.AffinityGone] + two.counts[core.AffinityNoneCapable]
			fmt.Printf("%-5.1f %-11s %-6.2f %-7v | %-8s %-22s %-8.2f %-9v | %-12s %-14s | %-8s %s\n",
				r.zipf, fmt.Sprintf("%.1f (%.2f)", r.load, one.load), r.factor, r.wait,
				pct(one.counts[core.AffinityHit]/total),
				fmt.Sprintf("%.0f/%.0f/%.0f", one.counts[core.AffinityFull], one.counts[core.AffinityGone], one.counts[core.AffinityNoneCapable]),
				float64(maxBusy)/(float64(sumBusy)/benchWorkers), one.waitP99.Round(10*time.Microsecond),
				pct(float64(ringMoved)/benchKeys), fmt.Sprintf("%s of %d", pct(float64(moved)/float64(max(both, 1))), both),
				pct(two.counts[core.AffinityHit]/total2),
				fmt.Sprintf("hit ≥ 99%%, moved ≤ %s, max/mean ≤ %.2f", pct(1.5/benchWorkers), r.factor))
		}
	}
}

func sum(m map[int]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func pct(f float64) string { return fmt.Sprintf("%.1f%%", 100*f) }

// fairRun is what one fairness scenario measured.
type fairRun struct {
	// waits are each subject's waits for a slot: from the start for the
	// jobs queued before it, from their submission for the others.
	waits map[string][]time.Duration
	// share is each subject's part of the slot time while every subject
	// had jobs waiting (from the start until one had none left).
	share map[string]float64
}

type submitFunc func(name, subject, owner string, weight, priority int)

// runFair fills every slot with blockers, queues the jobs queue posts,
// then frees every slot at once (the start: posting order and speed do
// not count), and calls during(submit) meanwhile, for jobs posted while
// the queue drains.
func (b *bench) runFair(queue, during func(submit submitFunc)) fairRun {
	b.mu.Lock()
	b.jobs, b.byName = map[string]*placement{}, map[string]*placement{}
	mean := b.mean
	b.mean = time.Hour // the blockers: ended by endBlockers
	b.mu.Unlock()
	for i := range benchWorkers * benchSlots {
		b.submit(fmt.Sprintf("block%d", i), "blockers", "blockers", 1, 0, "")
	}
	b.mu.Lock()
	b.mean = mean
	b.mu.Unlock()
	n := 0
	post := func(name, subject, owner string, weight, priority int) {
		b.submit(name, subject, owner, weight, priority, "")
		n++
	}
	queue(post)
	queued := n
	b.mu.Lock()
	b.done, b.want, b.count = nil, 0, 0
	b.mu.Unlock()
	start := time.Now()
	b.endBlockers()
	if during != nil {
		during(post)
	}
	b.mu.Lock()
	done := make(chan struct{})
	b.done, b.want = done, n
	if b.count >= n {
		close(done)
	}
	b.mu.Unlock()
	_ = queued
	b.wait(done)

	out := fairRun{waits: map[string][]time.Duration{}, share: map[string]float64{}}
	b.mu.Lock()
	defer b.mu.Unlock()
	lastBound := map[string]time.Time{}
	for _, p := range b.jobs {
		if p.subject == "blockers" {
			continue
		}
		out.waits[p.subject] = append(out.waits[p.subject], p.bound.Sub(later(p.submitted, start)))
		if p.bound.After(lastBound[p.subject]) {
			lastBound[p.subject] = p.bound
		}
	}
	end := time.Time{}
	for _, t := range lastBound {
		if end.IsZero() || t.Before(end) {
			end = t
		}
	}
	held := map[string]time.Duration{}
	var all time.Duration
	for _, p := range b.jobs {
		if p.subject == "blockers" {
			continue
		}
		from, to := later(p.bound, start), earlier(p.ended, end)
		if to.After(from) {
			held[p.subject] += to.Sub(from)
			all += to.Sub(from)
		}
	}
	for s, d := range held {
		out.share[s] = float64(d) / float64(all)
	}
	return out
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// endBlockers ends every blocker at once.
func (b *bench) endBlockers() {
	b.mu.Lock()
	var ids []string
	for id, p := range b.jobs {
		if p.subject == "blockers" {
			ids = append(ids, id)
		}
	}
	b.mu.Unlock()
	sort.Strings(ids)
	for _, id := range ids {
		for _, s := range b.workers {
			if s.w.Holds(id, 1) {
				s.w.End(id, 1, "", "", nil)
			}
		}
	}
}

// BenchmarkFairShare prints the fairness table: two subjects posting 10:1
// into a saturated queue (8 workers × 4 slots), with equal weights and
// 3:1, against the light one alone and against first come, first served;
// and a high-priority job's wait under a saturated low-priority backlog.
func BenchmarkFairShare(b *testing.B) {
	const light, heavy = 400, 4000
	for range b.N {
		bn := newBench(b, core.DefaultSchedulingConfig())
		interleaved := func(lightWeight int, owner func(subject string) string) func(submitFunc) {
			return func(post submitFunc) {
				for i := range heavy {
					post(fmt.Sprintf("h%d", i), "heavy", owner("heavy"), 1, 0)
					if i%10 == 9 {
						post(fmt.Sprintf("l%d", i/10), "light", owner("light"), lightWeight, 0)
					}
				}
			}
		}
		self := func(s string) string { return s }
		alone := bn.runFair(func(post submitFunc) {
			for i := range light {
				post(fmt.Sprintf("l%d", i), "light", "light", 1, 0)
			}
		}, nil)
		equal := bn.runFair(interleaved(1, self), nil)
		weighted := bn.runFair(interleaved(3, self), nil)
		fifo := bn.runFair(interleaved(1, func(string) string { return "one" }), nil)

		fmt.Printf("\nfair share: %d workers × %d slots, jobs of %v mean; %d heavy and %d light jobs posted 10:1 into full slots, then every slot frees at once\n",
			benchWorkers, benchSlots, *benchJobMean, heavy, light)
		fmt.Printf("%-38s | %-21s %-10s | %-18s | %s\n", "", "light wait p50 / p99", "p99/alone", "light slot share", "target")
		aloneP99 := percentile(alone.waits["light"], 99)
		line := func(name string, r fairRun, target string) {
			p99 := percentile(r.waits["light"], 99)
			share := "–"
			if len(r.share) > 1 {
				share = pct(r.share["light"])
				if r.share["heavy"] > 0 {
					share += fmt.Sprintf(", %.2f:1", r.share["light"]/r.share["heavy"])
				}
			}
			fmt.Printf("%-38s | %-21s %-10s | %-18s | %s\n", name,
				fmt.Sprintf("%v / %v", percentile(r.waits["light"], 50).Round(100*time.Microsecond), p99.Round(100*time.Microsecond)),
				fmt.Sprintf("%.2f×", float64(p99)/float64(aloneP99)), share, target)
		}
		line("light alone", alone, "")
		line("equal weights", equal, "p99 ≤ 2× alone; share 50% ± 10%")
		line("weights 3:1 (light 3)", weighted, "share 3:1 ± 10%")
		line("one subject: first come, first served", fifo, "(without fair share)")

		// Priority: 3000 jobs of priority 0 queued, then 40 of priority
		// 5 (and as many of 0, for comparison) posted as the backlog drains.
		const backlog, late = 3000, 40
		drain := time.Duration(float64(*benchJobMean) * backlog / (benchWorkers * benchSlots))
		pr := bn.runFair(func(post submitFunc) {
			for i := range backlog {
				post(fmt.Sprintf("b%d", i), "backlog", "s", 1, 0)
			}
		}, func(post submitFunc) {
			for i := range late {
				time.Sleep(drain / (late + 10))
				post(fmt.Sprintf("p%d", i), "high", "s", 1, core.MaxPriority)
				post(fmt.Sprintf("q%d", i), "same", "s", 1, 0)
			}
		})
		bn.close()
		fmt.Printf("\npriority: %d jobs of priority 0 queued into full slots (%v of work), then %d of priority %d and %d of priority 0 posted as it drains (one subject, --priority-aging %v)\n",
			backlog, drain.Round(time.Millisecond), late, core.MaxPriority, late, core.DefaultSchedulingConfig().PriorityAging)
		for _, g := range []struct{ name, subject string }{{"priority 5, posted late", "high"}, {"priority 0, posted late", "same"}, {"the backlog (priority 0)", "backlog"}} {
			fmt.Printf("%-26s wait p50 %-9v p99 %v\n", g.name, percentile(pr.waits[g.subject], 50).Round(100*time.Microsecond), percentile(pr.waits[g.subject], 99).Round(100*time.Microsecond))
		}
	}
}
