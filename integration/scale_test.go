//go:build scale

package integration_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/switchyard/switchyard/integration/loadgen"
	"github.com/switchyard/switchyard/integration/stall"
	"github.com/switchyard/switchyard/worker"
)

// `make scale` (docs/scale.md): the real binary as a growing cluster on this
// machine — three nodes that embed the catalog's etcd members, and every
// further node a client of them (--etcd-endpoints) — with a load tool in
// this process that speaks the real protocols: SDK worker sessions
// (WorkerService over gRPC) and requesters over HTTP/SSE. For each size it
// measures the nodes from outside (/proc, /metrics), then at the largest
// size the fault suite's availability figures, and prints one table.

var (
	scaleSizes  = flag.String("scale.sizes", "3,6,12,24", "cluster sizes, growing (the first at least 3)")
	scaleBin    = flag.String("scale.bin", "", "binary to measure (default: built from this tree)")
	scaleWindow = flag.Duration("scale.window", 8*time.Second, "length of each measuring window")
	scaleQueues = flag.Int("scale.queues", 24, "queues of the fixed load (two workers each)")
	scaleRate   = flag.Int("scale.rate", 100, "jobs per second of the fixed load")
	scaleFaults = flag.Bool("scale.faults", true, "run the fault cases at the largest size")
)

// scaleArgs are every node's flags: the defaults an operator runs with,
// except a short --queue-idle so that the churn's queues are reaped inside
// the run.
var scaleArgs = []string{"--cluster-secret", testSecret, "--metrics-open", "--log-level", "info", "--queue-idle", "3s", "--lease-ttl", "10s"}

// scaleCluster is the growing set of node processes.
type scaleCluster struct {
	t       *testing.T
	bin     string
	dir     string
	nodes   []*procNode
	members []string // the members' etcd client URLs
}

func newScaleCluster(t *testing.T, bin string) *scaleCluster {
	c := &scaleCluster{t: t, bin: bin, dir: t.TempDir()}
	var ic []string
	type member struct{ name, client, peer string }
	var ms []member
	for i := range 3 {
		m := member{fmt.Sprintf("n%02d", i+1), freeAddr(t), freeAddr(t)}
		ms = append(ms, m)
		ic = append(ic, m.name+"=https://"+m.peer)
		c.members = append(c.members, "https://"+m.client)
	}
	for _, m := range ms {
		args := append([]string{"node", "--name", m.name, "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--peer-addr", "127.0.0.1:0",
			"--data-dir", filepath.Join(c.dir, m.name), "--etcd-client-addr", m.client, "--etcd-peer-addr", m.peer,
			"--initial-cluster", strings.Join(ic, ",")}, scaleArgs...)
		c.nodes = append(c.nodes, launchProc(t, procSpec{name: m.name, bin: bin, args: args, log: filepath.Join(c.dir, m.name+".log"), tailLines: 30}))
	}
	for _, n := range c.nodes {
		n.awaitServing(t, 60*time.Second)
	}
	return c
}

// grow starts client nodes until there are size, and waits until every
// node sees every other online.
func (c *scaleCluster) grow(size int) time.Duration {
	start := time.Now()
	var added []*procNode
	for i := len(c.nodes); i < size; i++ {
		name := fmt.Sprintf("n%02d", i+1)
		args := append([]string{"node", "--name", name, "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--peer-addr", "127.0.0.1:0",
			"--data-dir", filepath.Join(c.dir, name), "--etcd-endpoints", strings.Join(c.members, ",")}, scaleArgs...)
		added = append(added, launchProc(c.t, procSpec{name: name, bin: c.bin, args: args, log: filepath.Join(c.dir, name+".log"), tailLines: 30}))
	}
	for _, n := range added {
		n.awaitServing(c.t, 60*time.Second)
	}
	c.nodes = append(c.nodes, added...)
	for _, n := range c.nodes {
		var v procView
		waitFor(c.t, 60*time.Second, fmt.Sprintf("%d nodes online in %s's view", size, n.name), func() bool { return v.allOnline(n, size) })
	}
	return time.Since(start)
}

