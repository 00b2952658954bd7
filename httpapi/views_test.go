package httpapi

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/core"
)

// The JSON of every unary route, pinned as the chi handlers wrote it before
// grpc-gateway served these routes: the gateway must write the same
// documents (parsed: key order and whitespace may differ).
func TestUnaryRoutesJSON(t *testing.T) {
	s, e := newViewServer(t)
	w := attachWorker(t, e, "demo", "model=demo")
	running := submit(t, e, "demo", `{"input":"x","ttl_ms":60000}`)
	w.waitOffer(t)
	w.w.Accept(running.ID, 1)
	w.w.Output(running.ID, 1, []byte(`"a"`))
	waiting := submit(t, e, "demo", `{"input":"yy","ttl_ms":60000}`)
	cancelled := submit(t, e, "demo", `{"input":"z","ttl_ms":60000}`)
	attachWorker(t, e, "local")
	if _, err := e.Cancel(cancelled.ID, "cancelled by request"); err != nil {
		t.Fatal(err)
	}
	created := func(id string) string {
		v, err := e.View(id)
		if err != nil {
			t.Fatal(err)
		}
		return v.Created.UTC().Format(time.RFC3339Nano)
	}
	started := func(id string) string {
		v, _ := e.View(id)
		if len(v.Attempts) != 1 {
			t.Fatalf("job %s attempts %+v", id, v.Attempts)
		}
		return v.Attempts[0].Started.UTC().Format(time.RFC3339Nano)
	}
	ended := func(id string) string {
		v, _ := e.View(id)
		return v.Ended.UTC().Format(time.RFC3339Nano)
	}
	traceID := func(j *core.Job) string {
		if !j.Trace().IsValid() {
			t.Fatalf("job %s has no trace", j.ID)
		}
		return j.Trace().TraceID().String()
	}

	for _, tc := range []struct {
		name, method, path string
		status             int
		want               string
		// vary are top-level keys whose values change with time: only
		// their presence and type are compared.
		vary []string
	}{
		{
			name: "running job", method: "GET", path: "/v1/jobs/" + running.ID, status: 200,
			want: `{"job_id":"` + running.ID + `","queue":"demo","state":"running","generation":1,"handled_by":"` + w.w.ID + `",
				"worker":"w-demo","created_at":"` + created(running.ID) + `","ttl_ms":60000,"remaining_ms":0,"outputs":1,"last_seq":2,
				"links":{"self":"/v1/jobs/` + running.ID + `","events":"/v1/jobs/` + running.ID + `/events"},"waiting_for_reader":false,
				"trace_id":"` + traceID(running) + `","stream_generation":1,"on_worker_lost":"fail","restarts":0,"max_restarts":3,
				"attempts":[{"attempt":1,"gen":1,"consumer":"` + w.w.ID + `","worker":"w-demo","node":"test-node","started_at":"` + started(running.ID) + `"}]}`,
			vary: []string{"remaining_ms"},
		},
		{
			name: "queued job", method: "GET", path: "/v1/jobs/" + waiting.ID, status: 200,
			want: `{"job_id":"` + waiting.ID + `","queue":"demo","state":"queued","generation":1,
				"created_at":"` + created(waiting.ID) + `","ttl_ms":60000,"remaining_ms":0,"outputs":0,"last_seq":1,
				"links":{"self":"/v1/jobs/` + waiting.ID + `","events":"/v1/jobs/` + waiting.ID + `/events"},"waiting_for_reader":false,
				"trace_id":"` + traceID(waiting) + `","stream_generation":1,"on_worker_lost":"fail","restarts":0,"max_restarts":3,"attempts":[]}`,
			vary: []string{"remaining_ms"},
		},
		{
			name: "cancel a cancelled job", method: "DELETE", path: "/v1/jobs/" + cancelled.ID, status: 200,
			want: `{"job_id":"` + cancelled.ID + `","queue":"demo","state":"cancelled","outcome":"cancelled","code":"cancelled",
				"detail":"cancelled by request","generation":1,"created_at":"` + created(cancelled.ID) + `","ended_at":"` + ended(cancelled.ID) + `",
				"ttl_ms":60000,"remaining_ms":0,"outputs":0,"last_seq":2,
				"links":{"self":"/v1/jobs/` + cancelled.ID + `","events":"/v1/jobs/` + cancelled.ID + `/events"},"waiting_for_reader":false,
				"trace_id":"` + traceID(cancelled) + `","stream_generation":1,"restarts":0,"max_restarts":3,"attempts":[]}`,
		},
		{
			name: "nodes", method: "GET", path: "/v1/cluster/nodes", status: 200,
			want: `{"nodes":[{"id":"n1","state":"online","zone":"z1","http_addr":"127.0.0.1:1","grpc_addr":"127.0.0.1:2","peer_addr":"127.0.0.1:3"},
				{"id":"n2","state":"spare"}]}`,
		},
		{
			name: "queues", method: "GET", path: "/v1/queues", status: 200,
			want: `{"queues":[
				{"name":"demo","dispatcher":"n1","reply_to":"n2","zone":"z1","local":{"depth":1,"bytes":4,"bound":1,"workers":1,
				 "subjects":[{"subject":"","weight":1,"depth":1,"bound":1,"share":1,"fair_share":1}]},
				 "consumers":[{"id":"c_1","node":"n1","name":"gpu-1","capabilities":["model=demo"],"concurrency":4,"zone":"z1"},
				              {"id":"c_2","node":"n2","capabilities":["a=b","model=demo"],"concurrency":1}]},
				{"name":"elsewhere","consumers":[]},
				{"name":"local","dispatcher":"test-node","local":{"depth":0,"bytes":0,"bound":0,"workers":1,"subjects":[]},"consumers":[]}]}`,
		},
		{
			name: "queue", method: "GET", path: "/v1/queues/elsewhere", status: 200,
			want: `{"name":"elsewhere","consumers":[]}`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			s.ServeHTTP(rec, httptest.NewRequest(tc.method, tc.path, nil))
			if rec.Code != tc.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.status, rec.Body)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			if cc := rec.Header().Get("Cache-Control"); cc != "no-store" {
				t.Errorf("Cache-Control %q", cc)
			}
			for k := range rec.Header() {
				if strings.HasPrefix(k, "Grpc-") {
					t.Errorf("header %s leaked: %q", k, rec.Header().Get(k))
				}
			}
			got, want := parseJSON(t, rec.Body.Bytes()), parseJSON(t, []byte(tc.want))
			for _, k := range tc.vary {
				g, _ := got.(map[string]any)
				w, _ := want.(map[string]any)
				if reflect.TypeOf(g[k]) != reflect.TypeOf(w[k]) {
					t.Errorf("%s: %T, want %T", k, g[k], w[k])
				}
				delete(g, k)
				delete(w, k)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("body\n %s\nwant\n %s", rec.Body, compact(t, tc.want))
			}
		})
	}
}

