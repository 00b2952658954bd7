package integration_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/switchyard/switchyard/worker"
)

// The real binary: a node without keys refuses a non-loopback address,
// naming both ways out, and starts with --allow-anonymous, warning; a node
// with keys rotates them on SIGHUP — the old key refused, the new one
// taken, a stream opened with the old one unaffected — and keeps them when
// the file it re-reads is broken.
func TestBinaryAccess(t *testing.T) {
	t.Parallel()
	bin := buildOrSkip(t, "builds the binary")
	t.Run("non-loopback without keys", func(t *testing.T) {
		out, err := exec.Command(bin, "node", "--name", "exposed", "--http-addr", "0.0.0.0:0", "--grpc-addr", "127.0.0.1:0",
			"--data-dir", t.TempDir()).CombinedOutput()
		if err == nil {
			t.Fatalf("started:\n%s", out)
		}
		for _, want := range []string{"--http-addr", "--auth-file", "--allow-anonymous"} {
			if !strings.Contains(string(out), want) {
				t.Errorf("the refusal does not name %s:\n%s", want, out)
			}
		}
		n := launchProc(t, procSpec{name: "anon", bin: bin, log: filepath.Join(t.TempDir(), "anon.log"), args: []string{
			"node", "--name", "anon", "--http-addr", "127.0.0.1:0", "--grpc-addr", "0.0.0.0:0", "--allow-anonymous",
			"--data-dir", t.TempDir()}})
		n.awaitServing(t, 30*time.Second)
		if log := n.ownLog(); !strings.Contains(log, "level=WARN") || !strings.Contains(log, "--allow-anonymous") {
			t.Errorf("no warning about anonymous calls from the network:\n%s", log)
		}
	})
	t.Run("external etcd over http warns", func(t *testing.T) {
		// No etcd answers there (a documentation address): the node warns
		// as it starts, then fails to open its catalog.
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		defer cancel()
		out, _ := exec.CommandContext(ctx, bin, "node", "--name", "plain", "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0",
			"--etcd-endpoints", "http://192.0.2.1:2379").CombinedOutput()
		if !regexp.MustCompile(`level=WARN msg="an external etcd endpoint over http: .*plaintext`).Match(out) {
			t.Errorf("no warning about a catalog in plaintext:\n%s", out)
		}
	})
	t.Run("SIGHUP rotates keys", func(t *testing.T) {
		path := writeKeys(t, accessKeys())
		n := launchProc(t, procSpec{name: "keys", bin: bin, log: filepath.Join(t.TempDir(), "keys.log"), args: []string{
			"node", "--name", "keys", "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--auth-file", path,
			"--data-dir", t.TempDir()}})
		n.awaitServing(t, 30*time.Second)
		stop := startKeyedProcWorker(t, n.grpc, keyAliceWork)
		defer stop()
		waitFor(t, 10*time.Second, "the worker registered", func() bool {
			res := keyed(t, t.Context(), "GET", "http://"+n.http+"/v1/queues/demo", keyRoot, "", "")
			return res.StatusCode == 200 && strings.Contains(string(readBody(t, res)), `"node":"keys"`)
		})
		jobs := "http://" + n.http + "/v1/queues/demo/jobs"
		// A stream opened with alice's key before the rotation.
		inFlight := keyed(t, t.Context(), "POST", jobs, keyAlice, "application/json",
			`{"input":"one two three four five six seven eight","ttl_ms":30000,"options":{"delay_ms":150}}`, "Accept", "text/event-stream")
		defer inFlight.Body.Close()
		if inFlight.StatusCode != 200 {
			t.Fatalf("stream before the rotation: %d %s", inFlight.StatusCode, readBody(t, inFlight))
		}

		const newKey = "alice-rotated-key-0000009"
		if err := writeKeyFile(path, strings.Replace(accessKeys(), keyAlice, newKey, 1)); err != nil {
			t.Fatal(err)
		}
		n.signal(syscall.SIGHUP)
		waitFor(t, 10*time.Second, "the second keys loaded line", func() bool { return strings.Count(n.ownLog(), "api keys loaded") == 2 })
		post := func(key string) int {
			res := keyed(t, t.Context(), "POST", jobs, key, "application/json", `{"input":"x","ttl_ms":5000}`)
			readBody(t, res)
			return res.StatusCode
		}
		if got := post(keyAlice); got != 401 {
			t.Errorf("the old key after SIGHUP: %d, want 401", got)
		}
		if got := post(newKey); got != 202 {
			t.Errorf("the new key after SIGHUP: %d, want 202", got)
		}
		evs := readAll(t, inFlight.Body)
		if last := evs[len(evs)-1]; last.Type != "done" || len(evs) != 10 {
			t.Errorf("the stream opened before the rotation: %v", types(evs))
		}

		if err := writeKeyFile(path, "keys: [ this is not yaml"); err != nil {
			t.Fatal(err)
		}
		n.signal(syscall.SIGHUP)
		waitFor(t, 10*time.Second, "the reload refused", func() bool { return strings.Contains(n.ownLog(), "api keys not reloaded") })
		if got := post(newKey); got != 202 {
			t.Errorf("after a broken file, the key in use: %d, want 202", got)
		}
		if log := n.ownLog(); strings.Contains(log, newKey) || strings.Contains(log, keyAliceWork) {
			t.Errorf("a key in the node's log")
		}
	})
}

// startKeyedProcWorker runs an SDK worker (tokens) on demo against a process
// node's gRPC address, with key.
func startKeyedProcWorker(t *testing.T, addr, key string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = worker.Run(ctx, worker.Config{Server: addr, Queue: "demo", Capabilities: []string{"model=demo"}, Concurrency: 4,
			DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), worker.APIKey(key)}}, worker.Tokens(0))
	}()
	return func() { cancel(); <-done }
}
