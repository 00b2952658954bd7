package integration_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	sse "github.com/tmaxmax/go-sse"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/httpapi"
	"github.com/switchyard/switchyard/worker"
)

// burstWorker emits n outputs of size bytes, pausing a millisecond every
// ten (at most 10k events/s: far more than a slow reader takes), once start
// is closed so streams can be opened first.
func burstWorker(n, size int, start <-chan struct{}) worker.Handler {
	return pacedWorker(n, size, 10, start)
}

// pacedWorker is burstWorker pausing a millisecond every perPause outputs.
func pacedWorker(n, size, perPause int, start <-chan struct{}) worker.Handler {
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
			if i%perPause == perPause-1 {
				time.Sleep(time.Millisecond)
			}
		}
		return nil, nil
	}
}

// tickWorker emits one output a millisecond from start until stop is
// closed, each carrying the time it was sent (UnixNano), so a client can
// tell how late it got each one.
func tickWorker(start, stop <-chan struct{}) worker.Handler {
	return func(ctx context.Context, _ *worker.Job, out *worker.Output) (any, error) {
		select {
		case <-start:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return nil, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-tick.C:
			}
			if err := out.Send(ctx, time.Now().UnixNano()); err != nil {
				return nil, err
			}
		}
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

// timedEvent is an SSE event and when the client parsed it.
type timedEvent struct {
	sse.Event
	at time.Time
}

// readTimed parses a whole SSE body, noting when each event arrived. It
// runs in its own goroutine, so it reports a parse error instead of failing.
func readTimed(r io.Reader) ([]timedEvent, error) {
	var evs []timedEvent
	for ev, err := range sse.Read(r, nil) {
		if err != nil {
			return evs, err
		}
		evs = append(evs, timedEvent{ev, time.Now()})
	}
	return evs, nil
}

// timedRead is what readTimed returned.
type timedRead struct {
	evs []timedEvent
	err error
}

// readTimedAsync runs readTimed on its own goroutine; the channel gets its
// result.
func readTimedAsync(r io.Reader) <-chan timedRead {
	done := make(chan timedRead, 1)
	go func() {
		evs, err := readTimed(r)
		done <- timedRead{evs, err}
	}()
	return done
}

// getStream opens an SSE GET and checks that it was accepted.
func getStream(t *testing.T, url string) *http.Response {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Body.Close() })
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d", url, res.StatusCode)
	}
	return res
}

// postJob submits a job without streaming it and returns its id.
func postJob(t *testing.T, n *switchyard.Node, queue string) string {
	t.Helper()
	res := post(t.Context(), t, n, queue, `{"input":"x","ttl_ms":60000}`, false)
	var job struct {
		JobID string `json:"job_id"`
	}
	decode(t, res, &job)
	return job.JobID
}

