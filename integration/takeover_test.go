package integration_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/switchyard/switchyard/worker"
)

// Dispatcher takeover (docs/cluster.md, "Losing the dispatcher's node"):
// three node processes (ka embeds etcd, so pausing kc costs the catalog
// nothing), the fault suite's timing (500ms peer heartbeat, 6s lease),
// workers on kb and kc, kc dispatching, an open-loop load on ka (a new job
// every 40ms, whatever happens to the ones before). kc is paused with
// SIGSTOP: ka and kb suspect it after one missed ping, one of them claims
// the queue under a new epoch, and the jobs posted after that run on wb
// without waiting for kc's lease. Then SIGCONT: kc wakes and learns it was
// replaced. After a long pause (past its fence deadline) it fences and
// comes back under a new incarnation; after a short one its lease still
// holds and it steps down: the jobs waiting in its queue go back to their
// ingress, and any delivery it sent before it saw the new record is
// refused by the host that has seen the newer epoch. Either way the jobs
// it held run once.
//
// Asserted: correctness only — every stream ends with exactly one terminal
// event, no (job, generation) starts twice, no job runs again after its
// requester saw output, no job runs on two workers at once. Printed: the
// time from the pause to the first start on wb of a job posted after it,
// and the longest gap between run starts while kc is paused.
func TestDispatcherTakeoverOnPause(t *testing.T) {
	bin := buildOrSkip(t, "builds the binary and runs three node processes")
	for _, paused := range []time.Duration{2500 * time.Millisecond, 8 * time.Second} {
		t.Run(fmt.Sprintf("paused-%v", paused), func(t *testing.T) { testTakeoverOnPause(t, bin, paused) })
	}
}

func testTakeoverOnPause(t *testing.T, bin string, paused time.Duration) {
	const (
		heartbeat = 500 * time.Millisecond
		lease     = 6 * time.Second
		every     = 40 * time.Millisecond
	)
	a, b, c := startKillClusterWith(t, bin, "--peer-heartbeat-interval", heartbeat.String(),
		"--lease-ttl", lease.String(), "--peer-failure-threshold", "3")
	const queue = "takeover"
	runs := &runLog{}
	startProcWorker(t, c, worker.Config{Name: "wc", Queue: queue, Concurrency: 8}, runs.streaming("wc", 5, 40*time.Millisecond, nil))
	waitQueueView(t, a, queue, "kc dispatches with wc", func(q killQueueView) bool {
		return q.Dispatcher == "kc" && q.hasConsumers("wc")
	})
	startProcWorker(t, b, worker.Config{Name: "wb", Queue: queue, Concurrency: 8}, runs.streaming("wb", 5, 40*time.Millisecond, nil))
	waitQueueView(t, a, queue, "kc dispatches with wb and wc", func(q killQueueView) bool {
		return q.Dispatcher == "kc" && q.hasConsumers("wb", "wc")
	})

	load := startOpenLoad(t, a, queue, every)
	time.Sleep(2 * time.Second)
	pauseAt := c.signal(syscall.SIGSTOP)
	t.Logf("paused kc (SIGSTOP), the dispatcher, under load")
	time.Sleep(paused)
	contAt := c.signal(syscall.SIGCONT)
	t.Logf("resumed kc (SIGCONT) after %v", contAt.Sub(pauseAt).Round(time.Millisecond))
	time.Sleep(3 * time.Second)
	posts := load.stop()

	streams := make([]*sseStream, 0, len(posts))
	for _, p := range posts {
		if p.err != nil {
			t.Errorf("post at pause%+v refused: %v", p.at.Sub(pauseAt).Round(time.Millisecond), p.err)
			continue
		}
		streams = append(streams, p.s)
	}
	ends := collectStreams(t, streams, lease+30*time.Second)
	byJob := runs.byJob()
	checkRunInvariants(t, ends, byJob)

	// The figures.
	postedAt := map[string]time.Time{}
	for _, p := range posts {
		if p.err == nil {
			postedAt[streamJobIDNow(p.s)] = p.at
		}
	}
	firstOnB := time.Duration(-1)
	var starts []time.Time
	for _, r := range runs.all() {
		starts = append(starts, r.start)
		if r.worker == "wb" && postedAt[r.id].After(pauseAt) && (firstOnB < 0 || r.start.Sub(pauseAt) < firstOnB) {
			firstOnB = r.start.Sub(pauseAt)
		}
	}
	slices.SortFunc(starts, func(x, y time.Time) int { return x.Compare(y) })
	gap, gapFrom := time.Duration(0), time.Duration(0)
	prev := pauseAt
	for _, s := range starts {
		if s.Before(pauseAt) {
			continue
		}
		if s.After(contAt) {
			break
		}
		if d := s.Sub(prev); d > gap {
			gap, gapFrom = d, prev.Sub(pauseAt)
		}
		prev = s
	}
	outcomes := map[string]int{}
	for _, e := range ends {
		outcomes[strings.TrimSpace(e.terminal+" "+e.code)]++
	}
	t.Logf("heartbeat %v, lease %v: pause → first start on wb of a job posted after the pause: %v (%.1f heartbeats); longest gap between starts while paused: %v from pause+%v",
		heartbeat, lease, firstOnB.Round(time.Millisecond), firstOnB.Seconds()/heartbeat.Seconds(), gap.Round(time.Millisecond), gapFrom.Round(time.Millisecond))
	t.Logf("%d jobs posted, outcomes %v, %d runs", len(posts), outcomes, len(runs.all()))
	for _, n := range []*procNode{a, b, c} {
		var figs []string
		for _, m := range []string{"switchyard_dispatch_step_downs_total", "switchyard_dispatch_stale_epoch_total", "switchyard_dispatch_reclaims_total", "switchyard_queue_stalled_seconds_count"} {
			v, err := procMetric(n, m)
			if err != nil {
				figs = append(figs, fmt.Sprintf("%s: %v", m, err))
				continue
			}
			figs = append(figs, fmt.Sprintf("%s %v", strings.TrimPrefix(m, "switchyard_"), v))
		}
		t.Logf("%s: %s", n.name, strings.Join(figs, ", "))
	}
	if firstOnB < 0 {
		t.Errorf("no job posted after the pause started on wb")
	}
}

