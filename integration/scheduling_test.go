package integration_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/httpapi"
	"github.com/switchyard/switchyard/worker"
)

// The scheduling rules on a 3-node cluster (docs/scheduling.md): affinity
// across nodes and after the queue's dispatcher moved, fair share between
// subjects, priorities, and the key's priority cap.

// keyedAnswer answers with the worker's name and the affinity key it saw.
func keyedAnswer(name string) worker.Handler {
	return func(_ context.Context, job *worker.Job, _ *worker.Output) (any, error) {
		return name + "|" + job.AffinityKey, nil
	}
}

// Jobs with one affinity key run on one worker, the first in the key's
// order over the capable consumers, whichever node they are posted to;
// and on the same worker after the queue's dispatcher moved to another
// node.
func TestAffinityAcrossNodes(t *testing.T) {
	nodes := startCluster(t, 3, nil)
	n1, n2, n3 := nodes[0], nodes[1], nodes[2]
	// A consumer that runs none of these jobs (another model), first: n3
	// claims the queue and, hosting a consumer, keeps it.
	MustStartWorker(t, n3, worker.Config{Name: "x", Queue: "aff", Capabilities: []string{"model=other"}}, keyedAnswer("x"))
	for _, n := range nodes {
		waitFor(t, 10*time.Second, "n3 dispatching aff", func() bool { return dispatcherOf(n, "aff") == "n3" })
	}
	for _, w := range []struct {
		n    *switchyard.Node
		name string
	}{{n1, "a"}, {n1, "b"}, {n2, "c"}, {n2, "d"}} {
		MustStartWorker(t, w.n, worker.Config{Name: w.name, Queue: "aff", Concurrency: 2}, keyedAnswer(w.name))
	}
	slots, names := map[string]int{}, map[string]string{}
	for _, n := range nodes {
		waitFor(t, 10*time.Second, "five consumers in "+n.Catalog().Name()+"'s view", func() bool { return len(n.Catalog().Consumers("aff")) == 5 })
	}
	for _, c := range n1.Catalog().Consumers("aff") {
		if c.Name != "x" {
			slots[c.ID], names[c.ID] = c.Concurrency, c.Name
		}
	}
	if d := dispatcherOf(n1, "aff"); d != "n3" {
		t.Fatalf("the dispatcher moved to %s before the test moved it", d)
	}

	run := func(n *switchyard.Node, key string) string {
		t.Helper()
		code, res := resultOf(t, n, "aff", `{"ttl_ms":10000,"input":"x","affinity_key":"`+key+`","capabilities":{"model":"demo"}}`)
		name, seen, ok := strings.Cut(res, "|")
		if code != 200 || !ok || seen != key {
			t.Fatalf("%s from %s: %d %q, want a worker's name and the key", key, n.Catalog().Name(), code, res)
		}
		return name
	}
	keys := make([]string, 12)
	want := map[string]string{}
	for i := range keys {
		keys[i] = fmt.Sprintf("session-%d", i)
		want[keys[i]] = names[core.AffinityOrder(keys[i], slots)[0]]
	}
	if got := slices.Compact(slices.Sorted(maps.Values(want))); len(got) < 3 {
		t.Fatalf("the keys go to %v only: the test needs them spread", got)
	}
	for _, key := range keys {
		for _, n := range nodes {
			if got := run(n, key); got != want[key] {
				t.Errorf("%s posted to %s ran on %s, want %s", key, n.Catalog().Name(), got, want[key])
			}
		}
	}
	affinity := func(n *switchyard.Node, result string) float64 {
		return metric(t, n, "switchyard_dispatch_affinity_total", map[string]string{"result": result})
	}
	if hits, full := affinity(n3, core.AffinityHit), affinity(n3, core.AffinityFull); hits != 36 || full != 0 {
		t.Errorf("n3 counted %v hits and %v misses (full), want 36 and 0", hits, full)
	}

	// n3 leaves, with its worker: the queue's dispatcher moves to n1 or n2,
	// and every key keeps its worker.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := n3.Close(ctx); err != nil {
		t.Fatal(err)
	}
	var moved string
	waitFor(t, 10*time.Second, "the queue's dispatcher on n1 or n2", func() bool {
		moved = dispatcherOf(n1, "aff")
		return (moved == "n1" || moved == "n2") && dispatcherOf(n2, "aff") == moved && len(n1.Catalog().Consumers("aff")) == 4
	})
	for _, key := range keys {
		for _, n := range []*switchyard.Node{n1, n2} {
			if got := run(n, key); got != want[key] {
				t.Errorf("after the move to %s, %s posted to %s ran on %s, want %s", moved, key, n.Catalog().Name(), got, want[key])
			}
		}
	}
	d := n1
	if moved == "n2" {
		d = n2
	}
	if hits := affinity(d, core.AffinityHit); hits != 24 {
		t.Errorf("the new dispatcher %s counted %v hits, want 24", moved, hits)
	}
}

