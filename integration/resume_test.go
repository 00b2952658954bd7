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
	"testing"
	"time"

	sse "github.com/tmaxmax/go-sse"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/peer/worker"
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

// Over many random disconnect points, the events a reconnecting client
// (go-sse, which resumes with Last-Event-ID like a browser) receives across
// all its connections are ordered, unique and gap-free.
func TestResumeAcrossRandomDisconnects(t *testing.T) {
	// go-sse honours the stream's retry: hint like a browser; a short one
	// keeps ~150 reconnects quick.
	n := MustStartNode(t, func(c *switchyard.Config) { c.HTTP.RetryHint = time.Millisecond })
	const outputs = 40
	MustStartWorker(t, n, worker.Config{Concurrency: 8}, func(ctx context.Context, job *worker.Job, out *worker.Output) (any, error) {
		for i := range outputs {
			if err := out.Send(ctx, fmt.Sprintf("token-%02d", i)); err != nil {
				return nil, err
			}
			time.Sleep(time.Millisecond)
		}
		return nil, nil
	})
	totalReconnects := 0
	for seed := range uint64(12) {
		proxy := startCuttingProxy(t, n.HTTPAddr(), seed, 150, 2500)
		res := post(t.Context(), t, n, "demo", `{"input":"x","ttl_ms":20000}`, false)
		var job struct {
			JobID string `json:"job_id"`
		}
		decode(t, res, &job)

		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+proxy.ln.Addr().String()+"/v1/jobs/"+job.JobID+"/events", nil)
		// No keep-alive: a pooled connection would hold the proxy's upstream
		// open after the test is done with it.
		client := &sse.Client{
			HTTPClient: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}},
			Backoff:    sse.Backoff{InitialInterval: time.Millisecond, Multiplier: 1, Jitter: -1},
		}
		conn := client.NewConnection(req)
		var seqs []uint64
		var mu sync.Mutex
		conn.SubscribeToAll(func(ev sse.Event) {
			mu.Lock()
			defer mu.Unlock()
			switch ev.Type {
			case "accepted", "output", "done", "error":
				seqs = append(seqs, field[uint64](t, ev, "seq"))
			default:
				t.Errorf("seed %d: unexpected %s event %s", seed, ev.Type, ev.Data)
			}
			if ev.Type == "done" || ev.Type == "error" {
				cancel()
			}
		})
		if err := conn.Connect(); err != nil && ctx.Err() == nil {
			t.Logf("seed %d: connect ended: %v", seed, err)
		}
		cancel()
		mu.Lock()
		for i, s := range seqs {
			if s != uint64(i+1) {
				t.Fatalf("seed %d: seq %v: position %d has %d (a gap or a duplicate)", seed, seqs, i, s)
			}
		}
		if len(seqs) != outputs+2 {
			t.Fatalf("seed %d: got %d events, want %d", seed, len(seqs), outputs+2)
		}
		mu.Unlock()
		totalReconnects += int(proxy.conns.Load()) - 1
	}
	if totalReconnects < 12 {
		t.Fatalf("only %d reconnects over all runs: the proxy did not cut enough to test anything", totalReconnects)
	}
	t.Logf("%d reconnects over 12 jobs; every stream ordered, unique, gap-free", totalReconnects)
	if got := metric(t, n, "switchyard_stream_resumes_accepted_total", map[string]string{"transport": "sse"}); got < float64(totalReconnects)/2 {
		t.Errorf("resumes accepted = %v for %d reconnects", got, totalReconnects)
	}
}

// Every bad token gets one identical answer; only the real one resumes.
func TestBadResumeTokensAllLookTheSame(t *testing.T) {
	n := MustStartNode(t, nil)
	MustStartWorker(t, n, worker.Config{}, worker.Tokens(0))
	streamed := func(auth string) (id string, evs []sse.Event) {
		req, _ := http.NewRequest(http.MethodPost, baseURL(n)+"/v1/queues/demo/jobs", strings.NewReader(`{"input":"a b c"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "text/event-stream")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
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
		req, _ := http.NewRequest(http.MethodGet, baseURL(n)+"/v1/jobs/"+job+"/events"+query, nil)
		if lastID != "" {
			req.Header.Set("Last-Event-ID", lastID)
		}
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
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

	flip := func(s string, i int) string {
		b := []byte(s)
		if b[i] == 'A' {
			b[i] = 'B'
		} else {
			b[i] = 'A'
		}
		return string(b)
	}
	dot := strings.Index(tok, ".")
	bad := map[string]struct{ job, tok, auth, query string }{
		"payload byte flipped": {id, flip(tok, dot+3), "Bearer alice", ""},
		"mac byte flipped":     {id, flip(tok, len(tok)-3), "Bearer alice", ""},
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

	// Resume inside the window: the job carries on to done.
	res, cancel, ev := open()
	id := res.Header.Get("X-Job-Id")
	cancel()
	res.Body.Close()
	time.Sleep(200 * time.Millisecond)
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
