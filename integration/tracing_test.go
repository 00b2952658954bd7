package integration_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/internal/grpctest"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
	"github.com/switchyard/switchyard/tracing"
	"github.com/switchyard/switchyard/worker"
)

// A job's trace across a 3-node cluster, exported to an OTLP receiver
// inside the test: a job posted to n1 with the caller's traceparent runs
// on a worker connected to n3 (which dispatches its queue), and its spans
// come from n1, n3 and the worker, all in the caller's trace, each a child
// of the hop before it, with the attributes an operator filters on. A
// cancelled job and a worker_lost job show their outcome on their traces;
// a caller's unsampled trace is honoured (nothing recorded, the trace id
// still carried); the latency histograms carry the sampled job's trace id
// as an exemplar.
func TestTraceAcrossCluster(t *testing.T) {
	recv := startOTLPReceiver(t, false)
	nodes := startCluster(t, 3, func(_ int, c *switchyard.Config) {
		c.Tracing = tracing.Config{Endpoint: recv.endpoint(), Protocol: tracing.ProtocolGRPC, BatchTimeout: 20 * time.Millisecond}
	})
	n1, n3 := nodes[0], nodes[2]
	wtp := workerTracerProvider(t, recv)
	MustStartWorker(t, n3, worker.Config{Name: "w3", TracerProvider: wtp}, tracedHandler)
	stopLost := MustStartWorker(t, n3, worker.Config{Name: "w-lost", Queue: "lost", TracerProvider: wtp}, tracedHandler)
	flush := func() {
		for _, n := range nodes {
			if err := n.FlushTraces(context.Background()); err != nil {
				t.Fatalf("flush %s: %v", n.Catalog().Name(), err)
			}
		}
		if err := wtp.ForceFlush(context.Background()); err != nil {
			t.Fatal(err)
		}
	}

	// One job, streamed: every part of its way is a span of the caller's trace.
	tid, caller := "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	res := postTraced(t, n1, "demo", `{"input":"tokens"}`, "00-"+tid+"-"+caller+"-01", true)
	evs := readAll(t, res.Body)
	res.Body.Close()
	if got := evs[len(evs)-1].Type; got != "done" {
		t.Fatalf("the job ended with %s: %v", got, types(evs))
	}
	if got := field[string](t, evs[0], "trace_id"); evs[0].Type != "accepted" || got != tid {
		t.Fatalf("first event %s with trace_id %q, want accepted with %s", evs[0].Type, got, tid)
	}
	id := res.Header.Get("X-Job-Id")
	if got := jobTraceID(t, n1, id); got != tid {
		t.Fatalf("GET /v1/jobs/%s trace_id %q, want %s", id, got, tid)
	}
	// A later reader of its stream is a span of its trace too.
	resume, err := http.Get(baseURL(n1) + "/v1/jobs/" + id + "/events")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resume.Body)
	resume.Body.Close()

	want := []struct{ name, node, parent string }{
		{"POST /v1/queues/{queue}/jobs", "n1", ""},
		{"switchyard.job", "n1", "POST /v1/queues/{queue}/jobs"},
		{"switchyard.forward", "n1", "switchyard.job"},
		{"switchyard.queue", "n3", "switchyard.forward"},
		{"switchyard.offer", "n3", "switchyard.queue"},
		{"switchyard.run", "n3", "switchyard.offer"},
		{"switchyard.worker.run", "worker", "switchyard.offer"},
		{"handler.step", "worker", "switchyard.worker.run"},
		{"switchyard.resume", "n1", "switchyard.job"},
	}
	var spans []span
	waitFor(t, 10*time.Second, "the job's spans", func() bool {
		flush()
		spans = recv.trace(tid)
		return hasSpans(spans, "switchyard.resume", "switchyard.worker.run", "handler.step", "switchyard.run", "switchyard.job")
	})
	t.Logf("the job's trace:\n%s", traceTree(spans))
	byName := map[string]span{}
	for _, s := range spans {
		if _, dup := byName[s.Name]; dup && s.Name != "GET" {
			t.Errorf("two spans named %s in the trace", s.Name)
		}
		byName[s.Name] = s
	}
	for _, w := range want {
		s, ok := byName[w.name]
		switch {
		case !ok:
			t.Errorf("no span %s in the trace", w.name)
			continue
		case w.node == "worker" && s.Service != "worker", w.node != "worker" && s.Node != w.node:
			t.Errorf("span %s from %s/%s, want %s", w.name, s.Service, s.Node, w.node)
		case w.parent == "" && s.Parent != caller:
			t.Errorf("span %s has parent %s, want the caller's span %s", w.name, s.Parent, caller)
		case w.parent != "" && s.Parent != byName[w.parent].SpanID:
			t.Errorf("span %s has parent %s, want %s (%s)", w.name, s.Parent, w.parent, byName[w.parent].SpanID)
		}
	}
	wantAttrs(t, byName["switchyard.job"], map[string]string{
		"switchyard.queue": "demo", "switchyard.job.id": id, "switchyard.node": "n1", "switchyard.outcome": "completed",
		"switchyard.generation": "1", "switchyard.outputs": "3", "switchyard.worker": "w3", "switchyard.peer": "n3",
	})
	wantAttrs(t, byName["switchyard.forward"], map[string]string{"switchyard.peer": "n3", "switchyard.result": "taken", "switchyard.attempt": "1"})
	wantAttrs(t, byName["switchyard.queue"], map[string]string{"switchyard.node": "n3", "switchyard.result": "bound", "switchyard.job.id": id})
	wantAttrs(t, byName["switchyard.offer"], map[string]string{"switchyard.node": "n3", "switchyard.result": "accepted", "switchyard.worker": "w3"})
	wantAttrs(t, byName["switchyard.run"], map[string]string{"switchyard.result": "ended", "switchyard.outputs": "3"})
	wantAttrs(t, byName["switchyard.worker.run"], map[string]string{"switchyard.outcome": "completed", "switchyard.outputs": "3", "switchyard.job.id": id})
	wantAttrs(t, byName["switchyard.resume"], map[string]string{"switchyard.job.id": id, "switchyard.result": "terminal"})
	if c := byName["switchyard.job"].Attrs["switchyard.consumer"]; c == "" || c != byName["switchyard.offer"].Attrs["switchyard.consumer"] {
		t.Errorf("the job's consumer %q is not the offer's %q", c, byName["switchyard.offer"].Attrs["switchyard.consumer"])
	}
	if b := byName["switchyard.job"].Attrs["switchyard.output.bytes"]; b == "" || b == "0" {
		t.Errorf("the job span counts %q output bytes", b)
	}

	// The job duration histogram carries the sampled job's trace id.
	if !strings.Contains(scrapeOpenMetrics(t, n1), `switchyard_job_duration_seconds_bucket{outcome="completed"`) ||
		!regexp.MustCompile(`switchyard_job_duration_seconds_bucket\{outcome="completed",le="[^"]+"\} \d+ # \{trace_id="`+tid+`"\} [0-9.e+-]+`).MatchString(scrapeOpenMetrics(t, n1)) {
		t.Errorf("no exemplar with trace_id %s on switchyard_job_duration_seconds in n1's OpenMetrics", tid)
	}

	// A cancelled job: its trace says so, on every node.
	tidC := "5bf92f3577b34da6a3ce929d0e0e4737"
	idC := postAccepted(t, n1, "demo", `{"input":"block"}`, "00-"+tidC+"-"+caller+"-01")
	waitFor(t, 10*time.Second, "the blocked job's output", func() bool { return outputsOf(t, n1, idC) >= 1 })
	cancelJob(t, n1, idC)
	waitFor(t, 10*time.Second, "the cancelled job's spans", func() bool {
		flush()
		s := recv.trace(tidC)
		return spanNamed(s, "switchyard.job").Attrs["switchyard.outcome"] != "" && spanNamed(s, "switchyard.run").Name != "" &&
			spanNamed(s, "switchyard.worker.run").Name != ""
	})
	sc := recv.trace(tidC)
	t.Logf("the cancelled job's trace:\n%s", traceTree(sc))
	wantAttrs(t, spanNamed(sc, "switchyard.job"), map[string]string{"switchyard.outcome": "cancelled", "switchyard.error.code": "cancelled", "switchyard.job.id": idC})
	wantAttrs(t, spanNamed(sc, "switchyard.run"), map[string]string{"switchyard.result": "cancelled", "switchyard.node": "n3"})
	wantAttrs(t, spanNamed(sc, "switchyard.worker.run"), map[string]string{"switchyard.outcome": "cancelled"})

	// A worker_lost job: the worker goes away after the job's first output.
	tidL := "6bf92f3577b34da6a3ce929d0e0e4738"
	idL := postAccepted(t, n1, "lost", `{"input":"block"}`, "00-"+tidL+"-"+caller+"-01")
	waitFor(t, 10*time.Second, "the job's output on the worker that will be lost", func() bool { return outputsOf(t, n1, idL) >= 1 })
	stopLost()
	waitFor(t, 10*time.Second, "the lost job's spans", func() bool {
		flush()
		s := recv.trace(tidL)
		return spanNamed(s, "switchyard.job").Attrs["switchyard.outcome"] != "" && spanNamed(s, "switchyard.run").Name != ""
	})
	sl := recv.trace(tidL)
	t.Logf("the worker_lost job's trace:\n%s", traceTree(sl))
	jl := spanNamed(sl, "switchyard.job")
	wantAttrs(t, jl, map[string]string{"switchyard.outcome": "failed", "switchyard.error.code": "worker_lost", "switchyard.job.id": idL})
	if !jl.StatusError {
		t.Error("the worker_lost job's span has no error status")
	}
	wantAttrs(t, spanNamed(sl, "switchyard.run"), map[string]string{"switchyard.result": "worker lost", "switchyard.error.code": "worker_lost"})

	// A caller that did not sample its trace: nothing is recorded, and the
	// job still carries the caller's trace id.
	tidU := "7bf92f3577b34da6a3ce929d0e0e4739"
	res = postTraced(t, n1, "demo", `{"input":"tokens"}`, "00-"+tidU+"-"+caller+"-00", true)
	evs = readAll(t, res.Body)
	res.Body.Close()
	if got := field[string](t, evs[0], "trace_id"); got != tidU {
		t.Errorf("an unsampled caller's job has trace_id %q, want %s", got, tidU)
	}

	// The gRPC JobService reads the caller's traceparent from its metadata.
	tidG := "8bf92f3577b34da6a3ce929d0e0e473a"
	conn := grpctest.Dial(t, n1.GRPCAddr())
	ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", "00-"+tidG+"-"+caller+"-01")
	st, err := pb.NewJobServiceClient(conn).Submit(ctx, &pb.SubmitRequest{Queue: "demo", EnvelopeJson: []byte(`{"input":"tokens"}`)})
	if err != nil {
		t.Fatal(err)
	}
	var gid string
	for {
		ev, err := st.Recv()
		if err != nil {
			break
		}
		gid = ev.GetJobId()
	}
	if got := jobTraceID(t, n1, gid); got != tidG {
		t.Errorf("a gRPC Submit's job has trace_id %q, want %s", got, tidG)
	}
	waitFor(t, 10*time.Second, "the gRPC job's spans", func() bool {
		flush()
		return hasSpans(recv.trace(tidG), "switchyard.v1.JobService/Submit", "switchyard.job", "switchyard.worker.run")
	})
	if g := recv.trace(tidG); spanNamed(g, "switchyard.job").Parent != spanNamed(g, "switchyard.v1.JobService/Submit").SpanID {
		t.Errorf("the gRPC job's span is not the Submit call's child:\n%s", traceTree(g))
	}

	flush()
	if s := recv.trace(tidU); len(s) > 0 {
		t.Errorf("an unsampled caller's job recorded %d spans:\n%s", len(s), traceTree(s))
	}
}