// gate is a worker handler whose jobs run until the test releases them,
// one by one; it reports each job (its input, a name) as it starts.
type gate struct {
	started chan string
	mu      sync.Mutex
	release map[string]chan struct{}
	all     bool
}

func newGate() *gate {
	return &gate{started: make(chan string, 256), release: map[string]chan struct{}{}}
}

func (g *gate) ch(name string) chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	c := g.release[name]
	if c == nil {
		c = make(chan struct{})
		if g.all {
			close(c)
		}
		g.release[name] = c
	}
	return c
}

func (g *gate) handler(ctx context.Context, job *worker.Job, _ *worker.Output) (any, error) {
	var name string
	_ = json.Unmarshal(job.Input, &name)
	g.started <- name
	select {
	case <-g.ch(name):
	case <-ctx.Done():
	}
	return name, nil
}

// open releases every job, now and later.
func (g *gate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.all = true
	for _, c := range g.release {
		select {
		case <-c:
		default:
			close(c)
		}
	}
}

// next waits for the next job to start.
func (g *gate) next(t *testing.T) string {
	t.Helper()
	select {
	case name := <-g.started:
		return name
	case <-time.After(15 * time.Second):
		t.Fatal("no job started")
		return ""
	}
}

// runner releases a gate's jobs oldest first and tells what replaced each.
type runner struct {
	g       *gate
	running []string
	seen    map[string]bool
}

func (r *runner) start(t *testing.T, n int) {
	t.Helper()
	for range n {
		r.running = append(r.running, r.next(t))
	}
}

// next waits for the next job to start; a job that starts twice (its
// worker's session was lost, and it ran again) fails the test: the order
// it checks is lost with it.
func (r *runner) next(t *testing.T) string {
	t.Helper()
	name := r.g.next(t)
	if r.seen == nil {
		r.seen = map[string]bool{}
	}
	if r.seen[name] {
		t.Fatalf("%s started twice: its worker's session was lost", name)
	}
	r.seen[name] = true
	return name
}

// releaseOldest ends the job that started first and returns the job that
// started in its slot.
func (r *runner) releaseOldest(t *testing.T) string {
	t.Helper()
	close(r.g.ch(r.running[0]))
	r.running = r.running[1:]
	next := r.next(t)
	r.running = append(r.running, next)
	return next
}

// queueView is GET /v1/queues/{queue}: the API's own answer type.
type queueView struct{ httpapi.QueueResponse }

func getQueue(t *testing.T, n *switchyard.Node, queue string) queueView {
	t.Helper()
	var v queueView
	res := keyed(t, t.Context(), "GET", baseURL(n)+"/v1/queues/"+queue, keyRoot, "", "")
	if b := readBody(t, res); res.StatusCode != 200 || json.Unmarshal(b, &v) != nil {
		t.Fatalf("GET /v1/queues/%s: %d %s", queue, res.StatusCode, b)
	}
	return v
}

// subjectsLine is a queue view's subjects as "name:depth/bound/weight".
func (v queueView) subjectsLine() string {
	if v.Local == nil {
		return "(not held here)"
	}
	var out []string
	for _, s := range v.Local.Subjects {
		out = append(out, fmt.Sprintf("%s:%d/%d/%d", s.Subject, s.Depth, s.Bound, s.Weight))
	}
	return strings.Join(out, " ")
}

const (
	keyHeavy      = "heavy-key-00000000000001"
	keyLight      = "light-key-00000000000001"
	keyBackground = "backgr-key-0000000000001"
)

