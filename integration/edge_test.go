package integration_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/switchyard/switchyard/internal/ticktest"
)

// edgeBodyTimeout is the node's --http-body-timeout in TestHTTPEdge: short,
// so the test takes seconds, not the default's 30s per case. The header
// timeout is the default (10s).
const edgeBodyTimeout = 5 * time.Second

// edgeEnvelope is a valid job: if any edge case let it through, the demo
// worker would run it.
const edgeEnvelope = `{"input":"edge case"}`

// TestHTTPEdge runs the real binary (`switchyard demo`) and plays clients
// that abuse the HTTP edge: a body trickled a byte a second, a body that
// stops, a 1 MB header, and 200 slowloris connections trickling their
// headers while a normal job streams. Each case prints its answer and the
// time it took; each asserts the answer and that no job was created (the
// case's Idempotency-Key is still unused afterwards). The times are
// printed, not asserted, except for generous bounds that show the cut
// happened.
func TestHTTPEdge(t *testing.T) {
	t.Parallel()
	bin := buildOrSkip(t, "builds the binary")
	demo := exec.Command(bin, "demo", "--name", "edge", "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0",
		"--data-dir", filepath.Join(t.TempDir(), "data"), "--delay", "1ms", "--http-body-timeout", edgeBodyTimeout.String())
	httpAddr, _, logs := startServing(t, demo)
	defer func() {
		_ = demo.Process.Signal(syscall.SIGINT)
		_ = demo.Wait()
	}()
	jobsURL := "http://" + httpAddr + "/v1/queues/demo/jobs"
	res := streamOnceServed(t, jobsURL, edgeEnvelope) // the demo worker is attached
	readAll(t, res.Body)
	res.Body.Close()

	var table []string
	record := func(name, answer string, took time.Duration) {
		table = append(table, fmt.Sprintf("%-44s %-34s %v", name, answer, took.Round(time.Millisecond)))
	}
	defer func() {
		t.Logf("HTTP edge (body timeout %v, header timeout 10s):\n%s", edgeBodyTimeout, strings.Join(table, "\n"))
	}()

	t.Run("trickled body", func(t *testing.T) {
		before := jobsTotal(t, httpAddr)
		c := dialEdge(t, httpAddr)
		start := time.Now()
		writeEdge(t, c, edgeHead("POST", "edge-trickle", len(edgeEnvelope)))
		stop := trickle(c, []byte(edgeEnvelope), time.Second)
		status, code, took := readAnswer(c, start, 60*time.Second)
		stop()
		record("body trickled at 1 byte/s", status+" "+code, took)
		if status != "408" || code != "request_timeout" {
			t.Fatalf("answer %s %s, want 408 request_timeout\n%s", status, code, logs())
		}
		if took < edgeBodyTimeout || took > 6*edgeBodyTimeout {
			t.Errorf("answered after %v, want about the body timeout %v", took, edgeBodyTimeout)
		}
		wantNoJob(t, httpAddr, "edge-trickle", before)
	})

	t.Run("stalled body", func(t *testing.T) {
		before := jobsTotal(t, httpAddr)
		c := dialEdge(t, httpAddr)
		start := time.Now()
		writeEdge(t, c, edgeHead("POST", "edge-stall", len(edgeEnvelope))+edgeEnvelope[:len(edgeEnvelope)/2])
		status, code, took := readAnswer(c, start, 70*time.Second)
		record("body stalled halfway", status+" "+code, took)
		if status != "408" || code != "request_timeout" {
			t.Fatalf("answer %s %s, want 408 request_timeout\n%s", status, code, logs())
		}
		if took > 6*edgeBodyTimeout {
			t.Errorf("answered after %v: not well before 70s", took)
		}
		wantNoJob(t, httpAddr, "edge-stall", before)
	})

	t.Run("1 MB header", func(t *testing.T) {
		before := jobsTotal(t, httpAddr)
		c := dialEdge(t, httpAddr)
		start := time.Now()
		head := edgeHead("POST", "edge-header", len(edgeEnvelope))
		big := "X-Big: " + strings.Repeat("a", 1<<20) + "\r\n"
		// Written while the answer is read: the node answers (and closes)
		// before it has taken the whole header.
		go func() { _, _ = io.WriteString(c, strings.Replace(head, "\r\n\r\n", "\r\n"+big+"\r\n", 1)+edgeEnvelope) }()
		status, _, took := readAnswer(c, start, 30*time.Second)
		record("1 MB request header", status, took)
		if status != "431" {
			t.Fatalf("answer %s, want 431\n%s", status, logs())
		}
		wantNoJob(t, httpAddr, "edge-header", before)
	})

	t.Run("200 slowloris connections", func(t *testing.T) {
		const n = 200
		before := jobsTotal(t, httpAddr)
		baseline := timeJob(t, jobsURL)
		record("a normal streamed job, alone", "200 done", baseline)

		start := time.Now()
		results := make([]loris, n)
		var wg sync.WaitGroup
		for i := range n {
			c := dialEdge(t, httpAddr)
			// The request line and a first header, then a header trickled
			// a byte a second that never ends.
			writeEdge(t, c, "POST /v1/queues/demo/jobs HTTP/1.1\r\nHost: edge\r\nIdempotency-Key: edge-loris-"+strconv.Itoa(i)+"\r\nX-Slow: ")
			wg.Go(func() { results[i] = slowloris(c, start, 60*time.Second) })
		}
		during := timeJob(t, jobsURL)
		record(fmt.Sprintf("a normal streamed job, %d slowloris open", n), "200 done", during)
		wg.Wait()

		var closed []time.Duration
		for i, r := range results {
			if r.answer != "" || !r.closed {
				t.Errorf("slowloris %d: answer %q, closed %v after %v; want closed without an answer", i, r.answer, r.closed, r.took)
				continue
			}
			closed = append(closed, r.took)
		}
		if len(closed) == 0 {
			t.FailNow()
		}
		slices.Sort(closed)
		record(fmt.Sprintf("%d slowloris header trickles", n), fmt.Sprintf("closed, no answer (%d of %d)", len(closed), n),
			closed[len(closed)-1])
		t.Logf("slowloris closed after: first %v, median %v, last %v", closed[0].Round(time.Millisecond),
			closed[len(closed)/2].Round(time.Millisecond), closed[len(closed)-1].Round(time.Millisecond))
		if last := closed[len(closed)-1]; last > 40*time.Second {
			t.Errorf("the last slowloris connection was closed after %v: the header timeout is 10s", last)
		}
		// The two normal jobs, and nothing of the slowloris requests.
		waitFor(t, 10*time.Second, "the normal jobs counted", func() bool { return jobsTotal(t, httpAddr) >= before+2 })
		// Each probe of a key creates one job and waits for its end.
		for k, i := range []int{0, n / 2, n - 1} {
			wantNoJob(t, httpAddr, "edge-loris-"+strconv.Itoa(i), before+2+float64(k))
		}
	})
}