func parseJSON(tb testing.TB, b []byte) any {
	tb.Helper()
	var v any
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		tb.Fatalf("%s: %v", b, err)
	}
	return v
}

func compact(tb testing.TB, s string) string {
	b, err := json.Marshal(parseJSON(tb, []byte(s)))
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}

// newViewServer is a server over an engine named test-node with a fixed
// cluster view: two nodes, queue demo with a dispatch record and two
// consumers, and a queue "elsewhere" known to the catalog only.
func newViewServer(tb testing.TB) (*Server, *core.Engine) {
	tb.Helper()
	cfg := core.DefaultConfig()
	cfg.Node = "test-node"
	cfg.Registerer = prometheus.NewRegistry()
	hc := DefaultConfig()
	hc.Cluster = fixedView{}
	return newServerWith(tb, cfg, hc, prometheus.NewRegistry())
}

type fixedView struct{}

func (fixedView) Nodes() []core.NodeInfo {
	return []core.NodeInfo{
		{ID: "n1", State: core.StateOnline, Zone: "z1", HTTPAddr: "127.0.0.1:1", GRPCAddr: "127.0.0.1:2", PeerAddr: "127.0.0.1:3"},
		{ID: "n2", State: core.StateSpare},
	}
}
func (fixedView) Queues() []string { return []string{"demo", "elsewhere"} }
func (fixedView) Consumers(q string) []core.ConsumerInfo {
	if q != "demo" {
		return nil
	}
	return []core.ConsumerInfo{
		{ID: "c_1", Node: "n1", Name: "gpu-1", Capabilities: core.Capabilities{"model": {"demo"}}, Concurrency: 4, Zone: "z1"},
		{ID: "c_2", Node: "n2", Capabilities: core.Capabilities{"model": {"demo"}, "a": {"b"}}, Concurrency: 1},
	}
}
func (fixedView) Dispatch(q string) (core.DispatchInfo, bool) {
	if q != "demo" {
		return core.DispatchInfo{}, false
	}
	return core.DispatchInfo{Dispatcher: "n1", ReplyTo: "n2", Zone: "z1"}, true
}

