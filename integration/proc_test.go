package integration_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Nodes as separate processes of the real binary, shared by the kill tests,
// the reply-leg tests and the fault suite (faults_*_test.go): a process can
// be killed with SIGKILL, paused with SIGSTOP and restarted under the same
// name, which an in-process node cannot.

// buildOrSkip skips the test in -short mode, with why (what it runs) as
// the reason; otherwise it builds cmd/switchyard for it (buildSwitchyard).
func buildOrSkip(t *testing.T, why string) string {
	t.Helper()
	if testing.Short() {
		t.Skip(why)
	}
	return buildSwitchyard(t)
}

// buildSwitchyard builds cmd/switchyard into a temporary directory.
func buildSwitchyard(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "switchyard")
	build := exec.Command("go", "build", "-o", bin, "../cmd/switchyard")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

// procSpec is how to run one node process.
type procSpec struct {
	name string
	bin  string
	args []string
	// wrap, if set, is the command the binary runs under (the fault suite's
	// `ip netns exec NS`, which execs the binary in place: signals reach it).
	wrap []string
	// log is the file the process writes to; a restart appends to it.
	log string
	// tailLines of the log are printed when the test fails (0: 150).
	tailLines int
}

// procNode is a node running as its own process. Its fields change on
// restart, which only the test's goroutine does.
type procNode struct {
	name, http, grpc string
	spec             procSpec
	cmd              *exec.Cmd
	log              string
	exited           chan struct{}
	// logStart is the log's size when the current process started: its own
	// lines begin there.
	logStart int64
}

// launchProc starts spec's process without waiting for it to serve (nodes
// of one etcd cluster must start together); awaitServing waits. The process
// is killed when the test ends, and its log's tail printed if the test
// failed (or SWITCHYARD_TEST_LOG is set).
func launchProc(t *testing.T, spec procSpec) *procNode {
	t.Helper()
	n := &procNode{name: spec.name, spec: spec, log: spec.log}
	if err := n.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.kill9()
		if t.Failed() || os.Getenv("SWITCHYARD_TEST_LOG") != "" {
			b, _ := os.ReadFile(n.log)
			lines := spec.tailLines
			if lines == 0 {
				lines = 150
			}
			t.Logf("log of %s:\n%s", n.name, tail(string(b), lines))
		}
	})
	return n
}