// With export off (the default) a node records nothing, yet a job carries
// the caller's trace context to its worker, and a job that came with none
// gets a trace of its own.
func TestTracePropagatesWithExportOff(t *testing.T) {
	n := MustStartNode(t, nil)
	offers := make(chan *worker.Job, 2)
	MustStartWorker(t, n, worker.Config{Name: "w"}, func(ctx context.Context, job *worker.Job, out *worker.Output) (any, error) {
		if sc := trace.SpanContextFromContext(ctx); sc.TraceID().String() != job.TraceID {
			return nil, fmt.Errorf("the handler's context is in trace %s, the job in %s", sc.TraceID(), job.TraceID)
		}
		offers <- job
		return nil, nil
	})
	tid := "9bf92f3577b34da6a3ce929d0e0e473b"
	for _, tc := range []struct{ name, traceparent string }{
		{"the caller's trace", "00-" + tid + "-00f067aa0ba902b7-01"},
		{"no trace", ""},
	} {
		res := postTraced(t, n, "demo", `{"input":1}`, tc.traceparent, true)
		evs := readAll(t, res.Body)
		res.Body.Close()
		if last := evs[len(evs)-1]; last.Type != "done" {
			t.Fatalf("%s: the job ended %s %s", tc.name, last.Type, last.Data)
		}
		got := field[string](t, evs[0], "trace_id")
		job := <-offers
		switch {
		case tc.traceparent != "" && got != tid:
			t.Errorf("%s: trace_id %q, want %s", tc.name, got, tid)
		case !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(got) || got == strings.Repeat("0", 32):
			t.Errorf("%s: trace_id %q is not a trace id", tc.name, got)
		case job.TraceID != got || !strings.HasPrefix(job.Traceparent, "00-"+got+"-"):
			t.Errorf("%s: the worker got traceparent %q (trace %s), the job is in %s", tc.name, job.Traceparent, job.TraceID, got)
		case tc.traceparent != "" && !strings.HasSuffix(job.Traceparent, "-01"):
			t.Errorf("%s: the caller's sampled flag is lost: the worker got %q", tc.name, job.Traceparent)
		}
	}

	// The gRPC JobService reads it from the call's metadata.
	conn := grpctest.Dial(t, n.GRPCAddr())
	tidG := "abf92f3577b34da6a3ce929d0e0e473c"
	ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", "00-"+tidG+"-00f067aa0ba902b7-01")
	st, err := pb.NewJobServiceClient(conn).Submit(ctx, &pb.SubmitRequest{Queue: "demo", EnvelopeJson: []byte(`{"input":1}`)})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := st.Recv(); err != nil {
			break
		}
	}
	if job := <-offers; job.TraceID != tidG {
		t.Errorf("a gRPC Submit's worker got trace %s, want the caller's %s", job.TraceID, tidG)
	}
}