// testWorker is a worker session whose offers a test reads.
type testWorker struct {
	w      *core.Worker
	mu     sync.Mutex
	offers []core.Offer
	offerc chan struct{}
}

func attachWorker(tb testing.TB, e *core.Engine, queue string, caps ...string) *testWorker {
	tb.Helper()
	tw := &testWorker{offerc: make(chan struct{}, 64)}
	w, err := e.AttachWorker(context.Background(), core.WorkerSpec{Queue: queue, Name: "w-" + queue, Capabilities: caps}, tw)
	if err != nil {
		tb.Fatal(err)
	}
	tw.w = w
	tb.Cleanup(func() { w.Detach(context.Background()) })
	return tw
}

func (tw *testWorker) SendOffer(o core.Offer) error {
	tw.mu.Lock()
	tw.offers = append(tw.offers, o)
	tw.mu.Unlock()
	tw.offerc <- struct{}{}
	return nil
}
func (tw *testWorker) SendCancel(string, uint64, core.Code) error         { return nil }
func (tw *testWorker) SendCredit(string, uint64, core.OutputCredit) error { return nil }
func (tw *testWorker) Close(error)                                        {}

func (tw *testWorker) waitOffer(tb testing.TB) core.Offer {
	tb.Helper()
	select {
	case <-tw.offerc:
	case <-time.After(5 * time.Second):
		tb.Fatal("no offer")
	}
	tw.mu.Lock()
	defer tw.mu.Unlock()
	return tw.offers[len(tw.offers)-1]
}

func submit(tb testing.TB, e *core.Engine, queue, body string) *core.Job {
	tb.Helper()
	env, err := core.ParseEnvelope([]byte(body))
	if err != nil {
		tb.Fatal(err)
	}
	j, _, err := e.Submit(context.Background(), queue, env, core.SubmitOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	return j
}

// The gateway writes a document's fields in the order the chi handlers did
// (the proto's field order), not sorted: what a person reading curl's
// output sees.
func TestGatewayKeepsFieldOrder(t *testing.T) {
	s, e := newViewServer(t)
	attachWorker(t, e, "demo", "model=demo")
	j := submit(t, e, "demo", `{"input":"x","ttl_ms":60000}`)
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/jobs/"+j.ID, nil))
	body := rec.Body.String()
	last := -1
	for _, k := range []string{`"job_id"`, `"queue"`, `"state"`, `"generation"`, `"created_at"`, `"ttl_ms"`, `"remaining_ms"`, `"outputs"`, `"last_seq"`, `"links"`} {
		i := strings.Index(body, k)
		if i < last {
			t.Fatalf("%s out of order in %s", k, body)
		}
		last = i
	}
}
