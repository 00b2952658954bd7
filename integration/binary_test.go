package integration_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	sse "github.com/tmaxmax/go-sse"

	"github.com/switchyard/switchyard/internal/syncbuf"
)

// TestBinarySmoke builds the real binary and runs it as separate processes:
// `switchyard node` with `switchyard worker --demo tokens` (a job streams
// end to end; a client that leaves cancels its job on the worker; SIGTERM
// drains, ends a job that outlives the drain with node_shutdown, and exits
// 0), and `switchyard demo` (Ctrl-C stops it without a reconnect warning).
func TestBinarySmoke(t *testing.T) {
	t.Parallel()
	bin := buildOrSkip(t, "builds the binary")
	t.Run("node and worker", func(t *testing.T) { testBinaryNodeAndWorker(t, bin) })
	t.Run("demo stops quietly", func(t *testing.T) { testBinaryDemoStops(t, bin) })
}

// longInput takes the demo worker at least 6s (60 words, 100ms before
// each): far longer than the node's 1s drain window, so the drain cannot
// see it finish however slow or fast the machine is.
var longInput = `{"input":"` + strings.TrimSpace(strings.Repeat("word ", 60)) + `"}`

func testBinaryNodeAndWorker(t *testing.T, bin string) {
	dir := t.TempDir()
	node := exec.Command(bin, "node", "--name", "smoke", "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0",
		"--data-dir", filepath.Join(dir, "data"), "--drain-timeout", "1s")
	httpAddr, grpcAddr, logs := startServing(t, node)
	jobsURL := "http://" + httpAddr + "/v1/queues/demo/jobs"

	wk, wlog := startDemoWorker(t, bin, grpcAddr, "demo", "100ms")

	// The worker registers asynchronously: the node answers 503 until then.
	res := streamOnceServed(t, jobsURL, `{"input":"hello smoke test"}`)
	evs := readAll(t, res.Body)
	res.Body.Close()
	if got := types(evs); !slices.Equal(got, []string{"accepted", "output", "output", "output", "done"}) {
		t.Fatalf("events %v", got)
	}

	// The README's "done means": a client that leaves mid-job (Ctrl-C on
	// curl) cancels the job, and the worker's log says so.
	ctx, leave := context.WithCancel(t.Context())
	res = mustStream(ctx, t, jobsURL, longInput)
	id := res.Header.Get("X-Job-Id")
	for ev, err := range sse.Read(res.Body, nil) {
		if err != nil {
			t.Fatalf("read the stream before leaving: %v", err)
		}
		if ev.Type == "output" {
			break // running on the worker
		}
	}
	leave()
	res.Body.Close()
	cancelled := regexp.MustCompile(`msg="job cancelled".* job=` + regexp.QuoteMeta(id) + `\b`)
	waitFor(t, 10*time.Second, "the worker to log the job cancelled", func() bool { return cancelled.MatchString(wlog.String()) })

	// SIGTERM with a job running: the node stops taking jobs, the drain
	// window passes, and the job's stream ends with exactly one terminal
	// event, error node_shutdown; then the node exits 0.
	res = mustStream(t.Context(), t, jobsURL, longInput)
	defer res.Body.Close()
	evs = nil
	signalled := false
	for ev, err := range sse.Read(res.Body, nil) {
		if err != nil {
			t.Fatalf("read the draining stream: %v\nevents so far %v", err, types(evs))
		}
		evs = append(evs, ev)
		if ev.Type == "output" && !signalled {
			signalled = true
			if err := node.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
		}
	}
	var terminal []sse.Event
	for _, ev := range evs {
		if ev.Type == "done" || ev.Type == "error" {
			terminal = append(terminal, ev)
		}
	}
	if len(terminal) != 1 || terminal[0].Type != "error" || field[string](t, terminal[0], "code") != "node_shutdown" {
		t.Fatalf("drained stream %v, want it to end with one terminal event, error node_shutdown\n%s", types(evs), logs())
	}
	awaitExit(t, node, "node", "SIGTERM", logs)

	if err := wk.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := wk.Wait(); err != nil {
		t.Errorf("worker exit: %v\n%s", err, wlog)
	}
	if !strings.Contains(wlog.String(), `msg="job ended"`) {
		t.Errorf("worker log lacks the jobs:\n%s", wlog)
	}
}

