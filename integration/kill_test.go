package integration_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	sse "github.com/tmaxmax/go-sse"

	"github.com/switchyard/switchyard/worker"
)

// Kill -9 tests: three nodes, each the real binary in its own process, kb
// and kc using ka's embedded etcd. The workers are SDK workers in this test
// process, so every handler start is recorded here by (job id, generation,
// worker) and a job that runs twice is seen.
//
// The bound a requester's terminal event must meet after a kill: the dead
// node's lease (killLeaseTTL) must expire in etcd (which sweeps expired
// leases every 500ms) and the ingress must see its records go; killSlack
// covers scheduling on a loaded 2-core machine running the race detector.
const (
	killLeaseTTL  = 2 * time.Second
	killHeartbeat = 100 * time.Millisecond
	killSlack     = 5 * time.Second
	killLostBound = killLeaseTTL + killSlack
)

// Kill -9 the consumer host (which also dispatches the queue) mid-stream.
//
// kb hosts wb (4 slots; streams an output every 50ms for 20s) and dispatches
// queue kill1; kc hosts wc (1 slot; waits for a gate, then streams 10
// outputs 50ms apart and completes). Nine SSE requesters post to ka: four
// jobs stream from wb, one sits accepted on wc, four wait in kb's queue.
// Then kb is killed with SIGKILL and wc's gate opens. Expected:
//   - wb's four jobs (they had output) end with exactly one `error`
//     worker_lost within killLostBound of the kill, and never run again;
//   - wc's job, whose host lives, completes;
//   - the four queued jobs (never started, no output) run once on wc, under a
//     new generation, and complete;
//   - no (job, generation) starts twice, each requester sees output from one
//     generation only, and every stream ends with exactly one terminal event.
func TestKillConsumerHostMidStream(t *testing.T) {
	bin := buildOrSkip(t, "builds the binary and runs three node processes")
	a, b, c := startKillCluster(t, bin)
	const queue = "kill1"
	runs := &runLog{}
	gate := make(chan struct{})

	startProcWorker(t, b, worker.Config{Name: "wb", Queue: queue, Concurrency: 4}, runs.streaming("wb", 400, 50*time.Millisecond, nil))
	waitQueueView(t, a, queue, "kb dispatches with wb", func(q killQueueView) bool {
		return q.Dispatcher == "kb" && q.hasConsumers("wb")
	})
	var streams []*sseStream
	for i := range 4 {
		streams = append(streams, postStreamTo(t, a, queue, fmt.Sprintf("first-%d", i)))
	}
	waitFor(t, 20*time.Second, "wb's four jobs streaming to their requesters", func() bool {
		for _, s := range streams {
			if s.count("output") < 3 {
				return false
			}
		}
		return true
	})

	startProcWorker(t, c, worker.Config{Name: "wc", Queue: queue, Concurrency: 1}, runs.streaming("wc", 10, 50*time.Millisecond, gate))
	waitQueueView(t, a, queue, "kb still dispatching, wc registered", func(q killQueueView) bool {
		return q.Dispatcher == "kb" && q.hasConsumers("wb", "wc")
	})
	for i := range 5 {
		streams = append(streams, postStreamTo(t, a, queue, fmt.Sprintf("second-%d", i)))
	}
	waitFor(t, 20*time.Second, "one job accepted on wc and four queued on kb", func() bool {
		on := runs.startedOn("wc")
		if len(on) != 1 {
			return false
		}
		var jv struct{ State, Worker string }
		if err := procGetJSON(a, "/v1/jobs/"+on[0].id, &jv); err != nil || jv.State != "running" || jv.Worker != "wc" {
			return false
		}
		var q killQueueView
		return procGetJSON(b, "/v1/queues/"+queue, &q) == nil && q.Local != nil && q.Local.Depth == 4
	})
	// Everything is in place; the jobs' ids, from their accepted events.
	firstIDs := map[string]bool{}
	for _, s := range streams[:4] {
		firstIDs[streamJobID(t, s)] = true
	}
	wcJob := runs.startedOn("wc")[0].id

	killAt := b.kill9()
	close(gate)
	t.Logf("killed kb (SIGKILL) with 4 jobs streaming on it, 1 accepted on kc, 4 queued on it")

	ends := collectStreams(t, streams, killLostBound+30*time.Second)
	byJob := runs.byJob()
	checkRunInvariants(t, ends, byJob)

	var lostLast, allLast time.Duration
	reran := 0
	for _, e := range ends {
		after := e.terminalAt.Sub(killAt)
		allLast = max(allLast, after)
		rs := byJob[e.id]
		switch {
		case firstIDs[e.id]:
			lostLast = max(lostLast, after)
			if e.terminal != "error" || e.code != "worker_lost" {
				t.Errorf("job %s (streaming on wb when kb died): ended %s %s, want error worker_lost", e.id, e.terminal, e.code)
			}
			if len(rs) != 1 || rs[0].worker != "wb" {
				t.Errorf("job %s had output and must never run again: runs %v", e.id, rs)
			}
			if after > killLostBound {
				t.Errorf("job %s: terminal event %v after the kill, bound %v", e.id, after.Round(time.Millisecond), killLostBound)
			}
		case e.id == wcJob:
			if e.terminal != "done" || len(rs) != 1 || rs[0].worker != "wc" {
				t.Errorf("job %s (on wc, whose node lives): ended %s %s, runs %v; want done after one run", e.id, e.terminal, e.code, rs)
			}
		default:
			reran++
			if e.terminal != "done" || len(rs) != 1 || rs[0].worker != "wc" || rs[0].gen < 2 {
				t.Errorf("job %s (queued on kb): ended %s %s, runs %v; want done after one run on wc under a new generation", e.id, e.terminal, e.code, rs)
			}
		}
	}
	// The queued jobs wait for the lease to expire, then run one at a time
	// on wc (0.5s each), behind wc's own job.
	allBound := killLostBound + time.Duration(reran+1)*(500*time.Millisecond+killHeartbeat) + killSlack
	if allLast > allBound {
		t.Errorf("last terminal event %v after the kill, bound %v", allLast.Round(time.Millisecond), allBound)
	}
	t.Logf("kill → last worker_lost: %v (bound %v = lease TTL %v + %v); kill → last terminal event of all %d jobs: %v (bound %v); %d queued jobs re-ran on wc",
		lostLast.Round(time.Millisecond), killLostBound, killLeaseTTL, killSlack, len(ends), allLast.Round(time.Millisecond), allBound, reran)
	logRuns(t, ends, byJob, killAt)
	logReclaims(t, a, reran)
}