// openLoad posts a job to a node every interval, each on its own
// goroutine, whatever became of the ones before: an open-loop load, whose
// arrivals a stalled queue does not slow down.
type openLoad struct {
	stopc chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex
	posts []openPost
}

// openPost is one post of an open load: its stream, or why it was refused.
type openPost struct {
	at  time.Time
	s   *sseStream
	err error
}

func startOpenLoad(t *testing.T, n *procNode, queue string, every time.Duration) *openLoad {
	t.Helper()
	l := &openLoad{stopc: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	var bodies []io.Closer
	var bmu sync.Mutex
	t.Cleanup(func() {
		l.stop()
		cancel()
		bmu.Lock()
		for _, b := range bodies {
			b.Close()
		}
		bmu.Unlock()
		killHTTP.CloseIdleConnections()
	})
	l.wg.Go(func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-l.stopc:
				return
			case <-tick.C:
			}
			at := time.Now()
			l.wg.Go(func() {
				body := fmt.Sprintf(`{"ttl_ms":60000,"input":"load-%d"}`, i)
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+n.http+"/v1/queues/"+queue+"/jobs", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Accept", "text/event-stream")
				p := openPost{at: at}
				res, err := killHTTP.Do(req)
				switch {
				case err != nil:
					p.err = err
				case res.StatusCode != http.StatusOK:
					b, _ := io.ReadAll(res.Body)
					res.Body.Close()
					p.err = fmt.Errorf("%d %s", res.StatusCode, b)
				default:
					bmu.Lock()
					bodies = append(bodies, res.Body)
					bmu.Unlock()
					p.s = readStream(res.Body)
				}
				l.mu.Lock()
				l.posts = append(l.posts, p)
				l.mu.Unlock()
			})
		}
	})
	return l
}

// stop ends the load, waits for the posts in flight to be answered, and
// returns every post in the order they were sent.
func (l *openLoad) stop() []openPost {
	select {
	case <-l.stopc:
	default:
		close(l.stopc)
	}
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	out := slices.Clone(l.posts)
	slices.SortFunc(out, func(x, y openPost) int { return x.at.Compare(y.at) })
	return out
}
