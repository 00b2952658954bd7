package integration_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	sse "github.com/tmaxmax/go-sse"
	"go.uber.org/goleak"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/internal/promtest"
	"github.com/switchyard/switchyard/internal/ticktest"
	"github.com/switchyard/switchyard/worker"
)

// MustStartNode starts an in-process node on loopback with ephemeral ports
// and an embedded etcd, through the same Open that main uses.
func MustStartNode(tb testing.TB, mutate func(*switchyard.Config)) *switchyard.Node {
	tb.Helper()
	cfg := switchyard.DefaultConfig()
	cfg.Name = "it-node"
	cfg.HTTPAddr, cfg.GRPCAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.DataDir = tb.TempDir()
	cfg.FastCatalog = true
	cfg.DrainTimeout = 2 * time.Second
	cfg.Workers.HeartbeatInterval = 200 * time.Millisecond
	cfg.Workers.IdleTimeout = time.Second
	cfg.Logger = testLogger()
	if mutate != nil {
		mutate(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := switchyard.Open(ctx, cfg)
	if err != nil {
		tb.Fatalf("open node: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := n.Close(ctx); err != nil {
			tb.Errorf("close node: %v", err)
		}
	})
	return n
}

// testLogger logs at debug level to stderr when SWITCHYARD_TEST_LOG is set;
// nil (the node discards its logs) otherwise.
func testLogger() *slog.Logger {
	if os.Getenv("SWITCHYARD_TEST_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// MustStartWorker runs a real SDK worker against the node's gRPC address
// until the test ends, and waits until the node has registered it.
func MustStartWorker(tb testing.TB, n *switchyard.Node, cfg worker.Config, h worker.Handler) (stop func()) {
	tb.Helper()
	cfg.Server = n.GRPCAddr()
	if cfg.Queue == "" {
		cfg.Queue = "demo"
	}
	if cfg.Capabilities == nil {
		cfg.Capabilities = []string{"model=demo"}
	}
	before := metric(tb, n, "switchyard_workers_connected", nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = worker.Run(ctx, cfg, h)
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	tb.Cleanup(stop)
	waitFor(tb, 5*time.Second, "worker registered", func() bool {
		return metric(tb, n, "switchyard_workers_connected", nil) > before
	})
	return stop
}

// waitGoroutinesGone waits, up to a generous bound, until every goroutine
// that was not running when ignore was taken (goleak.IgnoreCurrent) has
// ended, and fails the test if some are left.
func waitGoroutinesGone(tb testing.TB, ignore goleak.Option) {
	tb.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := goleak.Find(ignore)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Errorf("goroutines left: %v", err)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitFor polls cond every 5ms until it holds, failing the test after
// timeout.
var waitFor = ticktest.WaitFor

// send sends an HTTP request through hc and fails the test on a transport
// error; ctype, if not empty, is its Content-Type, and header is further
// name, value pairs.
func send(tb testing.TB, ctx context.Context, hc *http.Client, method, url, ctype, body string, header ...string) *http.Response {
	tb.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := hc.Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, url, err)
	}
	return res
}

func baseURL(n *switchyard.Node) string { return "http://" + n.HTTPAddr() }

// post sends an envelope; stream asks for text/event-stream.
func post(ctx context.Context, tb testing.TB, n *switchyard.Node, queue, body string, stream bool) *http.Response {
	tb.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL(n)+"/v1/queues/"+queue+"/jobs", strings.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if stream {
		req.Header.Set("Accept", "text/event-stream")
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("post: %v", err)
	}
	return res
}

// readAll parses a whole SSE body with a spec-compliant parser. A job has
// one terminal outcome, so it fails the test if a done or error event is
// not the stream's last: a test that checks the last event is a terminal
// one has then checked that it is the only one.
func readAll(tb testing.TB, r io.Reader) []sse.Event {
	tb.Helper()
	var evs []sse.Event
	for ev, err := range sse.Read(r, nil) {
		if err != nil {
			tb.Fatalf("read sse: %v", err)
		}
		evs = append(evs, ev)
	}
	for i, ev := range evs[:max(len(evs)-1, 0)] {
		if ev.Type == "done" || ev.Type == "error" {
			tb.Errorf("event %d of %d is terminal (%s %s), yet more follow: %v", i+1, len(evs), ev.Type, ev.Data, types(evs))
		}
	}
	return evs
}

func types(evs []sse.Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Type)
	}
	return out
}

// field decodes one field of an event's JSON data.
func field[T any](tb testing.TB, ev sse.Event, name string) T {
	tb.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(ev.Data), &m); err != nil {
		tb.Fatalf("event data %q: %v", ev.Data, err)
	}
	var v T
	if raw, ok := m[name]; ok {
		if err := json.Unmarshal(raw, &v); err != nil {
			tb.Fatalf("field %s of %q: %v", name, ev.Data, err)
		}
	}
	return v
}

func getJSON(tb testing.TB, url string, into any) int {
	tb.Helper()
	res, err := http.Get(url)
	if err != nil {
		tb.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if into != nil {
		if err := json.Unmarshal(b, into); err != nil {
			tb.Fatalf("GET %s: %v: %s", url, err, b)
		}
	}
	return res.StatusCode
}

// metric reads the first series of name whose labels include labels: a
// counter's or gauge's value, or, named as in the text exposition
// (name_count, name_sum), a histogram's sample count or sum. A series that
// is not there reads 0: a vector's series appears with its first use.
func metric(tb testing.TB, n *switchyard.Node, name string, labels map[string]string) float64 {
	tb.Helper()
	v, _ := promtest.Value(tb, n.Registry(), name, labels)
	return v
}

// problem is an RFC 9457 problem details body as a node writes it.
type problem struct {
	Type, Title, Detail, Code string
	Status                    int
}

func jsonDecoder(res *http.Response) *json.Decoder { return json.NewDecoder(res.Body) }