// Kill -9 the dispatcher while it holds pending jobs.
//
// kc dispatches queue kill2 and hosts its only consumers: wc-out (1 slot;
// sends one output, then runs until cancelled) and wc-silent (1 slot; runs
// silently until cancelled). Five jobs are posted to ka: one runs on each
// worker and three wait in kc's queue, the only copy of them. kc is killed
// with SIGKILL, then wb (2 slots; three outputs, then done) connects to kb.
// Expected, once kc's lease is gone:
//   - the job on wc-out had output: `error` worker_lost, one run only;
//   - the job on wc-silent had none: it runs once more, on wb, under a new
//     generation, and completes (the single safe re-run);
//   - the three pending jobs run once, on wb, and complete;
//   - invariants as above.
func TestKillDispatcherWithPendingJobs(t *testing.T) {
	bin := buildOrSkip(t, "builds the binary and runs three node processes")
	a, b, c := startKillCluster(t, bin)
	const queue = "kill2"
	runs := &runLog{}

	startProcWorker(t, c, worker.Config{Name: "wc-out", Queue: queue, Concurrency: 1}, runs.streaming("wc-out", 1, time.Hour, nil))
	startProcWorker(t, c, worker.Config{Name: "wc-silent", Queue: queue, Concurrency: 1}, runs.streaming("wc-silent", 0, time.Hour, nil))
	waitQueueView(t, a, queue, "kc dispatches with both its workers", func(q killQueueView) bool {
		return q.Dispatcher == "kc" && q.hasConsumers("wc-out", "wc-silent")
	})
	var streams []*sseStream
	for i := range 2 {
		streams = append(streams, postStreamTo(t, a, queue, fmt.Sprintf("running-%d", i)))
		waitFor(t, 20*time.Second, fmt.Sprintf("job %d started", i), func() bool { return len(runs.all()) == i+1 })
	}
	outJob := ""
	if on := runs.startedOn("wc-out"); len(on) == 1 {
		outJob = on[0].id
	} else {
		t.Fatalf("runs %v: want one on wc-out", runs.all())
	}
	silentJob := runs.startedOn("wc-silent")[0].id
	for i := range 3 {
		streams = append(streams, postStreamTo(t, a, queue, fmt.Sprintf("pending-%d", i)))
	}
	waitFor(t, 20*time.Second, "wc-out's output at its requester and three jobs queued on kc", func() bool {
		for _, s := range streams {
			if streamJobIDNow(s) == outJob && s.count("output") == 1 {
				var q killQueueView
				return procGetJSON(c, "/v1/queues/"+queue, &q) == nil && q.Local != nil && q.Local.Depth == 3
			}
		}
		return false
	})

	killAt := c.kill9()
	t.Logf("killed kc (SIGKILL), the dispatcher, with 2 jobs running on it and 3 queued")
	startProcWorker(t, b, worker.Config{Name: "wb", Queue: queue, Concurrency: 2}, runs.streaming("wb", 3, 20*time.Millisecond, nil))

	ends := collectStreams(t, streams, killLostBound+30*time.Second)
	byJob := runs.byJob()
	checkRunInvariants(t, ends, byJob)
	var lostAt, allLast time.Duration
	for _, e := range ends {
		after := e.terminalAt.Sub(killAt)
		allLast = max(allLast, after)
		rs := byJob[e.id]
		switch e.id {
		case outJob:
			lostAt = after
			if e.terminal != "error" || e.code != "worker_lost" || len(rs) != 1 {
				t.Errorf("job %s (output on wc-out): ended %s %s after runs %v; want error worker_lost after one run", e.id, e.terminal, e.code, rs)
			}
			if after > killLostBound {
				t.Errorf("job %s: terminal event %v after the kill, bound %v", e.id, after.Round(time.Millisecond), killLostBound)
			}
		case silentJob:
			if e.terminal != "done" || len(rs) != 2 || rs[0].worker != "wc-silent" || rs[1].worker != "wb" || rs[1].gen <= rs[0].gen {
				t.Errorf("job %s (silent on wc-silent): ended %s %s after runs %v; want done after one re-run on wb", e.id, e.terminal, e.code, rs)
			}
		default:
			if e.terminal != "done" || len(rs) != 1 || rs[0].worker != "wb" {
				t.Errorf("job %s (queued on kc): ended %s %s after runs %v; want done after one run on wb", e.id, e.terminal, e.code, rs)
			}
		}
	}
	allBound := killLostBound + killSlack
	if allLast > allBound {
		t.Errorf("last terminal event %v after the kill, bound %v", allLast.Round(time.Millisecond), allBound)
	}
	t.Logf("kill → worker_lost: %v (bound %v); kill → last terminal event of all %d jobs: %v (bound %v)",
		lostAt.Round(time.Millisecond), killLostBound, len(ends), allLast.Round(time.Millisecond), allBound)
	logRuns(t, ends, byJob, killAt)
	logReclaims(t, a, 4)
}

