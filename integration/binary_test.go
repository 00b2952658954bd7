package integration_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestBinarySmoke builds the real binary, runs `switchyard node` and
// `switchyard worker --demo tokens` as separate processes, streams a job
// over HTTP, and checks that SIGTERM drains and exits cleanly.
func TestBinarySmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "switchyard")
	build := exec.Command("go", "build", "-o", bin, "../cmd/switchyard")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}

	node := exec.Command(bin, "node", "--name", "smoke", "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0",
		"--data-dir", filepath.Join(dir, "data"), "--drain-timeout", "3s")
	stderr, err := node.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	defer node.Process.Kill() //nolint:errcheck // no-op once it exited
	httpAddr, grpcAddr, logs := awaitServing(t, stderr)

	wk := exec.Command(bin, "worker", "--server", grpcAddr, "--queue", "demo", "--demo", "tokens", "--delay", "5ms")
	wout := &strings.Builder{}
	wk.Stderr = wout
	if err := wk.Start(); err != nil {
		t.Fatal(err)
	}
	defer wk.Process.Kill() //nolint:errcheck // no-op once it exited

	// The worker registers asynchronously: the node answers 503 until then.
	var res *http.Response
	waitFor(t, 10*time.Second, "a capable worker", func() bool {
		req, _ := http.NewRequest(http.MethodPost, "http://"+httpAddr+"/v1/queues/demo/jobs", strings.NewReader(`{"input":"hello smoke test"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "text/event-stream")
		r, err := http.DefaultClient.Do(req)
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
	evs := readAll(t, res.Body)
	res.Body.Close()
	if got := types(evs); !slices.Equal(got, []string{"accepted", "output", "output", "output", "done"}) {
		t.Fatalf("events %v", got)
	}

	if err := wk.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := node.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- node.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("node exit: %v\n%s", err, logs())
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("node did not exit after SIGTERM\n%s", logs())
	}
	_ = wk.Wait()
	if !strings.Contains(wout.String(), "job ended") {
		t.Errorf("worker log lacks the job:\n%s", wout)
	}
}

var servingLine = regexp.MustCompile(`msg="node serving".* http=(\S+) grpc=(\S+)`)

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
						return strings.Join(append(all, rest...), "\n")
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

var _ = context.Background
