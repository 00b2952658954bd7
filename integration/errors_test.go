package integration_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/httpapi"
	"github.com/switchyard/switchyard/worker"
)

// Every bad request gets problem+json with a stable code and changes nothing.
func TestErrorsAreProblemsAndChangeNothing(t *testing.T) {
	n := MustStartNode(t, func(c *switchyard.Config) {
		c.Engine.Limits.MaxInputBytes = 1024
		c.Engine.Limits.MaxQueueBytes = 4096
		c.Engine.Limits.MaxQueueDepth = 1
		c.Engine.Limits.MaxTTL = time.Minute
		c.Engine.Limits.DefaultTTL = 30 * time.Second
		c.Engine.HistoryBytes = 1 << 20
		c.HTTP.Stream.MaxLagBytes = 512 << 10 // below the history's bound, as the node requires
	})
	startHeldWorker(t, n)
	// Occupy the worker, then fill the queue (depth 1).
	for range 2 {
		res := post(t.Context(), t, n, "demo", `{"input":"hold"}`, false)
		res.Body.Close()
		if res.StatusCode != http.StatusAccepted {
			t.Fatalf("setup post: %d", res.StatusCode)
		}
	}
	waitFor(t, 2*time.Second, "queue depth 1", func() bool {
		return metric(t, n, "switchyard_queue_depth", map[string]string{"queue": "demo"}) == 1
	})

	big := strings.Repeat("x", 200<<10)
	cases := []struct {
		name, method, path, ctype, body string
		status                          int
		code                            string
	}{
		{"malformed json", "POST", "/v1/queues/other/jobs", "application/json", `{"input":`, 400, "malformed_json"},
		{"not an object", "POST", "/v1/queues/other/jobs", "application/json", `[1,2]`, 400, "malformed_json"},
		{"wrong type", "POST", "/v1/queues/other/jobs", "application/json", `{"input":"x","ttl_ms":"soon"}`, 400, "invalid_field"},
		{"unsupported version", "POST", "/v1/queues/other/jobs", "application/json", `{"version":9,"input":"x"}`, 400, "unsupported_version"},
		{"missing input", "POST", "/v1/queues/other/jobs", "application/json", `{"ttl_ms":100}`, 400, "missing_input"},
		{"missing content type", "POST", "/v1/queues/other/jobs", "", `{"input":"x"}`, 415, "unsupported_media_type"},
		{"wrong content type", "POST", "/v1/queues/other/jobs", "text/plain", `{"input":"x"}`, 415, "unsupported_media_type"},
		{"invalid queue name", "POST", "/v1/queues/bad$name/jobs", "application/json", `{"input":"x"}`, 400, "invalid_queue_name"},
		{"body too large", "POST", "/v1/queues/other/jobs", "application/json", `{"input":"` + big + `"}`, 413, "body_too_large"},
		{"input too large", "POST", "/v1/queues/demo/jobs", "application/json", `{"input":"` + strings.Repeat("y", 2000) + `"}`, 413, "input_too_large"},
		{"ttl above ceiling", "POST", "/v1/queues/demo/jobs", "application/json", `{"input":"x","ttl_ms":600000}`, 422, "ttl_out_of_range"},
		{"ttl zero", "POST", "/v1/queues/demo/jobs", "application/json", `{"input":"x","ttl_ms":0}`, 422, "ttl_out_of_range"},
		{"limit raised", "POST", "/v1/queues/demo/jobs", "application/json", `{"input":"x","limits":{"max_input_bytes":999999}}`, 422, "limit_above_ceiling"},
		{"no capable worker", "POST", "/v1/queues/demo/jobs", "application/json", `{"input":"x","capabilities":{"model":"gpt"}}`, 503, "no_capable_worker"},
		{"no worker on queue", "POST", "/v1/queues/empty/jobs", "application/json", `{"input":"x"}`, 503, "no_capable_worker"},
		{"queue full", "POST", "/v1/queues/demo/jobs", "application/json", `{"input":"x"}`, 429, "queue_full"},
		{"unknown job", "GET", "/v1/jobs/j_nope", "", "", 404, "job_not_found"},
		{"cancel unknown job", "DELETE", "/v1/jobs/j_nope", "", "", 404, "job_not_found"},
		{"unknown route", "GET", "/v1/nothing", "", "", 404, "not_found"},
		{"wrong method", "PUT", "/v1/queues/demo/jobs", "", "", 405, "method_not_allowed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, baseURL(n)+tc.path, strings.NewReader(tc.body))
			if tc.ctype != "" {
				req.Header.Set("Content-Type", tc.ctype)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			b, _ := io.ReadAll(res.Body)
			var p problem
			if err := json.Unmarshal(b, &p); err != nil {
				t.Fatalf("body %q: %v", b, err)
			}
			if res.StatusCode != tc.status || p.Code != tc.code || p.Status != tc.status {
				t.Fatalf("got %d %q (%s), want %d %q", res.StatusCode, p.Code, p.Detail, tc.status, tc.code)
			}
			if ct := res.Header.Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("content type %q", ct)
			}
			if p.Type != "urn:switchyard:problem:"+tc.code || p.Title == "" {
				t.Errorf("problem %+v", p)
			}
			if tc.status == 429 || tc.status == 503 {
				if res.Header.Get("Retry-After") == "" {
					t.Errorf("no Retry-After on %d", tc.status)
				}
			}
		})
	}
	// Nothing was created or enqueued by any refusal.
	if d := metric(t, n, "switchyard_queue_depth", map[string]string{"queue": "demo"}); d != 1 {
		t.Errorf("queue depth %v after refusals, want 1", d)
	}
	if d := metric(t, n, "switchyard_queue_depth", map[string]string{"queue": "other"}); d != 0 {
		t.Errorf("queue other depth %v", d)
	}
	for _, o := range []string{"completed", "failed", "cancelled", "expired"} {
		if v := metric(t, n, "switchyard_jobs_total", map[string]string{"outcome": o}); v != 0 {
			t.Errorf("jobs_total{%s} = %v after refusals", o, v)
		}
	}
	// Every refusal was counted by its code; none was a server fault.
	for code, want := range map[string]float64{"malformed_json": 2, "unsupported_media_type": 2, "job_not_found": 2, "internal": 0} {
		if v := metric(t, n, "switchyard_api_errors_total", map[string]string{"transport": "http", "code": code}); v != want {
			t.Errorf("api_errors_total{http,%s} = %v, want %v", code, v, want)
		}
	}
}

