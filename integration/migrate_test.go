package integration_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/worker"
	sse "github.com/tmaxmax/go-sse"
)

// A job that opted into restarts (on_worker_lost: restart) moves when its
// worker's node is killed mid-stream, instead of failing worker_lost.
//
// Three process nodes as in the kill tests. kb dispatches queue migrate1
// and hosts wb (streams an output every 50ms for 20s); one job posted to
// ka with on_worker_lost restart runs there and streams. wc (10 outputs
// 50ms apart, then done) registers on kc, and kb is killed with SIGKILL.
// The ingress first sees kb silent: the job may still run there, so it
// waits; once kb's lease is gone (proof) it restarts the job. Expected:
//   - the requester's stream: accepted, wb's outputs (stream generation
//     1), exactly one restart event (generation 2, reason node_gone,
//     last_seq the last event of generation 1), then wc's 10 outputs in
//     order (generation 2, one attempt), then exactly one terminal done;
//   - the workers' run records: wb ran the first generation, wc the
//     second, the second started after the first ended (never two at
//     once), no generation started twice;
//   - the job's document lists both attempts, on kb then kc;
//   - a resume token from generation 1 still resumes, exactly after its
//     event, through the restart to the end.
func TestMigrateAfterHostKilled(t *testing.T) {
	bin := buildOrSkip(t, "builds the binary and runs three node processes")
	a, b, c := startKillCluster(t, bin)
	const queue = "migrate1"
	runs := &runLog{}

	startProcWorker(t, b, worker.Config{Name: "wb", Queue: queue, Concurrency: 1}, runs.streaming("wb", 400, 50*time.Millisecond, nil))
	waitQueueView(t, a, queue, "kb dispatches with wb", func(q killQueueView) bool {
		return q.Dispatcher == "kb" && q.hasConsumers("wb")
	})
	s := postEnvelopeTo(t, a, queue, `{"ttl_ms":120000,"input":"moves","on_worker_lost":"restart"}`)
	waitFor(t, 20*time.Second, "the job streaming from wb", func() bool { return s.count("output") >= 3 })
	startProcWorker(t, c, worker.Config{Name: "wc", Queue: queue, Concurrency: 1}, runs.streaming("wc", 10, 50*time.Millisecond, nil))
	waitQueueView(t, a, queue, "wc registered", func(q killQueueView) bool { return q.hasConsumers("wb", "wc") })

	killAt := b.kill9()
	t.Logf("killed kb (SIGKILL) with the job streaming on wb")
	evs, at := s.mustEnd(t, "stream", killLostBound+30*time.Second)
	id := field[string](t, evs[0], "job_id")

	// The stream, event by event.
	logEventSequence(t, evs)
	restartAt, restarts, terminals := -1, 0, 0
	for i, ev := range evs {
		gen, sq := field[uint64](t, ev, "gen"), field[uint64](t, ev, "seq")
		if sq != uint64(i+1) {
			t.Errorf("event %d has seq %d: the stream skipped or repeated", i, sq)
		}
		switch ev.Type {
		case "restart":
			restarts++
			restartAt = i
			if gen != 2 || field[string](t, ev, "reason") != "node_gone" || field[uint64](t, ev, "last_seq") != sq-1 {
				t.Errorf("restart event %s, want gen 2, reason node_gone, last_seq %d", ev.Data, sq-1)
			}
		case "done", "error":
			terminals++
		}
		want := uint64(1)
		if restartAt >= 0 {
			want = 2
		}
		if gen != want {
			t.Errorf("event %d (%s) in stream generation %d, want %d", i, ev.Type, gen, want)
		}
	}
	if restarts != 1 || terminals != 1 || evs[len(evs)-1].Type != "done" {
		t.Fatalf("%d restart events, %d terminal, last %s: want one restart and one done, last", restarts, terminals, evs[len(evs)-1].Type)
	}
	newAttempt := field[uint64](t, evs[restartAt], "attempt")
	after := evs[restartAt+1 : len(evs)-1]
	if len(after) != 10 {
		t.Errorf("%d events between restart and done, want wc's 10 outputs", len(after))
	}
	for i, ev := range after {
		var out struct {
			Data struct {
				By string
				I  int
			}
		}
		if err := json.Unmarshal([]byte(ev.Data), &out); err != nil || ev.Type != "output" || out.Data.By != "wc" || out.Data.I != i || field[uint64](t, ev, "attempt") != newAttempt {
			t.Errorf("event %d after the restart: %s %s, want wc's output %d of attempt %d", i, ev.Type, ev.Data, i, newAttempt)
		}
	}
	t.Logf("kill → restart event %v, → done %v", at[restartAt].Sub(killAt).Round(time.Millisecond), at[len(at)-1].Sub(killAt).Round(time.Millisecond))

	// The workers' record: one run per generation, never two at once.
	rs := runs.byJob()[id]
	for _, v := range runViolations(nil, rs) {
		t.Errorf("job %s: %s", id, v)
	}
	if len(rs) != 2 || rs[0].worker != "wb" || rs[1].worker != "wc" || rs[1].gen != newAttempt || !rs[1].completed {
		t.Errorf("runs %v, want wb's then wc's (attempt %d, completed)", rs, newAttempt)
	} else {
		t.Logf("runs: %v ended kill+%v; %v started kill+%v", rs[0], rs[0].end.Sub(killAt).Round(time.Millisecond), rs[1], rs[1].start.Sub(killAt).Round(time.Millisecond))
	}

	// The job's document lists both attempts.
	var jv struct {
		State            string `json:"state"`
		StreamGeneration uint64 `json:"stream_generation"`
		Restarts         int    `json:"restarts"`
		Attempts         []struct {
			Attempt, Gen         uint64
			Worker, Node, Reason string
			StartedAt            string `json:"started_at"`
			EndedAt              string `json:"ended_at"`
		} `json:"attempts"`
	}
	if err := procGetJSON(a, "/v1/jobs/"+id, &jv); err != nil {
		t.Fatal(err)
	}
	if jv.State != "completed" || jv.StreamGeneration != 2 || jv.Restarts != 1 || len(jv.Attempts) != 2 ||
		jv.Attempts[0].Node != "kb" || jv.Attempts[0].Gen != 1 || !strings.HasPrefix(jv.Attempts[0].Reason, "worker_lost: ") ||
		jv.Attempts[1].Node != "kc" || jv.Attempts[1].Gen != 2 || jv.Attempts[1].Reason != "completed" || jv.Attempts[1].Attempt != newAttempt {
		t.Errorf("job document %+v", jv)
	}

	// A token from generation 1 (the second output) resumes after it.
	tok := evs[2].LastEventID
	req, _ := http.NewRequest(http.MethodGet, "http://"+a.http+"/v1/jobs/"+id+"/events", nil)
	req.Header.Set("Last-Event-ID", tok)
	res, err := killHTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resumed, err := readStream(res.Body).wait(10 * time.Second)
	res.Body.Close()
	if err != nil || res.StatusCode != http.StatusOK || len(resumed) != len(evs)-3 || resumed[0].Type != evs[3].Type ||
		field[uint64](t, resumed[0], "seq") != 4 || resumed[len(resumed)-1].Type != "done" {
		t.Errorf("resume from seq 3 (generation 1): %d %v, %d events (%s), want the %d after it", res.StatusCode, err, len(resumed), strings.Join(types(resumed), ","), len(evs)-3)
	}
	if v, err := procMetric(a, `switchyard_job_restarts_total{reason="node_gone"}`); err != nil || v != 1 {
		t.Errorf("ka's switchyard_job_restarts_total{reason=node_gone} = %v (%v), want 1", v, err)
	}
}

