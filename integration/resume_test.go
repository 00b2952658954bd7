package integration_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	sse "github.com/tmaxmax/go-sse"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/worker"
)

// cuttingProxy forwards TCP to target and cuts each connection after a
// random number of response bytes, the way a flaky network drops a stream
// mid-event.
type cuttingProxy struct {
	ln     net.Listener
	target string
	rng    *rand.Rand
	mu     sync.Mutex
	conns  atomic.Int32
	wg     sync.WaitGroup
	min    int
	max    int
}

func startCuttingProxy(tb testing.TB, target string, seed uint64, min, max int) *cuttingProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &cuttingProxy{ln: ln, target: target, rng: rand.New(rand.NewPCG(seed, 1)), min: min, max: max}
	p.wg.Add(1)
	go p.serve()
	tb.Cleanup(func() { ln.Close(); p.wg.Wait() })
	return p
}

func (p *cuttingProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		limit := p.min + p.rng.IntN(p.max-p.min+1)
		p.mu.Unlock()
		p.conns.Add(1)
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer c.Close()
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				return
			}
			defer up.Close()
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			_, _ = io.CopyN(c, up, int64(limit))
		}()
	}
}

// resumeLog checks the events of one job as a reconnecting client receives
// them over all its connections. Every job event is the one the client
// expects next: after its position (ordered, unique, gap-free), or after
// what a gap event said is gone. A gap may only come on a stream the
// client reads from the start (it holds no position), for seqs 1..n the
// history no longer retains. A resync must be for where the client stood,
// and makes it start over without a token, as the spec says. Job events
// only ever go forward, across start-overs too.
type resumeLog struct {
	tb   testing.TB
	name string
	// idSeq is the seq of the last job event received since the client
	// last started over: the position its Last-Event-ID names (0: none).
	idSeq uint64
	// next is the seq the next job event must have.
	next    uint64
	seqs    []uint64
	resyncs int
	gaps    int
	ended   bool
}

func newResumeLog(tb testing.TB, name string) *resumeLog {
	return &resumeLog{tb: tb, name: name, next: 1}
}

// event records one event; it reports whether the client must now start
// over (a resync) or is done (a terminal event).
func (l *resumeLog) event(ev sse.Event) (startOver, done bool) {
	t := l.tb
	switch ev.Type {
	case "accepted", "output", "done", "error":
		seq := field[uint64](t, ev, "seq")
		if seq != l.next {
			t.Errorf("%s: %s seq %d, want %d (a gap or a duplicate); received %v", l.name, ev.Type, seq, l.next, l.seqs)
		}
		if n := len(l.seqs); n > 0 && seq <= l.seqs[n-1] {
			t.Errorf("%s: seq %d after %d: events went backwards", l.name, seq, l.seqs[n-1])
		}
		l.seqs = append(l.seqs, seq)
		l.idSeq, l.next = seq, seq+1
		l.ended = ev.Type == "done" || ev.Type == "error"
		return false, l.ended
	case "gap":
		from, to := field[uint64](t, ev, "from_seq"), field[uint64](t, ev, "to_seq")
		if l.idSeq != 0 || from != 1 || to+1 < l.next || field[uint64](t, ev, "dropped") != to {
			t.Errorf("%s: gap %s at position %d: only a stream read from the start may have one, for seqs 1..oldest-1", l.name, ev.Data, l.idSeq)
		}
		l.gaps++
		l.next = to + 1
	case "resync":
		after, oldest := field[uint64](t, ev, "after_seq"), field[uint64](t, ev, "oldest_seq")
		if after != l.next-1 || oldest <= after+1 {
			t.Errorf("%s: resync %s where the client stood after %d: it must name that position, and the history must really have lost what follows it", l.name, ev.Data, l.next-1)
		}
		l.resyncs++
		// Start over, as the spec says: no token, from the beginning.
		l.idSeq, l.next = 0, 1
		return true, false
	case "terminated":
		if after := field[uint64](t, ev, "resume_after_seq"); after != l.idSeq {
			t.Errorf("%s: terminated %s at position %d", l.name, ev.Data, l.idSeq)
		}
	default:
		t.Errorf("%s: unexpected %s event %s", l.name, ev.Type, ev.Data)
	}
	return false, false
}