// A slow client is terminated at the bound under test — with a terminated
// event that tells it where to resume — or, when it asked for drop-oldest,
// skipped ahead with a gap event; meanwhile a client of another job on the
// same node gets every event of its own job as it is produced.
func TestSlowConsumer(t *testing.T) {
	for _, tc := range []struct {
		name string
		// bound is the one under test; the other is set out of reach.
		bound            string
		maxEvents        int
		maxBytes         int64
		n, size          int
		perPause         int // outputs between 1ms pauses
		query            string
		wantTerminated   bool
		wantGapAnnounced bool
	}{
		{"message bound", "events", 512, 64 << 20, 4000, 512, 10, "", true, false},
		{"byte bound", "bytes", 40000, 512 << 10, 600, 8 << 10, 1, "", true, false},
		{"drop-oldest", "events", 512, 64 << 20, 4000, 512, 10, "?slow=drop-oldest", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := MustStartNode(t, func(c *switchyard.Config) {
				c.HTTP.Stream.MaxLagEvents = tc.maxEvents
				c.HTTP.Stream.MaxLagBytes = tc.maxBytes
				c.Engine.HistoryEvents = 50000
				c.Engine.HistoryBytes = 256 << 20
				c.Engine.RetainBytes = c.Engine.HistoryBytes
				c.Engine.Limits.MaxOutputBytes = 256 << 20
			})
			start, stopTicks, burstDone := make(chan struct{}), make(chan struct{}), make(chan struct{})
			burst := pacedWorker(tc.n, tc.size, tc.perPause, start)
			MustStartWorker(t, n, worker.Config{}, func(ctx context.Context, j *worker.Job, out *worker.Output) (any, error) {
				defer close(burstDone)
				return burst(ctx, j, out)
			})
			MustStartWorker(t, n, worker.Config{Queue: "ticks"}, tickWorker(start, stopTicks))
			slowJob, tickJob := postJob(t, n, "demo"), postJob(t, n, "ticks")
			events := baseURL(n) + "/v1/jobs/" + slowJob + "/events"

			slowRes := getStream(t, events+tc.query)
			// The second client follows another job on the same node, at a
			// rate it keeps up with under -race: what it measures is the
			// node, not its own parser.
			tickRes := getStream(t, baseURL(n)+"/v1/jobs/"+tickJob+"/events")

			var fast atomic.Bool
			slowDone := make(chan []byte, 1)
			go func() { slowDone <- slowReader(slowRes.Body, 4<<10, 20*time.Millisecond, &fast) }()
			tickDone := readTimedAsync(tickRes.Body)

			t0 := time.Now()
			close(start)
			var terminatedAfter time.Duration
			if tc.wantTerminated {
				// Polled from the start of the burst: the node ends the
				// slow stream as soon as its queue passes the bound, while
				// its writer is still blocked on the client.
				waitFor(t, 20*time.Second, "slow stream terminated", func() bool {
					return metric(t, n, "switchyard_stream_ended_total", map[string]string{"transport": "sse", "reason": "slow"}) == 1
				})
				terminatedAfter = time.Since(t0)
			}
			// The tick job spans the whole time the slow stream was
			// overwhelmed: it ends only after the burst, and after the slow
			// stream's end.
			recvWithin(t, burstDone, 30*time.Second, "the burst to end")
			burstTook := time.Since(t0)
			close(stopTicks)
			tick := recvWithin(t, tickDone, 10*time.Second, "the tick stream to end")
			if tick.err != nil {
				t.Fatalf("tick stream: %v", tick.err)
			}
			lat := checkTicks(t, tick.evs)

			fast.Store(true)
			got := readAll(t, bytes.NewReader(recvWithin(t, slowDone, 10*time.Second, "the slow reader")))
			if len(got) == 0 {
				t.Fatal("slow client got nothing")
			}
			var seqs []uint64
			lastID, lastSeq := "", uint64(0)
			var gap *sse.Event
			for _, ev := range got {
				switch ev.Type {
				case "accepted", "output", "done":
					seqs = append(seqs, field[uint64](t, ev, "seq"))
					lastID, lastSeq = ev.LastEventID, seqs[len(seqs)-1]
				case "gap":
					if gap == nil {
						gap = &ev
					}
				}
			}
			for i := 1; i < len(seqs); i++ {
				if seqs[i] <= seqs[i-1] {
					t.Fatalf("slow client: out of order at %d: %d after %d", i, seqs[i], seqs[i-1])
				}
			}
			last := got[len(got)-1]

			if tc.wantGapAnnounced {
				if gap == nil || last.Type != "done" {
					t.Fatalf("drop-oldest stream: gap %v, last event %s", gap, last.Type)
				}
				if from, to := field[uint64](t, *gap, "from_seq"), field[uint64](t, *gap, "to_seq"); from < 2 || to < from ||
					field[uint64](t, *gap, "dropped") != to-from+1 {
					t.Fatalf("gap %s", gap.Data)
				}
				if got := metric(t, n, "switchyard_stream_drop_oldest_gaps_total", map[string]string{"transport": "sse"}); got < 1 {
					t.Fatalf("gaps metric %v", got)
				}
				t.Logf("drop-oldest: %d of %d events delivered, first gap %s; tick client on the same node: %s",
					len(seqs), tc.n+2, gap.Data, lat)
				return
			}

			// The stream ends with a terminated event that says why and
			// where to resume: right after the last event this client got.
			if last.Type != "terminated" {
				t.Fatalf("slow client's last event is %q after %d events, want terminated (the cut came before the event telling it how to resume)", last.Type, len(seqs))
			}
			if r := field[string](t, last, "reason"); r != "slow_consumer" {
				t.Errorf("terminated reason %q, want slow_consumer", r)
			}
			if after := field[uint64](t, last, "resume_after_seq"); after != lastSeq {
				t.Errorf("terminated says resume after %d, the last event received was %d", after, lastSeq)
			}
			lagE := metric(t, n, "switchyard_stream_slow_terminated_lag_events", map[string]string{"transport": "sse"})
			lagB := metric(t, n, "switchyard_stream_slow_terminated_lag_bytes", map[string]string{"transport": "sse"})
			if e, b := field[float64](t, last, "lag_events"), field[float64](t, last, "lag_bytes"); e != lagE || b != lagB {
				t.Errorf("terminated event says %v events / %v bytes queued, the metric %v / %v", e, b, lagE, lagB)
			}
			// Only the bound under test can have been passed (the other is
			// out of reach), and it must have been enforced promptly: at
			// most twice the bound, where the watcher wakes on every append;
			// enforced only when the blocked write returned, the queue would
			// have held most of the burst.
			bound, lag := float64(tc.maxEvents), lagE
			if tc.bound == "bytes" {
				bound, lag = float64(tc.maxBytes), lagB
			}
			if lag <= bound || lag > 2*bound {
				t.Fatalf("terminated with %v %s queued, bound %v: want above the bound and at most twice it", lag, tc.bound, bound)
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
			t.Logf("%s: bound %d events / %d bytes; peak queue %v events / %v bytes; terminated %s after the burst began (%d outputs of %d bytes in %s); %d events before the terminated event, the rest on resume; tick client on the same node: %s",
				tc.name, tc.maxEvents, tc.maxBytes, lagE, lagB, terminatedAfter.Round(time.Millisecond), tc.n, tc.size, burstTook.Round(time.Millisecond), lastSeq, lat)
		})
	}
}