// logReclaims prints the ingress's reclaim count. One per job that went back
// to its queue is the design; more means a job was re-forwarded again before
// its first re-forward landed (a generation spent for nothing: no job ran
// twice, which checkRunInvariants asserts).
func logReclaims(t *testing.T, ingress *procNode, jobs int) {
	t.Helper()
	reclaims, err := procMetric(ingress, "switchyard_dispatch_reclaims_total")
	if err != nil {
		t.Logf("%s: reclaims: %v", ingress.name, err)
		return
	}
	t.Logf("%s: switchyard_dispatch_reclaims_total %v for %d jobs that went back to their queue", ingress.name, reclaims, jobs)
	if int(reclaims) > jobs {
		t.Logf("note: %v reclaims for %d jobs: some were re-forwarded more than once (a new generation each time) while the first re-forward's dispatcher election was in flight", reclaims, jobs)
	}
}

// --- the kill tests' cluster ---

// startKillCluster starts ka (embedded etcd on an explicit client port),
// then kb and kc pointed at it, and waits until ka sees all three online.
func startKillCluster(t *testing.T, bin string) (a, b, c *procNode) {
	t.Helper()
	return startKillClusterWith(t, bin)
}

// startKillClusterWith is startKillCluster with flags of every node's
// that override the kill tests' (a flag given twice takes its last value).
func startKillClusterWith(t *testing.T, bin string, flags ...string) (a, b, c *procNode) {
	t.Helper()
	return startKillClusterEach(t, bin, flags, flags, flags)
}