// Over many random disconnect points, the events a reconnecting client
// (go-sse, which resumes with Last-Event-ID like a browser) receives across
// all its connections are ordered, unique and gap-free — unless a resync
// was sent: with a history too small to hold the events that pass while
// the client reconnects, its position falls out, it gets resync, and it
// starts over without a token (told by a gap event what is gone).
func TestResumeAcrossRandomDisconnects(t *testing.T) {
	for _, tc := range []struct {
		name string
		// outputs is the job's length; every is the pause between outputs.
		outputs int
		every   time.Duration
		history int
		// retry is the reconnect delay the node asks for: go-sse honours
		// the stream's retry: hint like a browser.
		retry       time.Duration
		wantResyncs bool
	}{
		// The default history holds the whole job: never a resync.
		{"history holds the job", 40, time.Millisecond, core.DefaultConfig().HistoryEvents, time.Millisecond, false},
		// Four events of history, and a reconnect takes 10ms while the job
		// makes one event a millisecond: positions fall out.
		{"small history", 60, time.Millisecond, 4, 10 * time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := MustStartNode(t, func(c *switchyard.Config) {
				c.HTTP.RetryHint = tc.retry
				c.Engine.HistoryEvents = tc.history
				c.HTTP.Stream.MaxLagEvents = min(c.HTTP.Stream.MaxLagEvents, tc.history-1)
			})
			MustStartWorker(t, n, worker.Config{Concurrency: 8}, func(ctx context.Context, job *worker.Job, out *worker.Output) (any, error) {
				for i := range tc.outputs {
					if err := out.Send(ctx, fmt.Sprintf("token-%02d", i)); err != nil {
						return nil, err
					}
					time.Sleep(tc.every)
				}
				return nil, nil
			})
			const seeds = 12
			reconnects, resyncs, gaps := 0, 0, 0
			for seed := range uint64(seeds) {
				proxy := startCuttingProxy(t, n.HTTPAddr(), seed, 150, 2500)
				res := post(t.Context(), t, n, "demo", `{"input":"x","ttl_ms":20000}`, false)
				var job struct {
					JobID string `json:"job_id"`
				}
				decode(t, res, &job)
				log := newResumeLog(t, fmt.Sprintf("seed %d", seed))
				follow(t, "http://"+proxy.ln.Addr().String()+"/v1/jobs/"+job.JobID+"/events", log)
				if !log.ended || log.seqs[len(log.seqs)-1] != uint64(tc.outputs+2) {
					t.Fatalf("seed %d: the client did not get the job's end: %v", seed, log.seqs)
				}
				if !tc.wantResyncs && (log.resyncs > 0 || log.gaps > 0 || len(log.seqs) != tc.outputs+2) {
					t.Fatalf("seed %d: %d resyncs, %d gaps, %d events with a history that holds the whole job", seed, log.resyncs, log.gaps, len(log.seqs))
				}
				reconnects += int(proxy.conns.Load()) - 1
				resyncs += log.resyncs
				gaps += log.gaps
			}
			if reconnects < seeds {
				t.Fatalf("only %d reconnects over all runs: the proxy did not cut enough to test anything", reconnects)
			}
			t.Logf("%d reconnects over %d jobs, %d resyncs, %d gaps: every chain of resumes ordered, unique, gap-free", reconnects, seeds, resyncs, gaps)
			if tc.wantResyncs && resyncs == 0 {
				t.Fatalf("no resync in %d reconnects: the small history did not force one, nothing was tested", reconnects)
			}
			if got := metric(t, n, "switchyard_stream_ended_total", map[string]string{"transport": "sse", "reason": "resync"}); got < float64(resyncs) {
				t.Errorf("resyncs counted %v, received %d", got, resyncs)
			}
			if got := metric(t, n, "switchyard_stream_resumes_accepted_total", map[string]string{"transport": "sse"}); got < float64(reconnects)/4 {
				t.Errorf("resumes accepted = %v for %d reconnects", got, reconnects)
			}
		})
	}
}