func dialEdge(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func writeEdge(t *testing.T, c net.Conn, s string) {
	t.Helper()
	if _, err := io.WriteString(c, s); err != nil {
		t.Fatal(err)
	}
}

// edgeHead is the head of a job POST with a body of n bytes.
func edgeHead(method, key string, n int) string {
	return method + " /v1/queues/demo/jobs HTTP/1.1\r\nHost: edge\r\nContent-Type: application/json\r\n" +
		"Accept: text/event-stream\r\nIdempotency-Key: " + key + "\r\nContent-Length: " + strconv.Itoa(n) + "\r\n\r\n"
}

// trickle writes b one byte per every, until it is all written, a write
// fails, or stop is called.
func trickle(c net.Conn, b []byte, every time.Duration) (stop func()) {
	i := 0
	return ticktest.Every(every, func() bool {
		_, err := c.Write(b[i : i+1])
		i++
		return err == nil && i < len(b)
	})
}

// readAnswer reads the response on c: its status and problem code, or
// "closed" when the node closed the connection without one, and the time
// since start.
func readAnswer(c net.Conn, start time.Time, bound time.Duration) (status, code string, took time.Duration) {
	_ = c.SetReadDeadline(start.Add(bound))
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	took = time.Since(start)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return "no answer within " + bound.String(), "", took
		}
		return "closed", "", took
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	if i := strings.Index(string(body), `"code":"`); i >= 0 {
		code, _, _ = strings.Cut(string(body[i+len(`"code":"`):]), `"`)
	}
	return strconv.Itoa(res.StatusCode), code, took
}