// `switchyard demo` (make run) serves the README's curl examples; it drains
// its node with the demo worker still attached, then stops the worker before the node ends the worker's
// stream: Ctrl-C shows no "reconnecting" warning, and it exits 0.
func testBinaryDemoStops(t *testing.T, bin string) {
	demo := exec.Command(bin, "demo", "--name", "demo", "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0",
		"--data-dir", filepath.Join(t.TempDir(), "data"), "--delay", "1ms")
	httpAddr, _, logs := startServing(t, demo)

	// A job proves the worker attached before the signal.
	res := streamOnceServed(t, "http://"+httpAddr+"/v1/queues/demo/jobs", `{"input":"hi"}`)
	evs := readAll(t, res.Body)
	res.Body.Close()
	if got := types(evs); !slices.Equal(got, []string{"accepted", "output", "done"}) {
		t.Fatalf("events %v", got)
	}
	// The README's first examples, as a newcomer pastes them after make run.
	runReadmeExamples(t, httpAddr)

	if err := demo.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	awaitExit(t, demo, "demo", "SIGINT", logs)
	all := logs()
	if !strings.Contains(all, `msg="worker stopped" system=demo-worker`) || strings.Contains(all, "reconnecting") {
		t.Errorf("want the demo worker stopped without a reconnect warning:\n%s", all)
	}
}

// postStream posts body as a job and asks for its event stream.
func postStream(ctx context.Context, url, body string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	return http.DefaultClient.Do(req)
}

// mustStream is postStream that fails the test unless the stream opened.
func mustStream(ctx context.Context, tb testing.TB, url, body string) *http.Response {
	tb.Helper()
	res, err := postStream(ctx, url, body)
	if err != nil {
		tb.Fatalf("post %s: %v", url, err)
	}
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		tb.Fatalf("post %s: %d %s", url, res.StatusCode, b)
	}
	return res
}

var servingLine = regexp.MustCompile(`msg="node serving".* http=(\S+) grpc=(\S+)`)

// startDemoWorker starts `switchyard worker --demo tokens` against the
// gRPC address server, for queue, with delay before each output. Its log
// collects in wlog; it is killed when the test ends, if it has not exited.
func startDemoWorker(t *testing.T, bin, server, queue, delay string) (wk *exec.Cmd, wlog *syncbuf.Buffer) {
	t.Helper()
	wk = exec.Command(bin, "worker", "--server", server, "--queue", queue, "--demo", "tokens", "--delay", delay)
	wlog = &syncbuf.Buffer{}
	wk.Stderr = wlog
	if err := wk.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = wk.Process.Kill(); _ = wk.Wait() })
	return wk, wlog
}

// awaitExit waits up to 15s for cmd (what: "node") to exit after sig,
// and fails the test, with the process's logs, unless it exits 0.
func awaitExit(t *testing.T, cmd *exec.Cmd, what, sig string, logs func() string) {
	t.Helper()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("%s exit: %v\n%s", what, err, logs())
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("%s did not exit after %s\n%s", what, sig, logs())
	}
}

// startServing starts cmd, a node (or demo) process, and waits until it
// logs its bound addresses (awaitServing). The process is killed when the
// test ends, if it has not exited by then.
func startServing(t *testing.T, cmd *exec.Cmd) (httpAddr, grpcAddr string, logs func() string) {
	t.Helper()
	// A pipe of our own, not cmd.StderrPipe: Wait closes that one as soon
	// as the process exits, and the lines a busy machine has not read by
	// then (the shutdown's, which the tests check) would be lost. This one
	// ends, for its reader, when the process's copy of its write end closes.
	stderr, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stderr.Close() })
	cmd.Stderr = w
	err = cmd.Start()
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() }) // no-op once it exited
	return awaitServing(t, stderr)
}

// awaitServing reads the node's log until the line that names the bound
// addresses; it keeps draining the log afterwards so the node never blocks.
func awaitServing(t *testing.T, r io.Reader) (httpAddr, grpcAddr string, logs func() string) {
	t.Helper()
	var buf strings.Builder
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	deadline := time.After(30 * time.Second)
	var all []string
	ch := make(chan []string, 1)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("node exited before serving:\n%s", buf.String())
			}
			buf.WriteString(l + "\n")
			all = append(all, l)
			if m := servingLine.FindStringSubmatch(l); m != nil {
				go func() {
					rest := []string{}
					for l := range lines {
						rest = append(rest, l)
					}
					ch <- rest
				}()
				return m[1], m[2], func() string {
					select {
					case rest := <-ch:
						all = append(all, rest...)
						return strings.Join(all, "\n")
					case <-time.After(time.Second):
						return strings.Join(all, "\n")
					}
				}
			}
		case <-deadline:
			t.Fatalf("node did not log its addresses:\n%s", buf.String())
		}
	}
}

// streamOnceServed posts body to jobsURL as a stream until the node answers
// 200 (a worker registers asynchronously: 503 until then) and returns that
// response.
func streamOnceServed(t *testing.T, jobsURL, body string) *http.Response {
	t.Helper()
	var res *http.Response
	waitFor(t, 10*time.Second, "a capable worker", func() bool {
		r, err := postStream(context.Background(), jobsURL, body)
		if err != nil {
			return false
		}
		if r.StatusCode == http.StatusOK {
			res = r
			return true
		}
		r.Body.Close()
		return false
	})
	return res
}