// follow reads a job's events the way a browser's EventSource does —
// go-sse reconnects by itself with Last-Event-ID — and, when told to
// resync, starts over with a new connection without one, until the job's
// terminal event.
func follow(t *testing.T, url string, log *resumeLog) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	// No keep-alive: a pooled connection would hold the proxy's upstream
	// open after the test is done with it.
	client := &sse.Client{
		HTTPClient: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}},
		Backoff:    sse.Backoff{InitialInterval: time.Millisecond, Multiplier: 1, Jitter: -1},
	}
	for ctx.Err() == nil {
		sctx, scancel := context.WithCancel(ctx)
		req, _ := http.NewRequestWithContext(sctx, http.MethodGet, url, nil)
		conn := client.NewConnection(req)
		var mu sync.Mutex
		startOver, done := false, false
		conn.SubscribeToAll(func(ev sse.Event) {
			mu.Lock()
			defer mu.Unlock()
			if startOver || done {
				return
			}
			if startOver, done = log.event(ev); startOver || done {
				scancel()
			}
		})
		err := conn.Connect()
		scancel()
		mu.Lock()
		again, over := startOver, done
		mu.Unlock()
		if over {
			return
		}
		if !again {
			t.Fatalf("%s: the client stopped before the job's end: %v (received %v)", log.name, err, log.seqs)
		}
	}
	t.Fatalf("%s: no terminal event in time (received %v)", log.name, log.seqs)
}

// Every bad token gets one identical answer; only the real one resumes.
func TestBadResumeTokensAllLookTheSame(t *testing.T) {
	n := MustStartNode(t, nil)
	MustStartWorker(t, n, worker.Config{}, worker.Tokens(0))
	streamed := func(auth string) (id string, evs []sse.Event) {
		header := []string{"Accept", "text/event-stream"}
		if auth != "" {
			header = append(header, "Authorization", auth)
		}
		res := send(t, t.Context(), http.DefaultClient, http.MethodPost, baseURL(n)+"/v1/queues/demo/jobs", "application/json", `{"input":"a b c"}`, header...)
		defer res.Body.Close()
		return res.Header.Get("X-Job-Id"), readAll(t, res.Body)
	}
	id, evs := streamed("Bearer alice")
	other, otherEvs := streamed("Bearer alice")
	tok := evs[1].LastEventID // after the first output
	if tok == "" || strings.ContainsAny(tok, "\r\n") {
		t.Fatalf("event id %q", tok)
	}
	get := func(job, lastID, auth, query string) (int, string) {
		var header []string
		if lastID != "" {
			header = append(header, "Last-Event-ID", lastID)
		}
		if auth != "" {
			header = append(header, "Authorization", auth)
		}
		res := send(t, t.Context(), http.DefaultClient, http.MethodGet, baseURL(n)+"/v1/jobs/"+job+"/events"+query, "", "", header...)
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}

	// The valid token resumes right after the event it came with.
	status, body := get(id, tok, "Bearer alice", "")
	if status != 200 {
		t.Fatalf("valid token: %d %s", status, body)
	}
	rest := readAll(t, strings.NewReader(body))
	if len(rest) == 0 || field[uint64](t, rest[0], "seq") != 3 {
		t.Fatalf("resume after seq 2 began with %v", types(rest))
	}

	dot := strings.Index(tok, ".")
	bad := map[string]struct{ job, tok, auth, query string }{
		"payload byte flipped": {id, flipByte(tok, dot+3), "Bearer alice", ""},
		"mac byte flipped":     {id, flipByte(tok, len(tok)-3), "Bearer alice", ""},
		"truncated":            {id, tok[:len(tok)-5], "Bearer alice", ""},
		"extra segment":        {id, tok + ".AAAA", "Bearer alice", ""},
		"wrong caller":         {id, tok, "Bearer mallory", ""},
		"no caller":            {id, tok, "", ""},
		"wrong filter":         {id, tok, "Bearer alice", "?types=output"},
		"other job's token":    {id, otherEvs[1].LastEventID, "Bearer alice", ""},
		"token used on other":  {other, tok, "Bearer alice", ""},
		"unknown key id":       {id, "zz" + tok[dot:], "Bearer alice", ""},
		"not base64":           {id, "k0.!!!.???", "Bearer alice", ""},
		"oversized":            {id, strings.Repeat("A", 5000), "Bearer alice", ""},
		"a bare sequence":      {id, "2", "Bearer alice", ""},
	}
	var first string
	for name, c := range bad {
		status, body := get(c.job, c.tok, c.auth, c.query)
		if status != 400 || !strings.Contains(body, `"code":"invalid_resume_token"`) {
			t.Errorf("%s: %d %s", name, status, body)
		}
		if first == "" {
			first = body
		} else if body != first {
			t.Errorf("%s: body differs from the others:\n%s\n%s", name, body, first)
		}
	}
	if got := metric(t, n, "switchyard_stream_resumes_refused_total", map[string]string{"transport": "sse", "reason": "bad_signature"}); got < 2 {
		t.Errorf("refusals by reason bad_signature = %v", got)
	}
	// After the terminal event there is nothing left: 204 stops EventSource.
	if status, _ := get(id, evs[len(evs)-1].LastEventID, "Bearer alice", ""); status != http.StatusNoContent {
		t.Errorf("resume after the terminal event: %d, want 204", status)
	}
}