// checkTicks checks a tick job's stream — accepted, outputs in order, done,
// never terminated — and returns how late its outputs arrived.
func checkTicks(t *testing.T, evs []timedEvent) string {
	t.Helper()
	var lat []time.Duration
	for i, ev := range evs {
		if seq := field[uint64](t, ev.Event, "seq"); seq != uint64(i+1) {
			t.Fatalf("tick stream: event %d (%s) has seq %d", i, ev.Type, seq)
		}
		if ev.Type == "output" {
			lat = append(lat, ev.at.Sub(time.Unix(0, field[int64](t, ev.Event, "data"))))
		}
	}
	if len(evs) < 3 || evs[0].Type != "accepted" || evs[len(evs)-1].Type != "done" {
		t.Fatalf("tick stream: %d events (%v): want accepted, outputs, done", len(evs), types(untimed(evs[max(len(evs)-3, 0):])))
	}
	slices.Sort(lat)
	p := func(q float64) time.Duration { return lat[int(q*float64(len(lat)-1))].Round(10 * time.Microsecond) }
	// A sanity bound, not a performance test: a stream held up behind the
	// slow one would wait for its writes to time out, or be terminated.
	if worst := lat[len(lat)-1]; worst > 5*time.Second {
		t.Errorf("a tick arrived %s after it was sent", worst)
	}
	return fmt.Sprintf("%d events, latency p50 %s, p99 %s, max %s", len(lat), p(0.5), p(0.99), p(1))
}

func untimed(evs []timedEvent) []sse.Event {
	out := make([]sse.Event, len(evs))
	for i, ev := range evs {
		out[i] = ev.Event
	}
	return out
}

// Every connection the node's HTTP listener accepts has its kernel send
// buffer capped, and 0 leaves the listener alone (the kernel autotunes).
func TestLimitWriteBuffer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if httpapi.LimitWriteBuffer(ln, 0) != ln {
		t.Error("size 0 wrapped the listener")
	}
	const size = 64 << 10
	lim := httpapi.LimitWriteBuffer(ln, size)
	for range 2 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		sc, err := lim.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer sc.Close()
		raw, err := sc.(syscall.Conn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var got int
		var serr error
		if err := raw.Control(func(fd uintptr) { got, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF) }); err != nil || serr != nil {
			t.Fatal(err, serr)
		}
		// Linux doubles what it is asked for, for its bookkeeping.
		if got < size || got > 2*size {
			t.Errorf("SO_SNDBUF of an accepted connection = %d, want %d (or twice that)", got, size)
		}
	}
}