// A job that opted into restarts moves at once when its worker's session
// ends (the worker process stops, its node lives): the host releases the
// job with the session, which stopped the worker's handlers, so no proof
// is waited for. wb's session on kb is ended by the worker itself; the
// job completes on wc behind one restart event (reason worker_lost), and
// the workers' records show wb's run ended before wc's began.
func TestMigrateAfterWorkerSessionEnds(t *testing.T) {
	bin := buildOrSkip(t, "builds the binary and runs three node processes")
	a, b, c := startKillCluster(t, bin)
	const queue = "migrate2"
	runs := &runLog{}

	ctx, stopWB := context.WithCancel(context.Background())
	wbDone := make(chan struct{})
	go func() {
		defer close(wbDone)
		_ = worker.Run(ctx, worker.Config{Server: b.grpc, Name: "wb", Queue: queue, Concurrency: 1, Capabilities: []string{"model=demo"}},
			runs.streaming("wb", 400, 50*time.Millisecond, nil))
	}()
	t.Cleanup(func() { stopWB(); <-wbDone })
	waitQueueView(t, a, queue, "kb dispatches with wb", func(q killQueueView) bool {
		return q.Dispatcher == "kb" && q.hasConsumers("wb")
	})
	s := postEnvelopeTo(t, a, queue, `{"ttl_ms":120000,"input":"moves","on_worker_lost":"restart","max_restarts":1}`)
	waitFor(t, 20*time.Second, "the job streaming from wb", func() bool { return s.count("output") >= 3 })
	startProcWorker(t, c, worker.Config{Name: "wc", Queue: queue, Concurrency: 1}, runs.streaming("wc", 10, 50*time.Millisecond, nil))
	waitQueueView(t, a, queue, "wc registered", func(q killQueueView) bool { return q.hasConsumers("wb", "wc") })

	stoppedAt := time.Now()
	stopWB()
	<-wbDone
	evs, at := s.mustEnd(t, "stream", 30*time.Second)
	id := field[string](t, evs[0], "job_id")
	logEventSequence(t, evs)
	restarts := 0
	for i, ev := range evs {
		if ev.Type == "restart" {
			restarts++
			if field[string](t, ev, "reason") != "worker_lost" || field[uint64](t, ev, "max_restarts") != 1 {
				t.Errorf("restart event %s, want reason worker_lost, max_restarts 1", ev.Data)
			}
			t.Logf("worker stopped → restart event %v", at[i].Sub(stoppedAt).Round(time.Millisecond))
		}
	}
	if restarts != 1 || evs[len(evs)-1].Type != "done" || types(evs)[len(evs)-12] != "restart" {
		t.Errorf("want one restart, then wc's 10 outputs, then done")
	}
	rs := runs.byJob()[id]
	for _, v := range runViolations(nil, rs) {
		t.Errorf("job %s: %s", id, v)
	}
	if len(rs) != 2 || rs[0].worker != "wb" || rs[1].worker != "wc" || !rs[1].completed {
		t.Errorf("runs %v, want wb's then wc's, completed", rs)
	} else {
		t.Logf("runs: %v ended stop+%v; %v started stop+%v", rs[0], rs[0].end.Sub(stoppedAt).Round(time.Millisecond), rs[1], rs[1].start.Sub(stoppedAt).Round(time.Millisecond))
	}
}

// logEventSequence logs a job's stream event by event: each event's type,
// seq, stream generation and attempt.
func logEventSequence(t *testing.T, evs []sse.Event) {
	t.Helper()
	var seq []string
	for _, ev := range evs {
		seq = append(seq, fmt.Sprintf("%s(seq %d, gen %d, attempt %d)", ev.Type, field[uint64](t, ev, "seq"), field[uint64](t, ev, "gen"), field[uint64](t, ev, "attempt")))
	}
	t.Logf("event sequence (%d events): %s", len(evs), strings.Join(seq, " "))
}
