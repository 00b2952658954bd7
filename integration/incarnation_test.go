package integration_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard/switchyard/worker"
)

// Nodes restarted inside their lease, under load (docs/cluster.md,
// "Incarnations"). kb and kc each host a worker (wb, wc) and one of them
// dispatches queue inc; clients post to ka (which holds the embedded etcd)
// in a closed loop, so the lanes to kb and kc always hold forwards and
// deliveries in flight. kc, then kb, then kc, then kb is killed with
// SIGKILL and started again at once under the same name, data directory
// and addresses: the new process revokes the old lease and comes back
// under a new incarnation while peers may still hold forwards and
// deliveries for the old one (a lane resending what its dropped stream
// held unacked). Those are dropped (switchyard_peer_stale_incarnation_total),
// never taken as new. Expected, by the workers' own run records: no
// (job, generation) starts twice, no run starts while another of its job
// runs, no job runs again after its requester saw output; every stream
// ends with one terminal event.
func TestRestartInsideLeaseRunsNothingTwice(t *testing.T) {
	bin := buildOrSkip(t, "builds the binary and runs three node processes")
	t.Cleanup(killHTTP.CloseIdleConnections)
	etcdAddr := freeAddr(t)
	const lease = 6 * time.Second // every restart comes well inside it
	leaseArg := []string{"--lease-ttl", lease.String()}
	a := startProcNode(t, bin, "ka", append([]string{"--etcd-client-addr", etcdAddr}, leaseArg...)...)
	// kb and kc keep their addresses across restarts: their workers dial
	// them again, and peers' connections to their peer addresses reach
	// the new process.
	fixed := func() []string {
		return append([]string{"--etcd-endpoints", "https://" + etcdAddr,
			"--http-addr", freeAddr(t), "--grpc-addr", freeAddr(t), "--peer-addr", freeAddr(t)}, leaseArg...)
	}
	b := startProcNode(t, bin, "kb", fixed()...)
	c := startProcNode(t, bin, "kc", fixed()...)
	const queue = "inc"
	runs := &runLog{}
	plan := runPlan{think: 150 * time.Millisecond, outputs: 3, every: 50 * time.Millisecond}
	startProcWorker(t, c, worker.Config{Name: "wc", Queue: queue, Concurrency: 6, MaxBackoff: 200 * time.Millisecond}, runs.handler("wc", plan))
	waitQueueView(t, a, queue, "kc dispatches with wc", func(q killQueueView) bool {
		return q.Dispatcher == "kc" && q.hasConsumers("wc")
	})
	startProcWorker(t, b, worker.Config{Name: "wb", Queue: queue, Concurrency: 6, MaxBackoff: 200 * time.Millisecond}, runs.handler("wb", plan))
	waitQueueView(t, a, queue, "wb and wc registered", func(q killQueueView) bool { return q.hasConsumers("wb", "wc") })

	load := startIncLoad(a, queue, 24)
	t.Cleanup(load.close)
	time.Sleep(2 * time.Second)
	for i, n := range []*procNode{c, b, c, b} {
		var before killQueueView
		_ = procGetJSON(a, "/v1/queues/"+queue, &before)
		at := n.restart(t)
		n.awaitServing(t, 30*time.Second)
		t.Logf("restart %d: %s (dispatcher before: %s) serving again %v after its SIGKILL", i+1, n.name, before.Dispatcher, time.Since(at).Round(time.Millisecond))
		waitQueueView(t, a, queue, "wb and wc registered again", func(q killQueueView) bool { return q.hasConsumers("wb", "wc") })
		time.Sleep(3 * time.Second)
	}
	streams, refused := load.stop()
	ends := collectStreams(t, streams, 90*time.Second)
	time.Sleep(500 * time.Millisecond) // runs cancelled at the end record their end
	byJob := runs.byJob()
	checkRunInvariants(t, ends, byJob)

	outcomes := map[string]int{}
	for _, e := range ends {
		outcomes[e.terminal+" "+e.code]++
	}
	var stale []string
	for _, n := range []*procNode{a, b, c} {
		for _, kind := range []string{"forward", "deliver"} {
			for _, side := range []string{"sender", "receiver"} {
				if v := procMetricLabels(t, n, "switchyard_peer_stale_incarnation_total", fmt.Sprintf(`kind="%s",side="%s"`, kind, side)); v > 0 {
					stale = append(stale, fmt.Sprintf("%s %s@%s=%v", n.name, kind, side, v))
				}
			}
		}
	}
	t.Logf("%d jobs streamed, %d posts refused; outcomes %v; %d runs; stale jobs dropped (kb's counts are its last process's): %v",
		len(ends), refused, outcomes, len(runs.all()), stale)
	if len(ends) < 50 {
		t.Errorf("only %d jobs ran: the load did not load", len(ends))
	}
}

// incLoad is a closed loop of clients posting streamed jobs to one node.
type incLoad struct {
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	mu      sync.Mutex
	streams []*sseStream
	bodies  []io.Closer
	refused atomic.Int64
}

func startIncLoad(n *procNode, queue string, clients int) *incLoad {
	ctx, cancel := context.WithCancel(context.Background())
	l := &incLoad{cancel: cancel}
	for i := range clients {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for k := 0; ctx.Err() == nil; k++ {
				s := l.post(ctx, n, queue, fmt.Sprintf("c%d-%d", i, k))
				if s == nil {
					select {
					case <-ctx.Done():
					case <-time.After(50 * time.Millisecond):
					}
					continue
				}
				// The stream is read to its end even after stop: its job is
				// judged.
				_, _ = s.wait(90 * time.Second)
			}
		}()
	}
	return l
}

// post posts one job; nil when it was refused or failed.
func (l *incLoad) post(ctx context.Context, n *procNode, queue, input string) *sseStream {
	body := fmt.Sprintf(`{"ttl_ms":30000,"input":%q}`, input)
	req, _ := http.NewRequestWithContext(context.WithoutCancel(ctx), http.MethodPost, "http://"+n.http+"/v1/queues/"+queue+"/jobs", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	res, err := killHTTP.Do(req)
	if err != nil {
		l.refused.Add(1)
		return nil
	}
	if res.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		l.refused.Add(1)
		return nil
	}
	s := readStream(res.Body)
	l.mu.Lock()
	l.streams, l.bodies = append(l.streams, s), append(l.bodies, res.Body)
	l.mu.Unlock()
	return s
}

// stop ends the loop (no new posts) and returns every stream posted and
// the posts refused. The streams are read on; close closes them.
func (l *incLoad) stop() ([]*sseStream, int64) {
	l.cancel()
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*sseStream(nil), l.streams...), l.refused.Load()
}

// close closes every stream and waits for the clients.
func (l *incLoad) close() {
	l.cancel()
	l.mu.Lock()
	for _, b := range l.bodies {
		_ = b.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
	killHTTP.CloseIdleConnections()
}