// tracedHandler is the test worker: "tokens" sends three outputs, with a
// span of its own (handler.step) from the handler's context; "block"
// sends one and waits for the job to end.
func tracedHandler(ctx context.Context, job *worker.Job, out *worker.Output) (any, error) {
	var input string
	_ = json.Unmarshal(job.Input, &input)
	_, step := trace.SpanFromContext(ctx).TracerProvider().Tracer("handler").Start(ctx, "handler.step")
	defer step.End()
	switch input {
	case "tokens":
		for i := range 3 {
			if err := out.Send(ctx, fmt.Sprintf("t%d", i)); err != nil {
				return nil, err
			}
		}
		return nil, nil
	case "block":
		if err := out.Send(ctx, "first"); err != nil {
			return nil, err
		}
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return nil, worker.Fail("bad_input", input)
}

// workerTracerProvider is the worker's own OpenTelemetry SDK, exporting
// to recv as service "worker"; it is shut down when the test ends, after
// the workers (cleanups run last first).
func workerTracerProvider(t *testing.T, recv *otlpReceiver) *sdktrace.TracerProvider {
	exp, err := otlptracegrpc.New(context.Background(), otlptracegrpc.WithEndpointURL(recv.endpoint()))
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(20*time.Millisecond)),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "worker"))),
	)
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp
}