// startKillClusterEach is startKillCluster with flags of ka's (aFlags),
// kb's and kc's own that override the kill tests'.
func startKillClusterEach(t *testing.T, bin string, aFlags, bFlags, cFlags []string) (a, b, c *procNode) {
	t.Helper()
	// Runs after every node is killed: no keep-alive connection outlives
	// the test.
	t.Cleanup(killHTTP.CloseIdleConnections)
	etcdAddr := freeAddr(t)
	a = startProcNode(t, bin, "ka", append([]string{"--etcd-client-addr", etcdAddr}, aFlags...)...)
	b = startProcNode(t, bin, "kb", append([]string{"--etcd-endpoints", "https://" + etcdAddr}, bFlags...)...)
	c = startProcNode(t, bin, "kc", append([]string{"--etcd-endpoints", "https://" + etcdAddr}, cFlags...)...)
	for _, n := range []*procNode{a, b, c} {
		var v procView
		waitFor(t, 15*time.Second, "ka, kb, kc online in "+n.name+"'s view", func() bool { return v.allOnline(n, 3) })
	}
	return a, b, c
}

// startProcNode starts a node process with the kill tests' timings and
// waits until it serves.
func startProcNode(t *testing.T, bin, name string, extra ...string) *procNode {
	t.Helper()
	dir := t.TempDir()
	args := append([]string{"node", "--name", name,
		"--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--peer-addr", "127.0.0.1:0",
		"--data-dir", filepath.Join(dir, "data"), "--cluster-secret", testSecret,
		"--lease-ttl", killLeaseTTL.String(), "--peer-heartbeat-interval", killHeartbeat.String(), "--peer-failure-threshold", "5",
		"--heartbeat-interval", "200ms", "--worker-idle-timeout", "1s", "--drain-timeout", "1s",
		"--log-level", "debug"}, extra...)
	n := launchProc(t, procSpec{name: name, bin: bin, args: args, log: filepath.Join(dir, name+".log")})
	n.awaitServing(t, 30*time.Second)
	return n
}

// postStreamTo posts a job to n asking for its SSE stream and reads it in the
// background. The stream is closed when the test ends.
func postStreamTo(t *testing.T, n *procNode, queue, input string) *sseStream {
	t.Helper()
	return postEnvelopeTo(t, n, queue, fmt.Sprintf(`{"ttl_ms":120000,"input":%q}`, input))
}