func (n *procNode) start() error {
	logf, err := os.OpenFile(n.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	// The child holds its own copy of the descriptor.
	defer logf.Close()
	st, err := logf.Stat()
	if err != nil {
		return err
	}
	argv := append(slices.Clone(n.spec.wrap), n.spec.bin)
	argv = append(argv, n.spec.args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", n.name, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	n.cmd, n.exited, n.logStart = cmd, exited, st.Size()
	return nil
}

// awaitServing waits for the current process's "node serving" line and
// takes its addresses from it.
func (n *procNode) awaitServing(t *testing.T, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		b := n.ownLog()
		if m := servingLine.FindStringSubmatch(b); m != nil {
			// Written only when they change: a process restarted on the
			// same addresses (the fault suite's restart) leaves them to the
			// observers that read them meanwhile, unsynchronised.
			if n.http != m[1] || n.grpc != m[2] {
				n.http, n.grpc = m[1], m[2]
			}
			return
		}
		select {
		case <-n.exited:
			t.Fatalf("node %s exited before serving:\n%s", n.name, tail(b, 50))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s did not log its addresses within %v:\n%s", n.name, timeout, tail(b, 50))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ownLog is what the current process wrote to the log.
func (n *procNode) ownLog() string {
	b, _ := os.ReadFile(n.log)
	if int64(len(b)) < n.logStart {
		return ""
	}
	return string(b[n.logStart:])
}

// kill9 sends SIGKILL (no-op once exited) and waits for the process to go. It
// returns the moment the signal was sent.
func (n *procNode) kill9() time.Time {
	at := time.Now()
	_ = n.cmd.Process.Signal(syscall.SIGKILL)
	<-n.exited
	return at
}

// signal sends sig and returns the moment it was sent.
func (n *procNode) signal(sig syscall.Signal) time.Time {
	at := time.Now()
	_ = n.cmd.Process.Signal(sig)
	return at
}

// terminate sends SIGTERM, as an operator's restart does, and waits up to
// timeout for the process to exit by itself (it is killed past that). It
// returns when the signal was sent, when the process exited, and its exit
// code (-1 when it had to be killed).
func (n *procNode) terminate(timeout time.Duration) (sent, exited time.Time, code int) {
	sent = n.signal(syscall.SIGTERM)
	select {
	case <-n.exited:
		return sent, time.Now(), n.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		n.kill9()
		return sent, time.Now(), -1
	}
}

// relaunch starts the process again with the same spec, after it exited;
// awaitServing waits for it to serve.
func (n *procNode) relaunch(t *testing.T) {
	t.Helper()
	if err := n.start(); err != nil {
		t.Fatal(err)
	}
}

// restart kills the process (SIGKILL, so nothing is handed over: its lease
// and records stay behind) and starts it again with the same spec: same
// name, data directory and addresses. It returns the moment of the kill,
// once the new process has started; awaitServing waits for it to serve.
func (n *procNode) restart(t *testing.T) time.Time {
	t.Helper()
	at := n.kill9()
	if err := n.start(); err != nil {
		t.Fatal(err)
	}
	return at
}

// procView is a node process's cluster view (/v1/cluster/nodes).
type procView struct {
	Nodes []procViewNode `json:"nodes"`
}

type procViewNode struct {
	ID       string `json:"id"`
	State    string `json:"state"`
	HTTPAddr string `json:"http_addr"`
	GRPCAddr string `json:"grpc_addr"`
	PeerAddr string `json:"peer_addr"`
}

// allOnline reads n's view into v and reports whether it holds size
// nodes, every one online.
func (v *procView) allOnline(n *procNode, size int) bool {
	*v = procView{}
	if procGetJSON(n, "/v1/cluster/nodes", v) != nil || len(v.Nodes) != size {
		return false
	}
	for _, nd := range v.Nodes {
		if nd.State != "online" {
			return false
		}
	}
	return true
}

// handedOut is every address freeAddr has returned in this process.
var handedOut = struct {
	sync.Mutex
	addrs map[string]bool
}{addrs: map[string]bool{}}

// freeAddr returns a loopback address with a port free a moment ago, and
// never one it returned before in this process: the kernel may give the
// same free port to two listens in a row, and a cluster laid out with one
// port twice fails to start (two etcd members on one client port).
func freeAddr(t testing.TB) string {
	t.Helper()
	handedOut.Lock()
	defer handedOut.Unlock()
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		if !handedOut.addrs[addr] {
			handedOut.addrs[addr] = true
			return addr
		}
	}
	t.Fatal("freeAddr: the kernel kept giving ports already handed out")
	return ""
}

func tail(s string, lines int) string {
	ls := strings.Split(s, "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, "\n")
}

// --- HTTP to process nodes ---

// procMetric reads one unlabelled counter or gauge from a node's /metrics.
func procMetric(n *procNode, name string) (float64, error) {
	res, err := killHTTP.Get("http://" + n.http + "/metrics")
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			var f float64
			_, err := fmt.Sscan(v, &f)
			return f, err
		}
	}
	return 0, nil
}

// killHTTP is the requesters' client; its idle connections are closed when
// the test ends.
var killHTTP = &http.Client{Transport: &http.Transport{}}

func procGetJSON(n *procNode, path string, into any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+n.http+path, nil)
	res, err := killHTTP.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %d %s", path, res.StatusCode, b)
	}
	return json.Unmarshal(b, into)
}

type killQueueView struct {
	Name, Dispatcher string
	Local            *struct{ Depth, Bound, Workers int }
	Consumers        []struct{ ID, Node, Name string }
}

func (q killQueueView) hasConsumers(names ...string) bool {
	for _, name := range names {
		if !slices.ContainsFunc(q.Consumers, func(c struct{ ID, Node, Name string }) bool { return c.Name == name }) {
			return false
		}
	}
	return true
}

func waitQueueView(t *testing.T, n *procNode, queue, what string, cond func(killQueueView) bool) {
	t.Helper()
	waitFor(t, 15*time.Second, what+" in "+n.name+"'s view of "+queue, func() bool {
		var q killQueueView
		return procGetJSON(n, "/v1/queues/"+queue, &q) == nil && cond(q)
	})
}