// --- what is read from a node ---

// procSample is one node's counters at one moment.
type procSample struct {
	at      time.Time
	cpu     time.Duration // user + system since the process started
	rss     float64       // bytes
	sockets int
	metrics map[string]float64 // "name" or "name{labels}" → value
}

func sampleNode(n *procNode) (procSample, error) {
	s := procSample{at: time.Now()}
	pid := n.cmd.Process.Pid
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, err
	}
	// Fields after the command name (which may hold spaces) in parentheses.
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	s.cpu = time.Duration(ut+st) * time.Second / 100 // USER_HZ
	status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			s.rss = kb * 1024
		}
	}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, fd := range fds {
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && strings.HasPrefix(l, "socket:") {
			s.sockets++
		}
	}
	s.metrics, err = scrape(n)
	return s, err
}

// scrape reads a node's /metrics as "name{labels}" → value (comments and
// histogram buckets left out).
func scrape(n *procNode) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+n.http+"/metrics", nil)
	res, err := killHTTP.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, l := range strings.Split(string(b), "\n") {
		if l == "" || l[0] == '#' || strings.Contains(l, "_bucket{") {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		if v, err := strconv.ParseFloat(l[i+1:], 64); err == nil {
			out[l[:i]] = v
		}
	}
	return out, nil
}

// sampleAll samples every node (a node that does not answer fails the run).
func (c *scaleCluster) sampleAll() []procSample {
	out := make([]procSample, len(c.nodes))
	for i, n := range c.nodes {
		s, err := sampleNode(n)
		if err != nil {
			c.t.Fatalf("sample %s: %v", n.name, err)
		}
		out[i] = s
	}
	return out
}

// window is what every node did between two samples.
type window struct {
	before, after []procSample
}

func (w window) secs(i int) float64 { return w.after[i].at.Sub(w.before[i].at).Seconds() }

// delta is metric key's increase on node i.
func (w window) delta(i int, key string) float64 {
	return w.after[i].metrics[key] - w.before[i].metrics[key]
}

// perNode is f for every node.
func (w window) perNode(f func(i int) float64) []float64 {
	out := make([]float64, len(w.after))
	for i := range out {
		out[i] = f(i)
	}
	return out
}

func (w window) cpuShare(i int) float64 {
	return float64(w.after[i].cpu-w.before[i].cpu) / float64(w.after[i].at.Sub(w.before[i].at))
}

// rate is key's increase per second on node i.
func (w window) rate(i int, key string) float64 { return w.delta(i, key) / w.secs(i) }

// clusterRate is key's increase per second summed over every node.
func (w window) clusterRate(key string) float64 {
	sum := 0.0
	for i := range w.after {
		sum += w.rate(i, key)
	}
	return sum
}

var routingKinds = []string{"forward", "deliver", "reply", "release", "unbind", "cancel"}