// A queue full by bytes refuses a job with 429 queue_bytes_full and
// Retry-After, and keeps what it held, whether the bound is the node's
// max_queue_bytes or one an envelope lowered for its own job.
func TestQueueFullByBytesChangesNothing(t *testing.T) {
	n := MustStartNode(t, func(c *switchyard.Config) {
		c.Engine.Limits.MaxInputBytes = 1024
		c.Engine.Limits.MaxQueueBytes = 1500 // room for one 1000-byte input, not two
	})
	startHeldWorker(t, n)
	accept := func(body string) {
		t.Helper()
		res := post(t.Context(), t, n, "demo", body, false)
		res.Body.Close()
		if res.StatusCode != http.StatusAccepted {
			t.Fatalf("post %.40s: %d, want 202", body, res.StatusCode)
		}
	}
	local := func() httpapi.LocalQueue {
		t.Helper()
		var q httpapi.QueueResponse
		if code := getJSON(t, baseURL(n)+"/v1/queues/demo", &q); code != 200 || q.Local == nil {
			t.Fatalf("GET /v1/queues/demo: %d %+v", code, q)
		}
		return *q.Local
	}
	// The worker holds the first job; the second waits, 1000 bytes of input.
	accept(`{"input":"hold"}`)
	waitFor(t, 2*time.Second, "the worker busy", func() bool { return local().Bound == 1 })
	thousand := `"` + strings.Repeat("x", 998) + `"`
	accept(`{"input":` + thousand + `}`)
	held := local()
	if held.Depth != 1 || held.Bytes != 1000 {
		t.Fatalf("queue before the refusals: %+v, want depth 1 and 1000 bytes", held)
	}

	for _, tc := range []struct{ name, body string }{
		{"node ceiling", `{"input":` + thousand + `}`},                              // 2000 > 1500
		{"lowered by envelope", `{"input":"xx","limits":{"max_queue_bytes":1003}}`}, // 1004 > 1003
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := post(t.Context(), t, n, "demo", tc.body, false)
			defer res.Body.Close()
			var p problem
			if err := json.NewDecoder(res.Body).Decode(&p); err != nil {
				t.Fatalf("body: %v", err)
			}
			if res.StatusCode != http.StatusTooManyRequests || p.Code != "queue_bytes_full" {
				t.Fatalf("got %d %q (%s), want 429 queue_bytes_full", res.StatusCode, p.Code, p.Detail)
			}
			if ra := res.Header.Get("Retry-After"); ra == "" {
				t.Error("no Retry-After")
			}
			if got := local(); got.Depth != held.Depth || got.Bytes != held.Bytes {
				t.Errorf("queue after the refusal: %+v, want %+v", got, held)
			}
		})
	}
	// The control: the same small job fits under a bound that has room.
	accept(`{"input":"xx","limits":{"max_queue_bytes":1004}}`)
	if got := local(); got.Depth != 2 || got.Bytes != 1004 {
		t.Errorf("queue after a job that fits: %+v, want depth 2 and 1004 bytes", got)
	}
}

func TestHealthReadyMetrics(t *testing.T) {
	n := MustStartNode(t, nil)
	for _, p := range []string{"/healthz", "/readyz"} {
		res, err := http.Get(baseURL(n) + p)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Errorf("%s: %d", p, res.StatusCode)
		}
	}
	res, err := http.Get(baseURL(n) + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	for _, want := range []string{
		`switchyard_jobs_total{outcome="completed"} 0`, "switchyard_workers_connected 0",
		`switchyard_stream_open{transport="sse"} 0`, "switchyard_time_to_first_output_seconds_bucket",
		"go_goroutines",
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// startHeldWorker starts a worker of concurrency 1 whose jobs run until the
// test ends (or they are cancelled): it occupies the queue's only credit.
func startHeldWorker(t *testing.T, n *switchyard.Node) {
	t.Helper()
	release := make(chan struct{})
	MustStartWorker(t, n, worker.Config{Concurrency: 1}, func(ctx context.Context, _ *worker.Job, _ *worker.Output) (any, error) {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil, nil
	})
	t.Cleanup(func() { close(release) })
}