// A job streamed from its POST with a grace window survives a disconnect
// when its client resumes in time, and is cancelled when it does not.
func TestGraceWindow(t *testing.T) {
	n := MustStartNode(t, func(c *switchyard.Config) { c.Engine.Limits.MaxGrace = 5 * time.Second })
	MustStartWorker(t, n, worker.Config{Concurrency: 2}, worker.Tokens(300*time.Millisecond))

	open := func() (*http.Response, context.CancelFunc, sse.Event) {
		ctx, cancel := context.WithCancel(t.Context())
		res := post(ctx, t, n, "demo", `{"input":"one two three four five six","grace_ms":600}`, true)
		var first sse.Event
		for ev, err := range sse.Read(res.Body, nil) {
			if err != nil {
				t.Fatal(err)
			}
			if ev.Type == "output" {
				first = ev
				break
			}
		}
		return res, cancel, first
	}

	// Resume inside the window: the job carries on to done. The resume
	// waits for the node to see the client go (the metric moves after the
	// window started), so it is a save, not a second reader.
	res, cancel, ev := open()
	id := res.Header.Get("X-Job-Id")
	cancel()
	res.Body.Close()
	waitFor(t, 5*time.Second, "the node to see the client go", func() bool {
		return metric(t, n, "switchyard_stream_ended_total", map[string]string{"transport": "sse", "reason": "client_gone"}) == 1
	})
	req, _ := http.NewRequest(http.MethodGet, baseURL(n)+"/v1/jobs/"+id+"/events", nil)
	req.Header.Set("Last-Event-ID", ev.LastEventID)
	rres, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	evs := readAll(t, rres.Body)
	rres.Body.Close()
	if last := evs[len(evs)-1]; last.Type != "done" {
		t.Fatalf("resumed inside the grace window, got %v (%s)", types(evs), last.Data)
	}
	if got := metric(t, n, "switchyard_stream_grace_saves_total", nil); got != 1 {
		t.Errorf("grace saves = %v", got)
	}

	// No resume: cancelled once the window has passed.
	res, cancel, _ = open()
	id = res.Header.Get("X-Job-Id")
	cancel()
	res.Body.Close()
	var view struct{ State string }
	getJSON(t, baseURL(n)+"/v1/jobs/"+id, &view)
	if view.State == "cancelled" {
		t.Fatal("cancelled at once despite the grace window")
	}
	waitFor(t, 3*time.Second, "cancel after the grace window", func() bool {
		getJSON(t, baseURL(n)+"/v1/jobs/"+id, &view)
		return view.State == "cancelled"
	})

	// The stream that saved the job takes over: when its client leaves too,
	// the window starts again, and without a resume the job is cancelled.
	res, cancel, ev = open()
	id = res.Header.Get("X-Job-Id")
	cancel()
	res.Body.Close()
	time.Sleep(100 * time.Millisecond)
	rctx, rcancel := context.WithCancel(t.Context())
	req, _ = http.NewRequestWithContext(rctx, http.MethodGet, baseURL(n)+"/v1/jobs/"+id+"/events", nil)
	req.Header.Set("Last-Event-ID", ev.LastEventID)
	rres, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	for ev, err := range sse.Read(rres.Body, nil) {
		if err != nil || ev.Type == "output" {
			break
		}
	}
	rcancel()
	rres.Body.Close()
	waitFor(t, 3*time.Second, "cancel after the adopting stream left too", func() bool {
		getJSON(t, baseURL(n)+"/v1/jobs/"+id, &view)
		return view.State == "cancelled"
	})
}

// gatedWorker runs jobs that send an output every tick and never end by
// themselves: a job completes when the test releases it, or ends when it
// is cancelled. What ends a job is what the grace tests are about.
type gatedWorker struct {
	mu    sync.Mutex
	gates map[string]chan struct{}
}

func newGatedWorker() *gatedWorker { return &gatedWorker{gates: map[string]chan struct{}{}} }

