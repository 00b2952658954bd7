package integration_test

import (
	"context"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	sse "github.com/tmaxmax/go-sse"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/worker"
)

// Reply legs end to end: the per-job Respond stream from the consumer host
// to the ingress carries the outputs, and the cancel back.

// Cancel mid-stream with ingress (n2), dispatcher (n1) and worker (n3) on
// three nodes: the cancel (DELETE, or the client leaving) goes from the
// ingress straight to the host on the job's reply leg, the worker's context
// is cancelled, the job ends cancelled, and the leg and its goroutines end
// (no respond stream stays open on the host; the package's leak check
// covers the rest). Prints the propagation latency, cancel → worker
// ctx.Done, p50/p99 over the runs.
func TestReplyLegCancelThreeNodes(t *testing.T) {
	const runs = 30
	nodes := startCluster(t, 3, nil)
	n1, n2, n3 := nodes[0], nodes[1], nodes[2]
	name := func(nd *switchyard.Node) string { return nd.Catalog().Name() }

	// Queue "rl": n1 hosts a consumer that cannot run model=y jobs and
	// claims the queue first, so n1 keeps the dispatch (two consumers on two
	// nodes leave it where it is) and model=y jobs go to n3.
	MustStartWorker(t, n1, worker.Config{Name: "x", Queue: "rl", Capabilities: []string{"model=x"}}, oneShot)
	for _, nd := range nodes {
		waitFor(t, 5*time.Second, "n1 dispatches rl in "+name(nd)+"'s view", func() bool { return dispatcherOf(nd, "rl") == "n1" })
	}
	started := make(chan string, 1)
	cancelled := make(chan time.Time, 1)
	MustStartWorker(t, n3, worker.Config{Name: "y", Queue: "rl", Capabilities: []string{"model=y"}, Concurrency: 4},
		outputThenAwaitCancel(started, cancelled))
	for _, nd := range nodes {
		waitFor(t, 5*time.Second, "both consumers of rl in "+name(nd)+"'s view", func() bool { return len(nd.Catalog().Consumers("rl")) == 2 })
		waitFor(t, 5*time.Second, "n1 still dispatches rl in "+name(nd)+"'s view", func() bool { return dispatcherOf(nd, "rl") == "n1" })
	}
	cancelsBefore := [3]float64{}
	for i, nd := range nodes {
		cancelsBefore[i] = metric(t, nd, "switchyard_peer_messages_total", map[string]string{"kind": "cancel"})
	}

	var lat []time.Duration
	for i := range runs {
		ctx, disconnect := context.WithCancel(t.Context())
		res := post(ctx, t, n2, "rl", `{"ttl_ms":30000,"capabilities":{"model":"y"},"input":"x"}`, true)
		if res.StatusCode != http.StatusOK {
			t.Fatalf("run %d: post: %d", i, res.StatusCode)
		}
		id := res.Header.Get("X-Job-Id")
		// The first output reached the client: it came on the leg, which is
		// open, and the ingress knows the job's host.
		for ev, err := range sse.Read(res.Body, nil) {
			if err != nil {
				t.Fatalf("run %d: read: %v", i, err)
			}
			if ev.Type == "output" {
				break
			}
		}
		select {
		case got := <-started:
			if got != id {
				t.Fatalf("run %d: worker ran %s, posted %s", i, got, id)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("run %d: the worker never started", i)
		}
		byDelete := i%2 == 0
		at := time.Now()
		if byDelete {
			req, _ := http.NewRequest(http.MethodDelete, baseURL(n2)+"/v1/jobs/"+id, nil)
			dres, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			dres.Body.Close()
		} else {
			disconnect()
			res.Body.Close()
		}
		select {
		case done := <-cancelled:
			lat = append(lat, done.Sub(at))
		case <-time.After(5 * time.Second):
			t.Fatalf("run %d (by delete %v): the worker's context was not cancelled", i, byDelete)
		}
		disconnect()
		res.Body.Close()
		var view struct{ State, Outcome string }
		waitFor(t, 5*time.Second, "job "+id+" cancelled", func() bool {
			getJSON(t, baseURL(n2)+"/v1/jobs/"+id, &view)
			return view.State == "cancelled"
		})
		// The job's leg ended on the host: its goroutine is gone (the
		// trunk it rode stays open for the next job).
		waitFor(t, 5*time.Second, "no reply leg open on n3", func() bool {
			return metric(t, n3, "switchyard_peer_reply_legs_open", nil) == 0
		})
	}
	if got := metric(t, n3, "switchyard_peer_reply_legs_ended_total", map[string]string{"reason": "cancel"}); got != runs {
		t.Errorf("n3: reply legs ended by a cancel = %v, want %d", got, runs)
	}
	// Every cancel went from the ingress to the host, on the leg; none by
	// way of the dispatcher.
	for i, want := range []float64{0, runs, 0} {
		got := metric(t, nodes[i], "switchyard_peer_messages_total", map[string]string{"kind": "cancel"}) - cancelsBefore[i]
		if got != want {
			t.Errorf("%s sent %v cancels, want %v", name(nodes[i]), got, want)
		}
	}
	if got := metric(t, n2, "switchyard_jobs_total", map[string]string{"outcome": "cancelled"}); got != runs {
		t.Errorf("n2: jobs cancelled = %v, want %d", got, runs)
	}
	slices.Sort(lat)
	pct := func(p float64) time.Duration { return lat[int(math.Ceil(p*float64(len(lat))))-1] }
	t.Logf("cancel propagation (DELETE or client disconnect at ingress n2 → worker ctx.Done on n3, dispatcher n1), %d runs: p50 %s, p99 %s, min %s, max %s",
		len(lat), pct(0.50).Round(10*time.Microsecond), pct(0.99).Round(10*time.Microsecond), lat[0].Round(10*time.Microsecond), lat[len(lat)-1].Round(10*time.Microsecond))
}

// Slow ingress on the reply leg: the ingress node (kb, its own process) is
// stopped with SIGSTOP while a worker on kc streams outputs as fast as it
// can to a requester on kb, then continued. While kb is stopped it grants
// the job no output credit, so once the worker used its window its Send
// blocks: it produces a small fraction of what its unhindered rate would
// give. After SIGCONT the requester receives every output, in order, and
// the done event: nothing was dropped, and the stop was not taken for a
// silent host (kb's own pause restarts its silence count).
//
// ka holds the embedded etcd so that stopping kb does not stop the catalog;
// kb's lease (10s) outlives the pause.
func TestReplyLegSlowIngressSIGSTOP(t *testing.T) {
	const (
		pause = 1500 * time.Millisecond
		pad   = 200
		// Bounded by the job's default max output (64 MiB).
		maxOutputs = 150_000
	)
	bin := buildOrSkip(t, "builds the binary and runs three node processes")
	_, kb, kc := startKillClusterEach(t, bin, nil,
		// kb's client stream must carry every output, and the backlog
		// arrives as a burst after the pause: bounds far above it, so that
		// the test client is never terminated as a slow consumer (that is
		// another test's subject; this one is the reply leg). The output
		// window, half the stream bound unless set, is the default's: it
		// is what stops the worker.
		[]string{"--lease-ttl", "10s",
			"--stream-max-events", "200000", "--history-events", "400000",
			"--stream-max-bytes", "134217728", "--history-bytes", "268435456", "--retain-bytes", "268435456",
			"--output-window-events", "512", "--output-window-bytes", "2097152"},
		// A host stops the jobs of an ingress that missed its pings (a
		// silent ingress: nobody may be reading them). kb's pause is a slow
		// ingress, not a silent one, only while it is shorter than kc's
		// silence bound for it: 30 pings (3s) here, twice the pause.
		[]string{"--peer-failure-threshold", "30"})

	var produced atomic.Int64
	stopAt := atomic.Int64{}
	stopAt.Store(maxOutputs)
	var mu sync.Mutex
	stamps := make([]time.Time, 0, maxOutputs)
	filler := strings.Repeat("x", pad)
	startProcWorker(t, kc, worker.Config{Name: "fast", Queue: "slowing"}, func(ctx context.Context, job *worker.Job, out *worker.Output) (any, error) {
		for i := 0; int64(i) < stopAt.Load(); i++ {
			if err := out.Send(ctx, map[string]any{"i": i, "pad": filler}); err != nil {
				return nil, err
			}
			mu.Lock()
			stamps = append(stamps, time.Now())
			mu.Unlock()
			produced.Store(int64(i + 1))
		}
		return "all sent", nil
	})
	waitQueueView(t, kb, "slowing", "the worker on kc", func(q killQueueView) bool { return q.hasConsumers("fast") && q.Dispatcher == "kc" })

	s := postStreamTo(t, kb, "slowing", "go")
	waitFor(t, 10*time.Second, "the worker streaming", func() bool { return produced.Load() >= 2000 })
	p0, t0 := produced.Load(), time.Now()
	time.Sleep(300 * time.Millisecond)
	p1, t1 := produced.Load(), time.Now()
	rate := float64(p1-p0) / t1.Sub(t0).Seconds()
	if p1 >= maxOutputs {
		t.Fatalf("the worker produced every output (%d) before the pause: raise maxOutputs", p1)
	}

	if err := kb.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stoppedAt := time.Now()
	time.Sleep(pause)
	atResume := produced.Load()
	if err := kb.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumedAt := time.Now()
	// Finish soon after the resume.
	stopAt.Store(produced.Load() + 5000)

	mu.Lock()
	var during, lastSecond int
	for _, at := range stamps {
		if at.After(stoppedAt) && at.Before(resumedAt) {
			during++
			if at.After(resumedAt.Add(-time.Second)) {
				lastSecond++
			}
		}
	}
	mu.Unlock()
	unhindered := rate * pause.Seconds()
	t.Logf("worker: %.0f outputs/s unhindered (%d-byte outputs); during the %s SIGSTOP of the ingress it produced %d (%.1f%% of the %.0f its rate would give), %d of them in the last second; %d before the stop",
		rate, pad+20, pause, during, 100*float64(during)/unhindered, unhindered, lastSecond, atResume-int64(during))
	if float64(during) > unhindered/4 {
		t.Errorf("the worker produced %d outputs while the ingress was stopped, against %.0f unhindered: it was not slowed", during, unhindered)
	}
	if float64(lastSecond) > rate/20 {
		t.Errorf("the worker produced %d outputs in the last second of the stop: it should be blocked by then", lastSecond)
	}

	evs, _ := s.mustEnd(t, "the requester's stream", 30*time.Second)
	total := int(produced.Load())
	var got []int
	for _, ev := range evs {
		if ev.Type == "output" {
			got = append(got, int(field[map[string]any](t, ev, "data")["i"].(float64)))
		}
	}
	last := evs[len(evs)-1]
	if last.Type != "done" {
		t.Fatalf("the stream ended %s %s, want done", last.Type, last.Data)
	}
	if len(got) != total {
		t.Fatalf("the requester received %d outputs, the worker sent %d", len(got), total)
	}
	for i, v := range got {
		if v != i {
			t.Fatalf("output %d is %d: out of order or lost", i, v)
		}
	}
	waited, _ := procMetric(kc, "switchyard_worker_credit_wait_seconds_total")
	if waited < pause.Seconds()/2 {
		t.Errorf("kc: the job waited %.2fs for output credit, want most of the %s pause", waited, pause)
	}
	t.Logf("after SIGCONT: %d outputs, every one in order, then done, %s after the resume; kc counted %.2fs of the job waiting for output credit",
		total, time.Since(resumedAt).Round(time.Millisecond), waited)
}

// A silent consumer host: kc, its own process, is stopped with SIGSTOP
// while its worker streams to a requester on kb. Its connections stay open
// and nothing arrives on the job's reply leg: kb ends the leg after three
// heartbeat intervals without a frame and fails the job worker_lost, long
// before kc's lease (10s here) could expire. Bound: 3 heartbeat intervals
// from kc's last frame, plus one (kb's check interval and scheduling), plus
// the error's way to the requester. A job kc holds that produced no output
// is not failed at silence: it waits for kc's death to be proven (its
// lease gone), then runs once on a worker that registered on ka meanwhile,
// and completes.
func TestReplyLegSilentHostSIGSTOP(t *testing.T) {
	bin := buildOrSkip(t, "builds the binary and runs three node processes")
	ka, kb, kc := startKillClusterEach(t, bin, nil, nil, []string{"--lease-ttl", "10s"})
	var outputs atomic.Int64
	startProcWorker(t, kc, worker.Config{Name: "busy", Queue: "silent"}, func(ctx context.Context, job *worker.Job, out *worker.Output) (any, error) {
		for i := 0; ; i++ {
			if err := out.Send(ctx, map[string]any{"i": i}); err != nil {
				return nil, err
			}
			outputs.Add(1)
			select {
			case <-time.After(20 * time.Millisecond):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	})
	// A job that computes in silence: no output, so its reply leg carries
	// only the heartbeats of the leg the host opened when it offered it.
	quietStarted := make(chan struct{}, 1)
	startProcWorker(t, kc, worker.Config{Name: "quiet", Queue: "quiet"}, func(ctx context.Context, _ *worker.Job, _ *worker.Output) (any, error) {
		quietStarted <- struct{}{}
		<-ctx.Done()
		return nil, ctx.Err()
	})
	waitQueueView(t, kb, "silent", "the worker on kc", func(q killQueueView) bool { return q.hasConsumers("busy") && q.Dispatcher == "kc" })
	waitQueueView(t, kb, "quiet", "the quiet worker on kc", func(q killQueueView) bool { return q.hasConsumers("quiet") && q.Dispatcher == "kc" })
	s := postStreamTo(t, kb, "silent", "go")
	sq := postStreamTo(t, kb, "quiet", "think")
	waitFor(t, 10*time.Second, "outputs at the requester", func() bool { return s.count("output") >= 5 })
	<-quietStarted

	if err := kc.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stoppedAt := time.Now()
	t.Cleanup(func() { _ = kc.cmd.Process.Signal(syscall.SIGCONT) })
	evs, at := s.mustEnd(t, "the requester's stream", 15*time.Second)
	last := evs[len(evs)-1]
	took := at[len(at)-1].Sub(stoppedAt)
	if last.Type != "error" || field[string](t, last, "code") != "worker_lost" {
		t.Fatalf("the stream ended %s %s, want error worker_lost", last.Type, last.Data)
	}
	t.Logf("host stopped: the requester got worker_lost %s later (heartbeat %s: %.1f intervals; kc's lease is 10s)",
		took.Round(time.Millisecond), killHeartbeat, float64(took)/float64(killHeartbeat))
	if bound := 4*killHeartbeat + killHeartbeat + 500*time.Millisecond; took > bound {
		t.Errorf("worker_lost after %s, want within %s (3 silent heartbeat intervals, one of checking, slack)", took, bound)
	}
	if evs, _ := sq.snapshot(); evs[len(evs)-1].Type == "error" || evs[len(evs)-1].Type == "done" {
		t.Fatalf("the job computing in silence ended at silence: %s %s", evs[len(evs)-1].Type, evs[len(evs)-1].Data)
	}
	var again atomic.Int64
	startProcWorker(t, ka, worker.Config{Name: "quiet-a", Queue: "quiet"}, func(context.Context, *worker.Job, *worker.Output) (any, error) {
		again.Add(1)
		return map[string]any{"by": "ka"}, nil
	})
	qevs, qat := sq.mustEnd(t, "the silent job's stream", 30*time.Second)
	qlast := qevs[len(qevs)-1]
	qtook := qat[len(qat)-1].Sub(stoppedAt)
	if qlast.Type != "done" {
		t.Fatalf("the job computing in silence ended %s %s, want done: run again on ka once kc's death was proven", qlast.Type, qlast.Data)
	}
	t.Logf("host stopped: the job computing in silence ran again on ka and completed %s later (kc's lease is 10s)", qtook.Round(time.Millisecond))
	if qtook < 4*killHeartbeat {
		t.Errorf("silent job: run again after %s, before kc's death could be proven", qtook)
	}
	if n := again.Load(); n != 1 {
		t.Errorf("the job ran %d times on ka, want 1", n)
	}
	if got := procMetricLabels(t, kb, "switchyard_peer_reply_leg_silences_total", `side="ingress"`); got != 2 {
		t.Errorf("kb: reply leg silences = %v, want 2", got)
	}
}

// procMetricLabels reads one series of a labelled counter from a node's
// /metrics: labels is its label set as printed, e.g. `side="ingress"`.
func procMetricLabels(t *testing.T, n *procNode, name, labels string) float64 {
	t.Helper()
	res, err := killHTTP.Get("http://" + n.http + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, name+"{"+labels+"} "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	return 0
}