// schedKeys is accessKeys with the scheduling tests' subjects: heavy and
// light (of weight lightWeight) on queue fair, and background on demo,
// capped at priority 0.
func schedKeys(lightWeight int) string {
	return accessKeys() + `  - subject: heavy
    key: ` + keyHeavy + `
    roles: [submit]
    queues: [fair]
  - subject: light
    key: ` + keyLight + `
    roles: [submit]
    queues: [fair]
    weight: ` + fmt.Sprint(lightWeight) + `
  - subject: background
    key: ` + keyBackground + `
    roles: [submit]
    queues: [demo]
    max_priority: 0
  - subject: workers
    key: ` + keyAliceWork + `-w
    roles: [work]
    queues: ["*"]
`
}

// startGated starts the workers of a scheduling test on n2 and n3 (slots
// each), running g's jobs, and returns the node that dispatches queue.
func startGated(t *testing.T, nodes []*switchyard.Node, queue string, slots int, g *gate) *switchyard.Node {
	t.Helper()
	dial := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), worker.APIKey(keyAliceWork + "-w")}
	for _, n := range nodes[1:] {
		MustStartWorker(t, n, worker.Config{Name: "w-" + n.Catalog().Name(), Queue: queue, Concurrency: slots, DialOptions: dial}, g.handler)
	}
	t.Cleanup(g.open) // before the nodes close: their drain waits for no job
	var d string
	for _, n := range nodes {
		waitFor(t, 10*time.Second, "one dispatcher and both consumers in every view", func() bool {
			d = dispatcherOf(n, queue)
			return d != "" && dispatcherOf(nodes[0], queue) == d && len(n.Catalog().Consumers(queue)) == len(nodes)-1
		})
	}
	for _, n := range nodes {
		if n.Catalog().Name() == d {
			return n
		}
	}
	t.Fatalf("the dispatcher %s is none of the nodes", d)
	return nil
}

// patientWorkers keeps the gated workers' sessions through a loaded
// machine's pauses: the harness's 1s idle timeout can end a session, and
// its jobs (no output yet) would run again, out of the order the tests
// check.
func patientWorkers(c *switchyard.Config) {
	c.Workers.HeartbeatInterval, c.Workers.IdleTimeout = time.Second, 10*time.Second
}

// post202 posts a job for later streaming with key to n.
func post202(t *testing.T, n *switchyard.Node, queue, key, body string) {
	t.Helper()
	res := keyed(t, t.Context(), "POST", baseURL(n)+"/v1/queues/"+queue+"/jobs", key, "application/json", body)
	mustStatus(t, "POST "+body, res, readBody(t, res), nil, 202)
}

// Fair share between subjects on a 3-node cluster: heavy fills the four
// slots and posts 20 more through n1, light 10 after it through n3; as slots
// free, they go to light until the subjects hold them by their weights,
// then to each subject in turn — not to heavy's earlier jobs first.
func TestFairShareAcrossNodes(t *testing.T) {
	for _, tc := range []struct {
		name        string
		lightWeight int
		want        string // the subjects of the next 12 jobs to start
		held        map[string]int
	}{
		{"equal weights", 1, "LLHHLLHHLLHH", map[string]int{"heavy": 2, "light": 2}},
		{"weights 1:3", 3, "LLLHLLLHLLLH", map[string]int{"heavy": 1, "light": 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nodes := startCluster(t, 3, func(_ int, c *switchyard.Config) {
				c.Auth.Inline = schedKeys(tc.lightWeight)
				patientWorkers(c)
			})
			n1, n3 := nodes[0], nodes[2]
			g := newGate()
			d := startGated(t, nodes, "fair", 2, g)
			r := &runner{g: g}
			for i := range 4 {
				post202(t, n1, "fair", keyHeavy, fmt.Sprintf(`{"ttl_ms":60000,"input":"H%02d"}`, i))
			}
			r.start(t, 4)
			for i := 4; i < 24; i++ {
				post202(t, n1, "fair", keyHeavy, fmt.Sprintf(`{"ttl_ms":60000,"input":"H%02d"}`, i))
			}
			// Each subject posts through one node: a forward that takes
			// longer than ForwardWait is answered before it arrives, so
			// posts through two nodes could reach the dispatcher out of
			// the order the test checks.
			for i := range 10 {
				post202(t, n3, "fair", keyLight, fmt.Sprintf(`{"ttl_ms":60000,"input":"L%02d"}`, i))
			}
			waitFor(t, 10*time.Second, "30 jobs waiting on the dispatcher", func() bool {
				v := getQueue(t, d, "fair")
				return v.Local != nil && v.Local.Depth == 30
			})
			if got, want := getQueue(t, d, "fair").subjectsLine(), fmt.Sprintf("heavy:20/4/1 light:10/0/%d", tc.lightWeight); got != want {
				t.Errorf("the queue view's subjects: %s, want %s", got, want)
			}
			var got strings.Builder
			for range 12 {
				got.WriteByte(r.releaseOldest(t)[0])
			}
			if got.String() != tc.want {
				t.Errorf("the freed slots went to %s, want %s", got.String(), tc.want)
			}
			v := getQueue(t, d, "fair")
			for _, s := range v.Local.Subjects {
				if s.Bound != tc.held[s.Subject] || s.Share != float64(tc.held[s.Subject])/4 {
					t.Errorf("%s holds %d slots (share %v), want %d", s.Subject, s.Bound, s.Share, tc.held[s.Subject])
				}
			}
			// Within each subject, first come, first served.
			var h, l []string
			for _, name := range r.running {
				if name[0] == 'H' {
					h = append(h, name)
				} else {
					l = append(l, name)
				}
			}
			if !slices.IsSorted(h) || !slices.IsSorted(l) {
				t.Errorf("running %v: a subject's jobs started out of order", r.running)
			}
		})
	}
}