func (g *gatedWorker) gate(id string) chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	c, ok := g.gates[id]
	if !ok {
		c = make(chan struct{})
		g.gates[id] = c
	}
	return c
}

// release lets the job complete.
func (g *gatedWorker) release(id string) { close(g.gate(id)) }

func (g *gatedWorker) handler(tick time.Duration) worker.Handler {
	return func(ctx context.Context, job *worker.Job, out *worker.Output) (any, error) {
		gate := g.gate(job.ID)
		t := time.NewTicker(tick)
		defer t.Stop()
		for i := 0; ; i++ {
			if err := out.Send(ctx, i); err != nil {
				return nil, err
			}
			select {
			case <-gate:
				return "released", nil
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-t.C:
			}
		}
	}
}

// readUntilEnd reads an SSE body to its end within d, failing with what
// it got if the stream did not end.
func readUntilEnd(t *testing.T, res *http.Response, d time.Duration, what string) []sse.Event {
	t.Helper()
	timer := time.AfterFunc(d, func() { res.Body.Close() })
	defer timer.Stop()
	var evs []sse.Event
	for ev, err := range sse.Read(res.Body, nil) {
		if err != nil {
			t.Fatalf("%s: the stream did not end within %s (%v) after %d events", what, d, err, len(evs))
		}
		evs = append(evs, ev)
	}
	return evs
}

// A GET without a resume token during the grace window only watches: it
// proves nothing about who asks, so it does not save the job. The job is
// cancelled when the window ends — no sooner — and the watcher sees it.
func TestGraceWindowWatcherDoesNotSave(t *testing.T) {
	const grace = time.Second
	n := MustStartNode(t, nil)
	g := newGatedWorker()
	MustStartWorker(t, n, worker.Config{}, g.handler(50*time.Millisecond))

	ctx, cancel := context.WithCancel(t.Context())
	res := post(ctx, t, n, "demo", fmt.Sprintf(`{"input":"x","ttl_ms":30000,"grace_ms":%d}`, grace.Milliseconds()), true)
	id := res.Header.Get("X-Job-Id")
	for ev, err := range sse.Read(res.Body, nil) {
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type == "output" {
			break
		}
	}
	left := time.Now()
	cancel()
	res.Body.Close()
	waitFor(t, 5*time.Second, "the node to see the client go", func() bool {
		return metric(t, n, "switchyard_stream_ended_total", map[string]string{"transport": "sse", "reason": "client_gone"}) == 1
	})

	wres, err := http.Get(baseURL(n) + "/v1/jobs/" + id + "/events")
	if err != nil {
		t.Fatal(err)
	}
	defer wres.Body.Close()
	evs := readUntilEnd(t, wres, 10*time.Second, "the watcher")
	waited := time.Since(left)
	last := evs[len(evs)-1]
	if last.Type != "error" || field[string](t, last, "code") != "cancelled" {
		t.Fatalf("the watcher's stream ended with %s %s, want the job's cancellation", last.Type, last.Data)
	}
	if waited < grace {
		t.Fatalf("cancelled %s after its client left, inside its %s grace window", waited, grace)
	}
	if d := field[string](t, last, "detail"); !strings.Contains(d, "grace") {
		t.Errorf("detail %q, want it to name the grace window", d)
	}
	if got := metric(t, n, "switchyard_stream_grace_saves_total", nil); got != 0 {
		t.Errorf("grace saves = %v, want 0: a watcher saved the job", got)
	}
}