// postEnvelopeTo is postStreamTo with the envelope given whole.
func postEnvelopeTo(t *testing.T, n *procNode, queue, body string) *sseStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+n.http+"/v1/queues/"+queue+"/jobs", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	res, err := killHTTP.Do(req)
	if err != nil {
		cancel()
		t.Fatalf("post to %s: %v", n.name, err)
	}
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		cancel()
		t.Fatalf("post to %s: %d %s", n.name, res.StatusCode, b)
	}
	s := readStream(res.Body)
	t.Cleanup(func() {
		cancel()
		res.Body.Close()
		<-s.done
		killHTTP.CloseIdleConnections()
	})
	return s
}

// --- requesters' view ---

// streamEnd is one requester's stream, judged.
type streamEnd struct {
	id         string
	terminal   string // done or error
	code       string
	terminalAt time.Time
	attempts   []uint64 // distinct attempts of its outputs
	evs        []sse.Event
}

// collectStreams waits for every stream to end and checks that each carries
// exactly one terminal event, as its last.
func collectStreams(t *testing.T, streams []*sseStream, timeout time.Duration) []streamEnd {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var ends []streamEnd
	for i, s := range streams {
		evs, at := s.mustEnd(t, fmt.Sprintf("stream %d", i), time.Until(deadline))
		e := streamEnd{evs: evs}
		terminals := 0
		for j, ev := range evs {
			if e.id == "" {
				e.id = field[string](t, ev, "job_id")
			}
			switch ev.Type {
			case "output":
				if att := field[uint64](t, ev, "attempt"); !slices.Contains(e.attempts, att) {
					e.attempts = append(e.attempts, att)
				}
			case "done", "error":
				terminals++
				e.terminal, e.terminalAt = ev.Type, at[j]
				e.code = field[string](t, ev, "code")
				if j != len(evs)-1 {
					t.Errorf("job %s: terminal event %s is not the last: %s", e.id, ev.Type, strings.Join(types(evs), ","))
				}
			}
		}
		if terminals != 1 {
			t.Errorf("job %s: %d terminal events, want exactly 1: %s", e.id, terminals, strings.Join(types(evs), ","))
		}
		ends = append(ends, e)
	}
	return ends
}

// checkRunInvariants: no (job, generation) started twice; no job ran again
// after a run whose output its requester saw; no run started while another
// of the same job ran (runViolations); each requester saw output from one
// generation only.
func checkRunInvariants(t *testing.T, ends []streamEnd, byJob map[string][]jobRun) {
	t.Helper()
	for _, e := range ends {
		for _, v := range runViolations(e.attempts, byJob[e.id]) {
			t.Errorf("job %s: %s", e.id, v)
		}
		if len(e.attempts) > 1 {
			t.Errorf("job %s: its requester saw output from generations %v", e.id, e.attempts)
		}
	}
}

func logRuns(t *testing.T, ends []streamEnd, byJob map[string][]jobRun, killAt time.Time) {
	t.Helper()
	for _, e := range ends {
		t.Logf("  job %s: %s %s at kill+%v, runs %v, output generations %v", e.id, e.terminal, e.code,
			e.terminalAt.Sub(killAt).Round(time.Millisecond), byJob[e.id], e.attempts)
	}
}

// streamJobID is the job id of a stream's first event.
func streamJobID(t *testing.T, s *sseStream) string {
	t.Helper()
	evs, _ := s.snapshot()
	if len(evs) == 0 {
		t.Fatal("stream has no event yet")
	}
	return field[string](t, evs[0], "job_id")
}

// streamJobIDNow is streamJobID for polling: "" when nothing arrived yet.
func streamJobIDNow(s *sseStream) string {
	evs, _ := s.snapshot()
	if len(evs) == 0 {
		return ""
	}
	var m struct {
		JobID string `json:"job_id"`
	}
	_ = json.Unmarshal([]byte(evs[0].Data), &m)
	return m.JobID
}
