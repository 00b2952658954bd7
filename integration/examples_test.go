package integration_test

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/internal/syncbuf"
	"github.com/switchyard/switchyard/openapi/client"
)

// The example workers (examples/worker.sh, in sh and curl; examples/
// worker.py, Python with its standard library) each run a job submitted
// from the generated client and honour a cancel: they stop producing and
// answer it, so their credit comes back and they are not dropped as
// stalled.
func TestExampleWorkers(t *testing.T) {
	t.Parallel()
	for _, ex := range []struct {
		name string
		cmd  []string
	}{
		{"sh", []string{"sh", "../examples/worker.sh"}},
		{"python", []string{"python3", "../examples/worker.py"}},
	} {
		t.Run(ex.name, func(t *testing.T) {
			if _, err := exec.LookPath(ex.cmd[0]); err != nil {
				if os.Getenv("CI") != "" {
					t.Fatalf("%s is missing, and CI runs every example: %v", ex.cmd[0], err)
				}
				t.Skipf("%s is not installed", ex.cmd[0])
			}
			// A node that checks keys: the example sends its key on its
			// session and on every post, the client its own.
			n := MustStartSecuredNode(t, nil)
			startExample(t, n, ex.cmd, "DELAY=0.1", "NAME=example-"+ex.name, "SWITCHYARD_API_KEY="+keyAliceWork)
			c := apiClientWithKey(t, n, keyAlice)

			// A job runs on it, streamed.
			res, err := c.SubmitJob(t.Context(), "demo", &client.SubmitJobParams{Accept: ptr("text/event-stream")},
				client.Envelope{Input: "one two three", TtlMs: ptr(20000)})
			if err != nil || res.StatusCode != 200 {
				t.Fatalf("submit: %v, %v", res, err)
			}
			evs := readAll(t, res.Body)
			res.Body.Close()
			var got []string
			for _, ev := range evs {
				if ev.Type == "output" {
					got = append(got, field[string](t, ev, "data"))
				}
			}
			if strings.Join(got, "") != "one two three " || evs[len(evs)-1].Type != "done" {
				t.Fatalf("events %v, output %q", types(evs), got)
			}

			// Every word comes through whole, whatever it holds: quotes,
			// backslashes, unicode (and words split at newlines and tabs).
			tricky := "say \"hi\" to C:\\path now\nüñï 😀 \\\"q\\\" {\"a\":1}\tend"
			res, err = c.SubmitJob(t.Context(), "demo", &client.SubmitJobParams{Accept: ptr("text/event-stream")},
				client.Envelope{Input: tricky, TtlMs: ptr(20000)})
			if err != nil || res.StatusCode != 200 {
				t.Fatalf("submit: %v, %v", res, err)
			}
			evs = readAll(t, res.Body)
			res.Body.Close()
			got = nil
			for _, ev := range evs {
				if ev.Type == "output" {
					got = append(got, field[string](t, ev, "data"))
				}
			}
			var want []string
			for _, w := range strings.Fields(tricky) {
				want = append(want, w+" ")
			}
			if !slices.Equal(got, want) || evs[len(evs)-1].Type != "done" {
				t.Fatalf("input %q: events %v, output %q, want %q", tricky, types(evs), got, want)
			}

			// A cancel stops the next one mid-way.
			long := strings.Repeat("word ", 100)
			sub, err := c.SubmitJobWithResponse(t.Context(), "demo", nil, client.Envelope{Input: long, TtlMs: ptr(30000)})
			mustStatus(t, "submit", sub.HTTPResponse, sub.Body, err, 202)
			id := sub.JSON202.JobId
			waitFor(t, 10*time.Second, "output from the example", func() bool {
				g, err := c.GetJobWithResponse(t.Context(), id)
				return err == nil && g.JSON200 != nil && g.JSON200.Outputs >= 2
			})
			cancel, err := c.CancelJobWithResponse(t.Context(), id)
			mustStatus(t, "cancel", cancel.HTTPResponse, cancel.Body, err, 200)
			if cancel.JSON200.State != "cancelled" {
				t.Fatalf("after cancel: %s", cancel.Body)
			}
			// The worker answered the cancel: its credit is back, so the
			// next job runs on it; it was never dropped as stalled.
			res, err = c.SubmitJob(t.Context(), "demo", &client.SubmitJobParams{Accept: ptr("text/event-stream")},
				client.Envelope{Input: "after", TtlMs: ptr(20000)})
			if err != nil || res.StatusCode != 200 {
				t.Fatalf("submit: %v, %v", res, err)
			}
			evs = readAll(t, res.Body)
			res.Body.Close()
			if last := evs[len(evs)-1]; last.Type != "done" || field[uint64](t, last, "attempt") != 1 {
				t.Fatalf("the job after the cancel: %v, last %s", types(evs), last.Data)
			}
			if s := metric(t, n, "switchyard_dispatch_stalls_total", nil); s != 0 {
				t.Errorf("stalls %v: the example did not answer the cancel", s)
			}
			g, err := c.GetJobWithResponse(t.Context(), id)
			mustStatus(t, "get", g.HTTPResponse, g.Body, err, 200)
			if outs := g.JSON200.Outputs; outs >= 100 {
				t.Errorf("the cancelled job has %d outputs: the example did not stop", outs)
			}
		})
	}
}

// startExample runs an example worker against n on queue demo, in its own
// process group so that every process it starts is killed with it, and
// waits until the node registered it.
func startExample(tb testing.TB, n *switchyard.Node, argv []string, env ...string) {
	tb.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), append([]string{"SWITCHYARD_URL=" + baseURL(n), "QUEUE=demo"}, env...)...)
	var out syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
		if tb.Failed() {
			tb.Logf("%s said:\n%s", argv[1], out.String())
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for metric(tb, n, "switchyard_workers_connected", nil) < 1 {
		if ctx.Err() != nil {
			tb.Fatalf("%s did not register in 10s:\n%s", argv[1], out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