// The node ending a POST's own stream (here at --stream-max-duration) told
// its client to resume: the job gets a grace window — the envelope's, or
// the node's max grace when it asked for none, as here — instead of being
// cancelled at once or left to run to its TTL. Not resumed, it is
// cancelled when the window ends; resumed, it goes on to the end.
func TestNodeEndedOwnerStreamGraceWindow(t *testing.T) {
	const maxDuration, maxGrace = 600 * time.Millisecond, 2 * time.Second
	n := MustStartNode(t, func(c *switchyard.Config) {
		c.Engine.Limits.MaxGrace = maxGrace
		c.HTTP.Stream.MaxDuration = maxDuration
		c.HTTP.Stream.Idle = 500 * time.Millisecond
		c.HTTP.Stream.Heartbeat = 100 * time.Millisecond
		c.HTTP.Stream.Setup = 200 * time.Millisecond
		c.HTTP.Stream.WriteTimeout = 200 * time.Millisecond
	})
	g := newGatedWorker()
	MustStartWorker(t, n, worker.Config{Concurrency: 2}, g.handler(50*time.Millisecond))
	const envelope = `{"input":"x","ttl_ms":30000}`

	// open POSTs a job and reads its stream to the end: the node ends it.
	// Reading to EOF means the node's handler returned, so the window has
	// started.
	open := func() (string, []sse.Event, time.Time) {
		t.Helper()
		sent := time.Now()
		res := post(t.Context(), t, n, "demo", envelope, true)
		defer res.Body.Close()
		evs := readUntilEnd(t, res, 10*time.Second, "the POST's stream")
		last := evs[len(evs)-1]
		if last.Type != "terminated" || field[string](t, last, "reason") != "max_duration" {
			t.Fatalf("the POST's stream ended with %s %s, want terminated at max_duration", last.Type, last.Data)
		}
		return res.Header.Get("X-Job-Id"), evs, sent
	}

	t.Run("not resumed", func(t *testing.T) {
		id, _, sent := open()
		var view struct{ State, Code, Detail string }
		waitFor(t, 15*time.Second, "the job to be cancelled", func() bool {
			getJSON(t, baseURL(n)+"/v1/jobs/"+id, &view)
			return view.State != "running" && view.State != "queued" && view.State != "offered"
		})
		waited := time.Since(sent)
		if view.State != "cancelled" || view.Code != "cancelled" || !strings.Contains(view.Detail, "grace") {
			t.Fatalf("job %+v, want cancelled for not resuming within the grace window", view)
		}
		// The stream opened after sent and lasted maxDuration; the window
		// started after that.
		if waited < maxDuration+maxGrace {
			t.Fatalf("cancelled %s after the POST: before max duration (%s) plus the window (%s)", waited, maxDuration, maxGrace)
		}
	})

	t.Run("resumed", func(t *testing.T) {
		saves := metric(t, n, "switchyard_stream_grace_saves_total", nil)
		id, evs, _ := open()
		var seqs []uint64
		lastID := ""
		collect := func(evs []sse.Event) {
			for _, ev := range evs {
				switch ev.Type {
				case "accepted", "output", "done", "error":
					seqs = append(seqs, field[uint64](t, ev, "seq"))
					lastID = ev.LastEventID
				}
			}
		}
		collect(evs)
		// Resume as an EventSource would, each time the node ends the
		// stream; release the job once the first resume is reading. Each
		// resume comes after the node ended the stream before it (read to
		// EOF), inside its window: each is a save.
		resumes := 0
		for i := 0; ; i++ {
			if i == 10 {
				t.Fatalf("still no terminal event after %d resumes: %v", i, seqs)
			}
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, baseURL(n)+"/v1/jobs/"+id+"/events", nil)
			req.Header.Set("Last-Event-ID", lastID)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if res.StatusCode != http.StatusOK {
				t.Fatalf("resume: %d", res.StatusCode)
			}
			resumes++
			if i == 0 {
				g.release(id)
			}
			evs := readUntilEnd(t, res, 10*time.Second, "the resumed stream")
			res.Body.Close()
			collect(evs)
			if last := evs[len(evs)-1]; last.Type == "done" {
				break
			} else if last.Type != "terminated" {
				t.Fatalf("resumed stream ended with %s %s", last.Type, last.Data)
			}
		}
		for i, s := range seqs {
			if s != uint64(i+1) {
				t.Fatalf("position %d has seq %d across the streams (a gap or a duplicate): %v", i, s, seqs)
			}
		}
		var view struct{ State string }
		getJSON(t, baseURL(n)+"/v1/jobs/"+id, &view)
		if view.State != "completed" {
			t.Fatalf("resumed job is %s, want completed", view.State)
		}
		if got := metric(t, n, "switchyard_stream_grace_saves_total", nil); got != saves+float64(resumes) {
			t.Errorf("grace saves = %v after %d resumes, want %v", got, resumes, saves+float64(resumes))
		}
	})
}

