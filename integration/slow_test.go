package integration_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/peer/worker"
)

// burstWorker emits n outputs of size bytes, pausing a millisecond every
// ten (about 10k events/s: far more than the slow reader takes, well within
// what a reading client keeps up with), once start is closed so streams can
// be opened first.
func burstWorker(n, size int, start <-chan struct{}) worker.Handler {
	chunk := strings.Repeat("x", size)
	return func(ctx context.Context, _ *worker.Job, out *worker.Output) (any, error) {
		select {
		case <-start:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		for i := range n {
			if err := out.Send(ctx, chunk); err != nil {
				return nil, err
			}
			if i%10 == 9 {
				time.Sleep(time.Millisecond)
			}
		}
		return nil, nil
	}
}

// slowReader reads a body at most step bytes per tick until fast is set,
// then reads the rest at once.
func slowReader(body io.Reader, step int, tick time.Duration, fast *atomic.Bool) []byte {
	var buf bytes.Buffer
	p := make([]byte, step)
	for {
		if fast.Load() {
			_, _ = io.Copy(&buf, body)
			return buf.Bytes()
		}
		n, err := body.Read(p)
		buf.Write(p[:n])
		if err != nil {
			return buf.Bytes()
		}
		time.Sleep(tick)
	}
}

func TestSlowConsumer(t *testing.T) {
	for _, tc := range []struct {
		name        string
		maxEvents   int
		maxBytes    int64
		n, size     int
		query       string
		wantControl string
	}{
		{"message bound", 512, 64 << 20, 12000, 512, "", "terminated"},
		{"byte bound", 1 << 20, 512 << 10, 1500, 8 << 10, "", "terminated"},
		{"drop-oldest", 512, 64 << 20, 12000, 512, "?slow=drop-oldest", "gap"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := MustStartNode(t, func(c *switchyard.Config) {
				c.HTTP.Stream.MaxLagEvents = tc.maxEvents
				c.HTTP.Stream.MaxLagBytes = tc.maxBytes
				c.Engine.HistoryEvents = 50000
				c.Engine.HistoryBytes = 256 << 20
				c.Engine.Limits.MaxOutputBytes = 256 << 20
			})
			start := make(chan struct{})
			MustStartWorker(t, n, worker.Config{}, burstWorker(tc.n, tc.size, start))
			res := post(t.Context(), t, n, "demo", `{"input":"x","ttl_ms":60000}`, false)
			var job struct {
				JobID string `json:"job_id"`
			}
			decode(t, res, &job)
			events := baseURL(n) + "/v1/jobs/" + job.JobID + "/events"

			slowRes, err := http.Get(events + tc.query)
			if err != nil {
				t.Fatal(err)
			}
			defer slowRes.Body.Close()
			fastRes, err := http.Get(events)
			if err != nil {
				t.Fatal(err)
			}
			defer fastRes.Body.Close()

			var fast atomic.Bool
			slowDone := make(chan []byte, 1)
			go func() { slowDone <- slowReader(slowRes.Body, 4<<10, 20*time.Millisecond, &fast) }()
			t0 := time.Now()
			close(start)

			// Another client of the same job on the same node is not held
			// back by the slow one: it sees the whole job while the slow
			// one is still crawling.
			fastEvs := readAll(t, fastRes.Body)
			fastTook := time.Since(t0)
			if last := fastEvs[len(fastEvs)-1]; last.Type != "done" || len(fastEvs) != tc.n+2 {
				t.Fatalf("fast client got %d events ending in %s", len(fastEvs), last.Type)
			}

			if tc.wantControl == "gap" {
				fast.Store(true)
				slowEvs := readAll(t, bytes.NewReader(<-slowDone))
				var gap map[string]float64
				var seqs []uint64
				for _, ev := range slowEvs {
					switch ev.Type {
					case "gap":
						if gap == nil {
							gap = map[string]float64{}
							for _, k := range []string{"from_seq", "to_seq", "dropped"} {
								gap[k] = field[float64](t, ev, k)
							}
						}
					case "accepted", "output", "done":
						seqs = append(seqs, field[uint64](t, ev, "seq"))
					}
				}
				if gap == nil || slowEvs[len(slowEvs)-1].Type != "done" {
					t.Fatalf("drop-oldest stream: gap %v, last event %s", gap, slowEvs[len(slowEvs)-1].Type)
				}
				for i := 1; i < len(seqs); i++ {
					if seqs[i] <= seqs[i-1] {
						t.Fatalf("out of order at %d: %d after %d", i, seqs[i], seqs[i-1])
					}
				}
				if got := metric(t, n, "switchyard_stream_drop_oldest_gaps_total", map[string]string{"transport": "sse"}); got < 1 {
					t.Fatalf("gaps metric %v", got)
				}
				t.Logf("drop-oldest: %d of %d events delivered, first gap %v", len(seqs), tc.n+2, gap)
				return
			}

			// Terminate: the node ends the slow stream as soon as its queue
			// passes the bound — while its writer is still blocked on the
			// client — without waiting for the client to drain anything.
			waitFor(t, 20*time.Second, "slow stream terminated", func() bool {
				return metric(t, n, "switchyard_stream_ended_total", map[string]string{"transport": "sse", "reason": "slow"}) == 1
			})
			terminatedAfter := time.Since(t0)
			lagE := metric(t, n, "switchyard_stream_slow_terminated_lag_events", map[string]string{"transport": "sse"})
			lagB := metric(t, n, "switchyard_stream_slow_terminated_lag_bytes", map[string]string{"transport": "sse"})
			if lagE <= float64(tc.maxEvents) && lagB <= float64(tc.maxBytes) {
				t.Fatalf("terminated with %v events / %v bytes queued: within the bounds", lagE, lagB)
			}
			// Generous: the bound plus what a burst appends between two
			// wake-ups of the watcher, nowhere near the whole job.
			if lagE > float64(tc.maxEvents)*2 && lagB > float64(tc.maxBytes)*2 {
				t.Fatalf("terminated only at %v events / %v bytes queued: the bound was not enforced promptly", lagE, lagB)
			}
			fast.Store(true)
			got := readAll(t, bytes.NewReader(<-slowDone))
			var seqs []uint64
			lastID := ""
			for _, ev := range got {
				if ev.Type == "accepted" || ev.Type == "output" {
					seqs = append(seqs, field[uint64](t, ev, "seq"))
					lastID = ev.LastEventID
				}
			}
			// The client resumes from the last id it received, like an
			// EventSource, and gets the rest: no gap, no duplicate.
			req, _ := http.NewRequest(http.MethodGet, events, nil)
			req.Header.Set("Last-Event-ID", lastID)
			rres, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			for _, ev := range readAll(t, rres.Body) {
				if ev.Type == "output" || ev.Type == "done" {
					seqs = append(seqs, field[uint64](t, ev, "seq"))
				}
			}
			rres.Body.Close()
			for i, s := range seqs {
				if s != uint64(i+1) {
					t.Fatalf("after resume: position %d has seq %d (gap or duplicate)", i, s)
				}
			}
			if len(seqs) != tc.n+2 {
				t.Fatalf("after resume: %d events, want %d", len(seqs), tc.n+2)
			}
			t.Logf("%s: bound %d events / %d bytes; terminated at %v events / %v bytes queued, %s after the burst began (the fast client on the same job finished in %s); %d events before the cut, the rest on resume",
				tc.name, tc.maxEvents, tc.maxBytes, lagE, lagB, terminatedAfter.Round(time.Millisecond), fastTook.Round(time.Millisecond), len(got))
		})
	}
}