func (w window) routing(i int) float64 {
	sum := 0.0
	for _, k := range routingKinds {
		sum += w.delta(i, `switchyard_peer_messages_total{kind="`+k+`"}`)
	}
	return sum
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

func maxOf(xs []float64) float64 { return slices.Max(xs) }

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// --- the load tool: worker sessions and requesters ---

type scaleLoad struct {
	t  *testing.T
	mu sync.Mutex
	// runs by the job's client id (its input), by the workers' own record
	runs    map[string][]stall.Run
	workers map[string]*loadWorker
	wg      sync.WaitGroup
}

type loadWorker struct {
	name, queue string
	node        *procNode
	cancel      context.CancelFunc
	started     time.Time
}

func newScaleLoad(t *testing.T) *scaleLoad {
	l := &scaleLoad{t: t, runs: map[string][]stall.Run{}, workers: map[string]*loadWorker{}}
	t.Cleanup(l.stopAll)
	return l
}

// startWorker opens one SDK worker session on node n for queue, with slots
// jobs at once, each taking work.
func (l *scaleLoad) startWorker(n *procNode, queue, name string, slots int, work time.Duration) *loadWorker {
	ctx, cancel := context.WithCancel(context.Background())
	w := &loadWorker{name: name, queue: queue, node: n, cancel: cancel, started: time.Now()}
	l.mu.Lock()
	l.workers[name] = w
	l.mu.Unlock()
	h := func(ctx context.Context, j *worker.Job, _ *worker.Output) (any, error) {
		id := strings.Trim(string(j.Input), `"`)
		run := stall.Run{Worker: name, Start: time.Now()}
		if work > 0 {
			select {
			case <-time.After(work):
			case <-ctx.Done():
			}
		}
		run.End = time.Now()
		l.mu.Lock()
		l.runs[id] = append(l.runs[id], run)
		l.mu.Unlock()
		return name, nil
	}
	l.wg.Go(func() {
		_ = worker.Run(ctx, worker.Config{Server: n.grpc, Queue: queue, Name: name, Concurrency: slots, MaxBackoff: 500 * time.Millisecond}, h)
	})
	return w
}

func (l *scaleLoad) stopWorker(name string) {
	l.mu.Lock()
	w := l.workers[name]
	delete(l.workers, name)
	l.mu.Unlock()
	if w != nil {
		w.cancel()
	}
}

func (l *scaleLoad) stopAll() {
	l.mu.Lock()
	for name, w := range l.workers {
		w.cancel()
		delete(l.workers, name)
	}
	l.mu.Unlock()
	l.wg.Wait()
	killHTTP.CloseIdleConnections()
}

// submit posts one job to queue at node n and reads its stream to the end;
// it reports whether the job ended done.
func submit(n *procNode, queue, id string) (ok bool, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+n.http+"/v1/queues/"+queue+"/jobs",
		strings.NewReader(`{"ttl_ms":30000,"input":"`+id+`"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	res, err := killHTTP.Do(req)
	if err != nil {
		return false, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		return false, fmt.Errorf("%d %s", res.StatusCode, b)
	}
	if strings.Contains(string(b), "event: done") {
		return true, err
	}
	// The stream's end as its last code says (ended by an error event, or
	// cut short).
	why := "no terminal event"
	if m := codeField.FindAllStringSubmatch(string(b), -1); len(m) > 0 {
		why = m[len(m)-1][1]
	}
	return false, fmt.Errorf("%s (%v)", why, err)
}

var codeField = regexp.MustCompile(`"code":"([a-z_]+)"`)

// drive posts jobs at rate per second to random queues from random nodes
// until ctx ends, and returns how many ended done and, by what they ended
// with, those that did not.
func drive(ctx context.Context, nodes []*procNode, queues []string, rate int, record func(stall.Job)) (done int, failed map[string]int) {
	failed = map[string]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	seq := 0
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return done, failed
		case <-tick.C:
		}
		seq++
		n, q := nodes[rand.IntN(len(nodes))], queues[rand.IntN(len(queues))]
		id := fmt.Sprintf("j%d-%d", time.Now().UnixNano(), seq)
		wg.Go(func() {
			posted := time.Now()
			ok, err := submit(n, q, id)
			mu.Lock()
			defer mu.Unlock()
			if ok {
				done++
			} else {
				why := "?"
				if err != nil {
					why = strings.SplitN(err.Error(), " (", 2)[0]
				}
				failed[why]++
			}
			if record != nil {
				record(stall.Job{ID: id, Posted: posted, Ended: time.Now()})
			}
		})
	}
}

// --- the run ---

// scaleRow is one size's figures.
type scaleRow struct {
	n                                   int
	grow                                time.Duration
	cpuIdle, cpuIdleMember, cpuIdleCli  float64
	cpuLoad, cpuLoadMember, cpuLoadCli  float64
	rssIdle, rssIdleMax, rssLoad        float64
	gorIdle, gorLoad                    float64
	sockIdle, sockMax                   float64
	pingsIdle                           float64
	routingLoad                         float64
	etcdIdle, etcdChurn                 map[string]float64 // cluster-wide, per second, by op
	electIdle, electChurn               float64
	watchIdle, watchChurn               float64 // per node per second
	jobsPerSec                          float64
	failedLoad                          map[string]int
	routingPerJob, colocated, crossNode float64
	reach, firstJob                     time.Duration
}

var catalogOps = []string{"get", "put", "delete", "txn", "lease_grant", "lease_keepalive", "lease_revoke", "lease_timetolive"}

func TestScale(t *testing.T) {
	var sizes []int
	for _, s := range strings.Split(*scaleSizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 3 || (len(sizes) > 0 && n <= sizes[len(sizes)-1]) {
			t.Fatalf("-scale.sizes %q: growing sizes of at least 3", *scaleSizes)
		}
		sizes = append(sizes, n)
	}
	bin := *scaleBin
	if bin == "" {
		bin = buildSwitchyard(t)
	}
	t.Cleanup(killHTTP.CloseIdleConnections)
	runStart := time.Now()
	load := newScaleLoad(t)
	cl := newScaleCluster(t, bin)
	var rows []scaleRow
	var stopped string
	for _, size := range sizes {
		row := scaleRow{n: size}
		row.grow = cl.grow(size)
		t.Logf("%d nodes up in %v (run at %v)", size, row.grow.Round(time.Millisecond), time.Since(runStart).Round(time.Second))
		if err := measureSize(t, cl, load, &row); err != nil {
			stopped = fmt.Sprintf("stopped at N=%d: %v", size, err)
			t.Log(stopped)
			break
		}
		rows = append(rows, row)
		t.Logf("%d nodes measured (run at %v)", size, time.Since(runStart).Round(time.Second))
	}
	var faults []string
	switch {
	case !*scaleFaults || stopped != "":
	case len(cl.nodes) < 3+8:
		// Each case faults two client nodes of its own.
		t.Logf("fault cases skipped: they need 8 client nodes, %d nodes have %d", len(cl.nodes), len(cl.nodes)-3)
	default:
		faults = scaleFaultCases(t, cl, load)
	}
	printScaleTable(rows, faults, stopped, time.Since(runStart))
}

func measureSize(t *testing.T, cl *scaleCluster, load *scaleLoad, row *scaleRow) error {
	size := len(cl.nodes)
	// The fixed load's workers: two per queue on neighbouring nodes, so
	// queues and workers spread over every node; a fresh set per size.
	var queues []string
	for i := range *scaleQueues {
		q := fmt.Sprintf("s%d-q%d", size, i)
		queues = append(queues, q)
		for k := range 2 {
			load.startWorker(cl.nodes[(i+k)%size], q, fmt.Sprintf("%s-w%d", q, k), 4, 0)
		}
	}
	last := cl.nodes[size-1]
	for _, q := range queues {
		if err := await(30*time.Second, q+"'s consumers in "+last.name+"'s view", func() bool {
			var v killQueueView
			return procGetJSON(last, "/v1/queues/"+q, &v) == nil && len(v.Consumers) == 2
		}); err != nil {
			return err
		}
	}
	// The previous size's queues are reaped (--queue-idle 3s) before the
	// idle window.
	time.Sleep(5 * time.Second)

	// Idle: workers connected, no job.
	before := cl.sampleAll()
	time.Sleep(*scaleWindow)
	idle := window{before, cl.sampleAll()}
	row.cpuIdle = mean(idle.perNode(idle.cpuShare))
	row.cpuIdleMember = mean(idle.perNode(idle.cpuShare)[:3])
	row.cpuIdleCli = mean(idle.perNode(idle.cpuShare)[3:])
	row.rssIdle = mean(idle.perNode(func(i int) float64 { return idle.after[i].rss }))
	row.rssIdleMax = maxOf(idle.perNode(func(i int) float64 { return idle.after[i].rss }))
	row.gorIdle = mean(idle.perNode(func(i int) float64 { return idle.after[i].metrics["go_goroutines"] }))
	row.sockIdle = mean(idle.perNode(func(i int) float64 { return float64(idle.after[i].sockets) }))
	row.sockMax = maxOf(idle.perNode(func(i int) float64 { return float64(idle.after[i].sockets) }))
	row.pingsIdle = mean(idle.perNode(func(i int) float64 { return idle.rate(i, `switchyard_peer_messages_total{kind="ping"}`) }))
	row.etcdIdle = map[string]float64{}
	for _, op := range catalogOps {
		row.etcdIdle[op] = idle.clusterRate(`switchyard_catalog_requests_total{op="` + op + `"}`)
	}
	row.electIdle = idle.clusterRate("switchyard_catalog_elections_total")
	row.watchIdle = mean(idle.perNode(func(i int) float64 { return idle.rate(i, "switchyard_catalog_watch_events_total") }))

	// Loaded: a fixed rate of jobs from random nodes to random queues.
	ctx, cancel := context.WithTimeout(context.Background(), *scaleWindow)
	before = cl.sampleAll()
	done, failed := drive(ctx, cl.nodes, queues, *scaleRate, nil)
	cancel()
	loaded := window{before, cl.sampleAll()}
	row.cpuLoad = mean(loaded.perNode(loaded.cpuShare))
	row.cpuLoadMember = mean(loaded.perNode(loaded.cpuShare)[:3])
	row.cpuLoadCli = mean(loaded.perNode(loaded.cpuShare)[3:])
	row.rssLoad = mean(loaded.perNode(func(i int) float64 { return loaded.after[i].rss }))
	row.gorLoad = mean(loaded.perNode(func(i int) float64 { return loaded.after[i].metrics["go_goroutines"] }))
	row.routingLoad = mean(loaded.perNode(func(i int) float64 { return loaded.routing(i) / loaded.secs(i) }))
	row.jobsPerSec = float64(done) / loaded.secs(0)
	row.failedLoad = failed
	if done > 0 {
		row.routingPerJob = mean(loaded.perNode(loaded.routing)) * float64(size) / float64(done)
	}

	// Routing cost of one job, co-located and cross-node: one worker on
	// the last node; jobs posted there, then at the first node.
	probe := fmt.Sprintf("s%d-probe", size)
	load.startWorker(last, probe, probe+"-w", 1, 0)
	for _, n := range []*procNode{cl.nodes[0], last} {
		if err := await(30*time.Second, probe+" routable from "+n.name, func() bool {
			var v killQueueView
			return procGetJSON(n, "/v1/queues/"+probe, &v) == nil && len(v.Consumers) == 1
		}); err != nil {
			return err
		}
	}
	var warmErr error
	if err := await(15*time.Second, "a first job on "+probe, func() bool {
		var ok bool
		ok, warmErr = submit(last, probe, "warm")
		return ok
	}); err != nil {
		return fmt.Errorf("%v (last answer: %v)", err, warmErr)
	}
	var probeErr error
	perJob := func(at *procNode) float64 {
		const jobs = 20
		before := cl.sampleAll()
		for i := range jobs {
			if ok, err := submit(at, probe, fmt.Sprint("p", i)); !ok {
				probeErr = fmt.Errorf("probe job at %s: %v", at.name, err)
			}
		}
		w := window{before, cl.sampleAll()}
		return mean(w.perNode(w.routing)) * float64(size) / jobs
	}
	row.colocated, row.crossNode = perJob(last), perJob(cl.nodes[0])
	if probeErr != nil {
		return probeErr
	}
	load.stopWorker(probe + "-w")

	// Reach: from a worker's connect (on the last node) until every node
	// routes to it; then the new queue's first job, from the first node.
	var reach, first []time.Duration
	for k := range 3 {
		q := fmt.Sprintf("s%d-reach%d", size, k)
		start := time.Now()
		load.startWorker(last, q, q+"-w", 1, 0)
		for _, n := range cl.nodes {
			if err := await(30*time.Second, q+" in "+n.name+"'s view", func() bool {
				var v killQueueView
				return procGetJSON(n, "/v1/queues/"+q, &v) == nil && len(v.Consumers) == 1
			}); err != nil {
				return err
			}
		}
		reach = append(reach, time.Since(start))
		start = time.Now()
		if ok, err := submit(cl.nodes[0], q, "first"); !ok {
			return fmt.Errorf("first job on %s: %v", q, err)
		}
		first = append(first, time.Since(start))
		load.stopWorker(q + "-w")
	}
	row.reach, row.firstJob = median(reach), median(first)

	// Churn: a worker on a new queue connects every 200ms at a random
	// node and leaves a second later; its queue is reaped 3s after.
	before = cl.sampleAll()
	churnEnd := time.Now().Add(*scaleWindow)
	var live []string
	for k := 0; time.Now().Before(churnEnd); k++ {
		q := fmt.Sprintf("s%d-churn%d", size, k)
		load.startWorker(cl.nodes[rand.IntN(size)], q, q+"-w", 1, 0)
		live = append(live, q+"-w")
		if len(live) > 5 {
			load.stopWorker(live[0])
			live = live[1:]
		}
		time.Sleep(200 * time.Millisecond)
	}
	churn := window{before, cl.sampleAll()}
	for _, name := range live {
		load.stopWorker(name)
	}
	row.etcdChurn = map[string]float64{}
	for _, op := range catalogOps {
		row.etcdChurn[op] = churn.clusterRate(`switchyard_catalog_requests_total{op="` + op + `"}`)
	}
	row.electChurn = churn.clusterRate("switchyard_catalog_elections_total")
	row.watchChurn = mean(churn.perNode(func(i int) float64 { return churn.rate(i, "switchyard_catalog_watch_events_total") }))

	for _, q := range queues {
		for k := range 2 {
			load.stopWorker(fmt.Sprintf("%s-w%d", q, k))
		}
	}
	return nil
}

// scaleFaultCases runs the fault suite's four availability cases at the
// cluster's size: pause (SIGSTOP, 8s) and kill (SIGKILL) of a worker host
// and of the dispatcher's node of a queue with a worker on each of two
// client nodes, under a steady load from a member node. Each case has its
// own queue and nodes (a killed node stays dead).
func scaleFaultCases(t *testing.T, cl *scaleCluster, load *scaleLoad) []string {
	var out []string
	size := len(cl.nodes)
	for k, c := range []struct {
		what       string
		dispatcher bool
		kill       bool
	}{{"pause worker host", false, false}, {"pause dispatcher's node", true, false}, {"kill worker host", false, true}, {"kill dispatcher's node", true, true}} {
		q := fmt.Sprintf("fault%d", k)
		// Two fresh client nodes per case, from the end.
		a, b := cl.nodes[size-1-2*k], cl.nodes[size-2-2*k]
		slots := 2
		load.startWorker(a, q, q+"-a", slots, 100*time.Millisecond)
		load.startWorker(b, q, q+"-b", slots, 100*time.Millisecond)
		from := cl.nodes[0]
		var v killQueueView
		waitFor(t, 30*time.Second, q+"'s two workers and dispatcher in n01's view", func() bool {
			v = killQueueView{}
			return procGetJSON(from, "/v1/queues/"+q, &v) == nil && len(v.Consumers) == 2 && v.Dispatcher != ""
		})
		if ok, err := submit(from, q, "warm"); !ok {
			t.Fatalf("%s: warm job: %v", q, err)
		}
		waitFor(t, 10*time.Second, q+"'s dispatcher on a worker host", func() bool {
			v = killQueueView{}
			return procGetJSON(from, "/v1/queues/"+q, &v) == nil && (v.Dispatcher == a.name || v.Dispatcher == b.name)
		})
		target, other := a, b
		if (v.Dispatcher == a.name) != c.dispatcher {
			target, other = b, a
		}
		var mu sync.Mutex
		var jobs []stall.Job
		ctx, cancel := context.WithCancel(context.Background())
		type outcome struct {
			done   int
			failed map[string]int
		}
		doneCh := make(chan outcome, 1)
		go func() {
			d, f := drive(ctx, []*procNode{from}, []string{q}, 20, func(j stall.Job) {
				mu.Lock()
				jobs = append(jobs, j)
				mu.Unlock()
			})
			doneCh <- outcome{d, f}
		}()
		time.Sleep(3 * time.Second)
		var faultAt time.Time
		if c.kill {
			faultAt = target.kill9()
		} else {
			faultAt = target.signal(syscall.SIGSTOP)
		}
		const hold = 8 * time.Second
		time.Sleep(hold)
		resumed := time.Time{}
		if !c.kill {
			resumed = target.signal(syscall.SIGCONT)
		}
		time.Sleep(2 * time.Second)
		cancel()
		counts := <-doneCh
		mu.Lock()
		load.mu.Lock()
		for i := range jobs {
			jobs[i].Runs = load.runs[jobs[i].ID]
		}
		var runs []stall.Run
		for _, rs := range load.runs {
			runs = append(runs, rs...)
		}
		load.mu.Unlock()
		ws := []stall.Worker{{Name: q + "-" + map[bool]string{true: "a", false: "b"}[target == a], Slots: slots, DownFrom: faultAt, DownTo: resumed},
			{Name: q + "-" + map[bool]string{true: "a", false: "b"}[other == a], Slots: slots}}
		r := stall.Measure(faultAt, faultAt.Add(hold), jobs, runs, ws)
		mu.Unlock()
		out = append(out, fmt.Sprintf("| %s (%s) | %v | %v | %d | %s |", c.what, target.name,
			r.Longest.Round(time.Millisecond), r.LongestWait.Round(time.Millisecond), counts.done, loadgen.ByCode(counts.failed)))
		load.stopWorker(q + "-a")
		load.stopWorker(q + "-b")
	}
	return out
}

func printScaleTable(rows []scaleRow, faults []string, stopped string, took time.Duration) {
	var b strings.Builder
	fmt.Fprintf(&b, "\nscale: %d cores; load average at the end %s; run took %v\n\n", numCPU(), loadAvg(), took.Round(time.Second))
	head := "| figure |"
	sep := "| --- |"
	for _, r := range rows {
		head += fmt.Sprintf(" N=%d |", r.n)
		sep += " ---: |"
	}
	fmt.Fprintln(&b, head)
	fmt.Fprintln(&b, sep)
	line := func(name string, f func(r scaleRow) string) {
		s := "| " + name + " |"
		for _, r := range rows {
			s += " " + f(r) + " |"
		}
		fmt.Fprintln(&b, s)
	}
	pct := func(x float64) string { return fmt.Sprintf("%.1f%%", 100*x) }
	mb := func(x float64) string { return fmt.Sprintf("%.0f", x/(1<<20)) }
	f1 := func(x float64) string { return fmt.Sprintf("%.1f", x) }
	ms := func(d time.Duration) string { return fmt.Sprintf("%d", d.Milliseconds()) }
	line("size step: start and all online (s)", func(r scaleRow) string { return fmt.Sprintf("%.1f", r.grow.Seconds()) })
	line("CPU per node idle, mean (% of a core)", func(r scaleRow) string { return pct(r.cpuIdle) })
	line("… etcd member nodes / client nodes", func(r scaleRow) string { return pct(r.cpuIdleMember) + " / " + pct(r.cpuIdleCli) })
	line("CPU per node loaded, mean", func(r scaleRow) string { return pct(r.cpuLoad) })
	line("… etcd member nodes / client nodes", func(r scaleRow) string { return pct(r.cpuLoadMember) + " / " + pct(r.cpuLoadCli) })
	line("RSS per node idle, mean / max (MiB)", func(r scaleRow) string { return mb(r.rssIdle) + " / " + mb(r.rssIdleMax) })
	line("RSS per node loaded, mean (MiB)", func(r scaleRow) string { return mb(r.rssLoad) })
	line("goroutines per node idle / loaded", func(r scaleRow) string { return fmt.Sprintf("%.0f / %.0f", r.gorIdle, r.gorLoad) })
	line("open sockets per node idle, mean / max", func(r scaleRow) string { return fmt.Sprintf("%.0f / %.0f", r.sockIdle, r.sockMax) })
	line("pings answered per node per s, idle", func(r scaleRow) string { return f1(r.pingsIdle) })
	line("routing messages per node per s, loaded", func(r scaleRow) string { return f1(r.routingLoad) })
	line("jobs/s loaded (not done in the window)", func(r scaleRow) string { return fmt.Sprintf("%.0f (%s)", r.jobsPerSec, loadgen.ByCode(r.failedLoad)) })
	line("routing messages per job: loaded mix", func(r scaleRow) string { return fmt.Sprintf("%.2f", r.routingPerJob) })
	line("… co-located / cross-node", func(r scaleRow) string { return fmt.Sprintf("%.2f / %.2f", r.colocated, r.crossNode) })
	line("worker connect → routable on every node (ms, median of 3)", func(r scaleRow) string { return ms(r.reach) })
	line("first job on a new queue (ms, median of 3)", func(r scaleRow) string { return ms(r.firstJob) })
	for _, phase := range []string{"idle", "churn"} {
		line("etcd requests/s, cluster, "+phase+": txn / put / get / delete", func(r scaleRow) string {
			m := map[string]map[string]float64{"idle": r.etcdIdle, "churn": r.etcdChurn}[phase]
			return fmt.Sprintf("%.1f / %.1f / %.1f / %.1f", m["txn"], m["put"], m["get"], m["delete"])
		})
		line("… lease keepalive / grant / revoke", func(r scaleRow) string {
			m := map[string]map[string]float64{"idle": r.etcdIdle, "churn": r.etcdChurn}[phase]
			return fmt.Sprintf("%.1f / %.1f / %.1f", m["lease_keepalive"], m["lease_grant"], m["lease_revoke"])
		})
		line("… dispatcher elections/s", func(r scaleRow) string {
			return f1(map[string]float64{"idle": r.electIdle, "churn": r.electChurn}[phase])
		})
		line("watch events per node per s, "+phase, func(r scaleRow) string {
			return f1(map[string]float64{"idle": r.watchIdle, "churn": r.watchChurn}[phase])
		})
	}
	if stopped != "" {
		fmt.Fprintf(&b, "\n%s\n", stopped)
	}
	if len(faults) > 0 {
		fmt.Fprintf(&b, "\nfaults at N=%d (a queue with a worker of 2 slots on each of two client nodes, 20 jobs/s of 100ms from n01; window 8s from the fault):\n\n", rows[len(rows)-1].n)
		fmt.Fprintln(&b, "| case (node) | longest stall | longest wait | jobs done | jobs not done (by code) |")
		fmt.Fprintln(&b, "| --- | ---: | ---: | ---: | ---: |")
		for _, l := range faults {
			fmt.Fprintln(&b, l)
		}
	}
	fmt.Print(b.String())
}

// await polls cond every 20ms until it holds, or fails after timeout.
func await(timeout time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not within %v", what, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

func numCPU() int {
	b, _ := os.ReadFile("/proc/cpuinfo")
	return strings.Count(string(b), "processor\t:")
}

func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