// postTraced posts an envelope with a traceparent header ("" for none).
func postTraced(tb testing.TB, n *switchyard.Node, queue, body, traceparent string, stream bool) *http.Response {
	tb.Helper()
	req, err := http.NewRequest(http.MethodPost, baseURL(n)+"/v1/queues/"+queue+"/jobs", strings.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if traceparent != "" {
		req.Header.Set("traceparent", traceparent)
	}
	if stream {
		req.Header.Set("Accept", "text/event-stream")
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	return res
}

// postAccepted posts a job for later (202) and returns its id.
func postAccepted(tb testing.TB, n *switchyard.Node, queue, body, traceparent string) string {
	tb.Helper()
	res := postTraced(tb, n, queue, body, traceparent, false)
	defer res.Body.Close()
	var v struct {
		JobID string `json:"job_id"`
	}
	if err := json.NewDecoder(res.Body).Decode(&v); err != nil || res.StatusCode != http.StatusAccepted {
		tb.Fatalf("POST: %d, %v", res.StatusCode, err)
	}
	return v.JobID
}

func jobView(tb testing.TB, n *switchyard.Node, id string) map[string]any {
	tb.Helper()
	var v map[string]any
	if code := getJSON(tb, baseURL(n)+"/v1/jobs/"+id, &v); code != http.StatusOK {
		tb.Fatalf("GET /v1/jobs/%s: %d", id, code)
	}
	return v
}

func jobTraceID(tb testing.TB, n *switchyard.Node, id string) string {
	s, _ := jobView(tb, n, id)["trace_id"].(string)
	return s
}

func outputsOf(tb testing.TB, n *switchyard.Node, id string) float64 {
	f, _ := jobView(tb, n, id)["outputs"].(float64)
	return f
}

func cancelJob(tb testing.TB, n *switchyard.Node, id string) {
	tb.Helper()
	req, _ := http.NewRequest(http.MethodDelete, baseURL(n)+"/v1/jobs/"+id, nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		tb.Fatalf("DELETE /v1/jobs/%s: %d", id, res.StatusCode)
	}
}

// scrapeOpenMetrics reads n's /metrics as a Prometheus server that asks
// for OpenMetrics (and so for exemplars) does.
func scrapeOpenMetrics(tb testing.TB, n *switchyard.Node) string {
	tb.Helper()
	req, _ := http.NewRequest(http.MethodGet, baseURL(n)+"/metrics", nil)
	req.Header.Set("Accept", "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if ct := res.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/openmetrics-text") {
		tb.Fatalf("/metrics answered %s to an OpenMetrics scraper", ct)
	}
	return string(b)
}

func wantAttrs(tb testing.TB, s span, want map[string]string) {
	tb.Helper()
	for k, v := range want {
		if got, ok := s.Attrs[k]; !ok || got != v {
			tb.Errorf("span %s (%s%s): %s = %q, want %q", s.Name, s.Node, s.Service, k, got, v)
		}
	}
}

func spanNamed(spans []span, name string) span {
	for _, s := range spans {
		if s.Name == name {
			return s
		}
	}
	return span{}
}

func hasSpans(spans []span, names ...string) bool {
	for _, n := range names {
		if spanNamed(spans, n).Name == "" {
			return false
		}
	}
	return true
}