// loris is what one slowloris connection saw: an answer (none expected),
// whether the node closed it, and when.
type loris struct {
	answer string
	closed bool
	took   time.Duration
}

// slowloris trickles a header a byte a second on c until the node closes
// the connection, or bound passes.
func slowloris(c net.Conn, start time.Time, bound time.Duration) loris {
	buf := make([]byte, 512)
	for time.Since(start) < bound {
		if _, err := c.Write([]byte("a")); err != nil {
			return loris{closed: true, took: time.Since(start)}
		}
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		n, err := c.Read(buf)
		if n > 0 {
			return loris{answer: string(buf[:n]), took: time.Since(start)}
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			continue
		}
		return loris{closed: true, took: time.Since(start)}
	}
	return loris{took: time.Since(start)}
}

// timeJob streams a five-word job to its done event and returns how long
// that took.
func timeJob(t *testing.T, jobsURL string) time.Duration {
	t.Helper()
	start := time.Now()
	res := mustStream(t.Context(), t, jobsURL, `{"input":"one two three four five"}`)
	defer res.Body.Close()
	evs := readAll(t, res.Body)
	if got := types(evs); len(got) == 0 || got[len(got)-1] != "done" {
		t.Fatalf("normal job events %v, want it done", got)
	}
	return time.Since(start)
}

// jobsTotal is the node's switchyard_jobs_total summed over outcomes.
func jobsTotal(t *testing.T, httpAddr string) float64 {
	t.Helper()
	res, err := http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var sum float64
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "switchyard_jobs_total{") {
			v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			if err != nil {
				t.Fatalf("metrics line %q: %v", line, err)
			}
			sum += v
		}
	}
	return sum
}

// wantNoJob checks that a refused request created no job: no job ended
// since before, and its idempotency key was never used (a POST with it
// now creates a job: 202, where a used key would answer 200). It waits for
// the job that POST created to end, so the next case counts from a still
// node.
func wantNoJob(t *testing.T, httpAddr, key string, before float64) {
	t.Helper()
	if got := jobsTotal(t, httpAddr); got != before {
		t.Errorf("jobs_total moved from %v to %v", before, got)
	}
	req, _ := http.NewRequest(http.MethodPost, "http://"+httpAddr+"/v1/queues/demo/jobs", strings.NewReader(edgeEnvelope))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var job struct {
		JobID string `json:"job_id"`
	}
	err = json.NewDecoder(res.Body).Decode(&job)
	res.Body.Close()
	if res.StatusCode != http.StatusAccepted || err != nil {
		t.Fatalf("POST with key %s after the case: %d (%v), want 202 (a new job: the key was never used)", key, res.StatusCode, err)
	}
	waitFor(t, 10*time.Second, "the probe job to end", func() bool {
		var v struct {
			Outcome string `json:"outcome"`
		}
		return getJSON(t, "http://"+httpAddr+"/v1/jobs/"+job.JobID, &v) == http.StatusOK && v.Outcome != ""
	})
}

// A connection that never sent a request does not hold a node's shutdown:
// http.Server.Shutdown alone counts it as active for 5 seconds, past the
// node's 2s bound, and Close failed ("shut down http: context deadline
// exceeded") whenever an HTTP client had dialed one connection more than
// it used.
func TestCloseWithAConnectionThatSentNothing(t *testing.T) {
	n := MustStartNode(t, nil)
	conn, err := net.Dial("tcp", n.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	time.Sleep(50 * time.Millisecond) // the server has accepted it
	if err := n.Close(t.Context()); err != nil {
		t.Fatalf("close with an unused connection open: %v", err)
	}
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("the unused connection after Close: read %v, want it closed by the node", err)
	}
}