// Priorities on a 3-node cluster: one slot, a subject's jobs posted to
// several nodes start highest priority first; a key capped at priority 0
// may not ask for more; out-of-range values are refused; neither refusal
// enqueues anything.
func TestPriorityAcrossNodes(t *testing.T) {
	nodes := startCluster(t, 3, func(_ int, c *switchyard.Config) {
		c.Auth.Inline = schedKeys(1)
		patientWorkers(c)
	})
	n1, n3 := nodes[0], nodes[2]
	g := newGate()
	d := startGated(t, nodes[:2], "demo", 1, g)
	r := &runner{g: g}
	post202(t, n1, "demo", keyAlice, `{"ttl_ms":60000,"input":"busy"}`)
	r.start(t, 1)
	for i, j := range []struct {
		n        *switchyard.Node
		name     string
		priority int
	}{{n1, "p0-first", 0}, {n3, "p-5", -5}, {n1, "p5", 5}, {n3, "p0-second", 0}, {n1, "p2", 2}} {
		post202(t, j.n, "demo", keyAlice, fmt.Sprintf(`{"ttl_ms":60000,"input":%q,"priority":%d}`, j.name, j.priority))
		waitFor(t, 10*time.Second, "the job waiting on the dispatcher", func() bool {
			v := getQueue(t, d, "demo")
			return v.Local != nil && v.Local.Depth == i+1
		})
	}

	// The refusals change nothing.
	for _, tc := range []struct {
		key, body, code string
		status          int
	}{
		{keyBackground, `{"input":"x","priority":1}`, "priority_not_allowed", 403},
		{keyAlice, `{"input":"x","priority":6}`, "priority_out_of_range", 422},
		{keyAlice, `{"input":"x","priority":-6}`, "priority_out_of_range", 422},
		{keyAlice, `{"input":"x","affinity_key":"` + strings.Repeat("k", 257) + `"}`, "invalid_affinity_key", 400},
		{keyAlice, `{"input":"x","affinity_key":["a"]}`, "invalid_affinity_key", 400},
	} {
		res := keyed(t, t.Context(), "POST", baseURL(n3)+"/v1/queues/demo/jobs", tc.key, "application/json", tc.body)
		if b := readBody(t, res); res.StatusCode != tc.status || problemCode(b) != tc.code {
			t.Errorf("%s: %d %s, want %d %s", tc.body, res.StatusCode, b, tc.status, tc.code)
		}
	}
	if v := getQueue(t, d, "demo"); v.Local.Depth != 5 {
		t.Errorf("after the refusals the queue holds %d waiting jobs, want 5", v.Local.Depth)
	}
	// At its cap, the capped key is served.
	post202(t, n3, "demo", keyBackground, `{"ttl_ms":60000,"input":"background","priority":0}`)

	var got []string
	for range 6 {
		got = append(got, r.releaseOldest(t))
	}
	// alice's jobs by priority (p0-first before p0-second: arrival order
	// among equals); background, a subject of its own holding no slot, gets
	// the slot alice frees first.
	want := []string{"background", "p5", "p2", "p0-first", "p0-second", "p-5"}
	if !slices.Equal(got, want) {
		t.Errorf("the jobs started in the order %v, want %v", got, want)
	}
}