// A stream that opted into drop-oldest (?slow=drop-oldest) is never
// terminated for falling behind: it skips ahead, and each gap event names
// exactly the seqs the client then does not get — from_seq is the one after
// the last event received, to_seq the one before the next, dropped their
// count — as TestGRPCDropOldest checks for gRPC.
func TestSSEDropOldestGapsMatchMissing(t *testing.T) {
	const outputs = 3000
	n := MustStartNode(t, func(c *switchyard.Config) {
		c.HTTP.Stream.MaxLagEvents = 64
		c.HTTP.Stream.MaxLagBytes = 128 << 20
		c.Engine.HistoryEvents = 50000
		c.Engine.HistoryBytes = 256 << 20
		c.Engine.RetainBytes = c.Engine.HistoryBytes
		c.Engine.Limits.MaxOutputBytes = 256 << 20
	})
	start := make(chan struct{})
	MustStartWorker(t, n, worker.Config{}, burstWorker(outputs, 1<<10, start))
	res := post(t.Context(), t, n, "demo", `{"input":"x","ttl_ms":30000}`, false)
	var job struct {
		JobID string `json:"job_id"`
	}
	decode(t, res, &job)

	// A small receive buffer, so that reading slowly holds the node's
	// writer back instead of the kernel taking the whole burst.
	client := &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{
		Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			if err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 32<<10) }); err != nil {
				return err
			}
			return serr
		},
	}).DialContext}}
	defer client.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, baseURL(n)+"/v1/jobs/"+job.JobID+"/events?slow=drop-oldest", nil)
	sres, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer sres.Body.Close()
	if sres.StatusCode != http.StatusOK {
		t.Fatalf("GET: %d", sres.StatusCode)
	}
	next, gaps, dropped, started := uint64(1), 0, 0, false
	for ev, err := range sse.Read(sres.Body, nil) {
		if err != nil {
			t.Fatalf("drop-oldest stream at seq %d: %v", next, err)
		}
		switch ev.Type {
		case "gap":
			from, to := field[uint64](t, ev, "from_seq"), field[uint64](t, ev, "to_seq")
			if from != next || to < from || field[uint64](t, ev, "dropped") != to-from+1 {
				t.Fatalf("gap %s where the next event due was %d", ev.Data, next)
			}
			gaps++
			dropped += int(to - from + 1)
			next = to + 1
		case "accepted", "output", "done":
			if seq := field[uint64](t, ev, "seq"); seq != next {
				t.Fatalf("%s seq %d, want %d: events went missing without a gap that says so", ev.Type, seq, next)
			}
			next++
		default:
			t.Fatalf("drop-oldest stream got %s %s", ev.Type, ev.Data)
		}
		if !started {
			started = true
			close(start)
		}
		time.Sleep(time.Millisecond)
	}
	if next != outputs+3 || gaps == 0 {
		t.Fatalf("stream ended before seq %d (next due %d) with %d gaps", outputs+2, next, gaps)
	}
	t.Logf("%d gaps, %d of %d events dropped", gaps, dropped, outputs+2)
	if got := metric(t, n, "switchyard_stream_drop_oldest_gaps_total", map[string]string{"transport": "sse"}); got != float64(gaps) {
		t.Errorf("gaps counted %v, seen %d", got, gaps)
	}
}

// A silent job still shows its stream alive: heartbeat comments at the
// interval.
func TestHeartbeatOnSilentJob(t *testing.T) {
	n := MustStartNode(t, func(c *switchyard.Config) {
		c.HTTP.Stream.Heartbeat = 100 * time.Millisecond
		c.HTTP.Stream.Idle = 5 * time.Second
		c.HTTP.Stream.Setup = time.Second
		c.HTTP.Stream.WriteTimeout = time.Second
	})
	MustStartWorker(t, n, worker.Config{}, func(ctx context.Context, _ *worker.Job, _ *worker.Output) (any, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	ctx, cancel := context.WithTimeout(t.Context(), 650*time.Millisecond)
	defer cancel()
	res := post(ctx, t, n, "demo", `{"input":"x"}`, true)
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body) // until the deadline cuts it
	beats := strings.Count(string(b), ": heartbeat\n")
	t.Logf("%d heartbeats in 650ms at a 100ms interval", beats)
	if beats < 3 {
		t.Fatalf("%d heartbeats in 650ms with a 100ms interval:\n%s", beats, b)
	}
	if evs := readAll(t, strings.NewReader(string(b))); len(evs) != 1 || evs[0].Type != "accepted" {
		t.Fatalf("heartbeats must not be events: %v", types(evs))
	}
}

// flipByte changes s's byte i to another base64url character: a token
// tampered with in one place.
func flipByte(s string, i int) string {
	b := []byte(s)
	if b[i] == 'A' {
		b[i] = 'B'
	} else {
		b[i] = 'A'
	}
	return string(b)
}
