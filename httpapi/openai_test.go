package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/core"
)

// chatConn is a core.WorkerConn that hands offers and cancels to the test.
type chatConn struct {
	offers  chan core.Offer
	cancels chan string
}

func (c chatConn) SendOffer(o core.Offer) error { c.offers <- o; return nil }
func (c chatConn) SendCancel(id string, _ uint64, _ core.Code) error {
	c.cancels <- id
	return nil
}
func (c chatConn) SendCredit(string, uint64, core.OutputCredit) error { return nil }
func (c chatConn) Close(error)                                        {}

// chatFixture is the HTTP API over a real engine with one worker on the
// front door's queue ("chat", model=demo) that the test plays.
type chatFixture struct {
	s    *Server
	srv  *httptest.Server
	w    *core.Worker
	conn chatConn
}

func newChatFixture(t *testing.T, cluster core.ClusterView) *chatFixture {
	t.Helper()
	return newChatFixtureWith(t, cluster, core.DefaultConfig())
}

func newChatFixtureWith(t *testing.T, cluster core.ClusterView, ecfg core.Config) *chatFixture {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Cluster = cluster
	s, e := newServerWith(t, ecfg, cfg, prometheus.NewRegistry())
	conn := chatConn{offers: make(chan core.Offer, 8), cancels: make(chan string, 8)}
	w, err := e.AttachWorker(context.Background(), core.WorkerSpec{Queue: DefaultOpenAIQueue, Name: "w", Capabilities: []string{"model=demo"}, Concurrency: 4}, conn)
	if err != nil {
		t.Fatal(err)
	}
	return &chatFixture{s: s, srv: serveConns(t, s), w: w, conn: conn}
}

// post posts a chat completion request.
func (f *chatFixture) post(ctx context.Context, t *testing.T, body string, header map[string]string) *http.Response {
	t.Helper()
	return f.request(ctx, t, http.MethodPost, OpenAIPrefix+"/chat/completions", "application/json", body, header)
}

// request sends a request to the fixture's server; ctype "" sends no
// Content-Type.
func (f *chatFixture) request(ctx context.Context, t *testing.T, method, path, ctype, body string, header map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, f.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	res, err := f.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Body.Close() })
	return res
}

// offer waits for the job the front door created, and accepts it.
func (f *chatFixture) offer(t *testing.T) core.Offer {
	t.Helper()
	select {
	case o := <-f.conn.offers:
		f.w.Accept(o.JobID, o.Gen)
		return o
	case <-time.After(5 * time.Second):
		t.Fatal("no job offered")
	}
	return core.Offer{}
}

// cancelSent waits for the worker to be told to cancel o's job, and fails
// the test with the message format, args if it is not.
func (f *chatFixture) cancelSent(t *testing.T, o core.Offer, format string, args ...any) {
	t.Helper()
	select {
	case id := <-f.conn.cancels:
		if id != o.JobID {
			t.Errorf("cancel for %s, want %s", id, o.JobID)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf(format, args...)
	}
}

// dataLines reads an SSE body to its end and returns its data: values. It
// fails the test on any field but data and comments: an OpenAI stream has
// no event names and no ids.
func dataLines(t *testing.T, r io.Reader) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "", strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "data: "):
			out = append(out, strings.TrimPrefix(line, "data: "))
		default:
			t.Errorf("line %q: an OpenAI stream has data lines only", line)
		}
	}
	return out
}

const chatBody = `{"model":"demo","messages":[{"role":"user","content":"hello world"}]`

// A streamed completion: the worker gets the request as its input, and
// its outputs come back as chunks in OpenAI's shape, the role first, the
// finish reason last, the usage after it, then [DONE].
func TestChatStreamed(t *testing.T) {
	f := newChatFixture(t, nil)
	res := f.post(t.Context(), t, chatBody+`,"stream":true,"stream_options":{"include_usage":true},"max_tokens":5}`, nil)
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "text/event-stream" || res.Header.Get("X-Job-Id") == "" {
		t.Fatalf("%d %q, job %q", res.StatusCode, res.Header.Get("Content-Type"), res.Header.Get("X-Job-Id"))
	}
	o := f.offer(t)
	if want := `{"max_tokens":5,"messages":[{"role":"user","content":"hello world"}],"model":"demo"}`; string(o.Input) != want {
		t.Errorf("worker input %s, want %s", o.Input, want)
	}
	if o.Queue != "chat" || !slices.Equal(o.Capabilities, []string{"model=demo"}) {
		t.Errorf("offer on %q with %v, want chat and model=demo", o.Queue, o.Capabilities)
	}
	f.w.Output(o.JobID, o.Gen, []byte(`"hello "`))
	f.w.Output(o.JobID, o.Gen, []byte(`{"content":"world"}`))
	f.w.End(o.JobID, o.Gen, "", "", []byte(`{"finish_reason":"length","usage":{"prompt_tokens":2,"completion_tokens":2}}`))

	id, created := "chatcmpl-"+o.JobID, "" // created is checked to repeat
	head := func(s string) string {
		var c map[string]json.RawMessage
		if err := json.Unmarshal([]byte(s), &c); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		if created == "" {
			created = string(c["created"])
		}
		if string(c["id"]) != `"`+id+`"` || string(c["object"]) != `"chat.completion.chunk"` || string(c["model"]) != `"demo"` || string(c["created"]) != created {
			t.Errorf("chunk %s: want id %s, object chat.completion.chunk, model demo, one created", s, id)
		}
		return string(c["choices"]) + " " + string(c["usage"])
	}
	lines := dataLines(t, res.Body)
	var got []string
	for _, l := range lines[:len(lines)-1] {
		got = append(got, head(l))
	}
	want := []string{
		`[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}] null`,
		`[{"index":0,"delta":{"content":"hello "},"logprobs":null,"finish_reason":null}] null`,
		`[{"index":0,"delta":{"content":"world"},"logprobs":null,"finish_reason":null}] null`,
		`[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length"}] null`,
		`[] {"prompt_tokens":2,"completion_tokens":2,"total_tokens":4}`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("chunks\n got %q\nwant %q", got, want)
	}
	if last := lines[len(lines)-1]; last != "[DONE]" {
		t.Errorf("last data %q, want [DONE]", last)
	}
}

// Without stream the answer is one chat.completion with the whole text;
// without a usage report from the worker, completion_tokens counts the
// deltas.
// The front door's affinity key is its header's, or else the request's
// user; its priority the header's. The worker sees both, and the user
// field stays in the input.
func TestChatAffinityAndPriority(t *testing.T) {
	f := newChatFixture(t, nil)
	for _, tc := range []struct {
		name, body string
		header     map[string]string
		key        string
		priority   int
	}{
		{"header", chatBody + `}`, map[string]string{AffinityKeyHeader: "sess-1", PriorityHeader: "2"}, "sess-1", 2},
		{"user", chatBody + `,"user":"user-7"}`, nil, "user-7", 0},
		{"header over user", chatBody + `,"user":"user-7"}`, map[string]string{AffinityKeyHeader: "sess-1", PriorityHeader: "-5"}, "sess-1", -5},
		{"neither", chatBody + `}`, nil, "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			done := make(chan *http.Response, 1)
			go func() { done <- f.post(t.Context(), t, tc.body, tc.header) }()
			o := f.offer(t)
			if o.AffinityKey != tc.key || o.Priority != tc.priority {
				t.Errorf("offer key %q priority %d, want %q %d", o.AffinityKey, o.Priority, tc.key, tc.priority)
			}
			var in map[string]any
			if err := json.Unmarshal(o.Input, &in); err != nil || (strings.Contains(tc.body, "user-7") && in["user"] != "user-7") {
				t.Errorf("input %s: the user field is the worker's too", o.Input)
			}
			f.w.End(o.JobID, o.Gen, "", "", nil)
			if res := <-done; res.StatusCode != 200 {
				t.Errorf("status %d", res.StatusCode)
			}
		})
	}
}

func TestChatNotStreamed(t *testing.T) {
	f := newChatFixture(t, nil)
	done := make(chan *http.Response, 1)
	go func() { done <- f.post(t.Context(), t, chatBody+`}`, nil) }()
	o := f.offer(t)
	for _, out := range []string{`"the "`, `"whole "`, `{"content":"text","extra":1}`} {
		f.w.Output(o.JobID, o.Gen, []byte(out))
	}
	f.w.End(o.JobID, o.Gen, "", "", []byte(`{"words":3}`))
	res := <-done
	var got ChatCompletion
	if err := json.NewDecoder(res.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	want := ChatCompletion{
		ID: "chatcmpl-" + o.JobID, Object: "chat.completion", Created: got.Created, Model: "demo",
		Choices: []ChatCompletionChoice{{Message: ChatCompletionMessage{Role: "assistant", Content: "the whole text"}, FinishReason: "stop"}},
		Usage:   ChatUsage{CompletionTokens: 3, TotalTokens: 3},
	}
	if res.StatusCode != 200 || got.Created == 0 || !equalJSON(t, got, want) {
		t.Errorf("%d %+v\nwant %+v", res.StatusCode, got, want)
	}
}

func equalJSON(t *testing.T, a, b any) bool {
	t.Helper()
	ja, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	jb, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return string(ja) == string(jb)
}

// A job that fails ends a stream with an error chunk and no [DONE], and a
// request without stream with the code's status, both in OpenAI's shape.
func TestChatJobFails(t *testing.T) {
	f := newChatFixture(t, nil)
	res := f.post(t.Context(), t, chatBody+`,"stream":true}`, nil)
	o := f.offer(t)
	f.w.Output(o.JobID, o.Gen, []byte(`"partial"`))
	f.w.End(o.JobID, o.Gen, core.CodeWorkerError, "the model crashed", nil)
	lines := dataLines(t, res.Body)
	if want := `{"error":{"message":"the model crashed","type":"server_error","param":null,"code":"worker_error"}}`; len(lines) != 3 || lines[2] != want {
		t.Errorf("data %q, want role, delta, then %s", lines, want)
	}

	done := make(chan *http.Response, 1)
	go func() { done <- f.post(t.Context(), t, chatBody+`}`, nil) }()
	o = f.offer(t)
	f.w.End(o.JobID, o.Gen, core.CodeRejected, "context too long", nil)
	res = <-done
	code, typ, param := openAIError(t, res)
	if res.StatusCode != 422 || code != "rejected" || typ != "invalid_request_error" || param != nil {
		t.Errorf("%d %s %s %v, want 422 rejected invalid_request_error", res.StatusCode, code, typ, param)
	}
}

// An output the front door cannot translate ends the stream with
// bad_output and cancels the job on its worker, saying why.
func TestChatBadOutputCancels(t *testing.T) {
	for _, stream := range []bool{true, false} {
		f := newChatFixture(t, nil)
		done := make(chan *http.Response, 1)
		body := chatBody + `}`
		if stream {
			body = chatBody + `,"stream":true}`
		}
		go func() { done <- f.post(t.Context(), t, body, nil) }()
		o := f.offer(t)
		f.w.Output(o.JobID, o.Gen, []byte(`{"tokens":[1,2]}`))
		f.cancelSent(t, o, "stream %v: the worker was not told to cancel", stream)
		res := <-done
		if stream {
			lines := dataLines(t, res.Body)
			if len(lines) != 2 || !strings.Contains(lines[1], `"code":"bad_output"`) {
				t.Errorf("data %q, want the role chunk and a bad_output error", lines)
			}
		} else if code, _, _ := openAIError(t, res); res.StatusCode != 502 || code != "bad_output" {
			t.Errorf("%d %s, want 502 bad_output", res.StatusCode, code)
		}
		v, err := f.s.e.View(o.JobID)
		if err != nil {
			t.Fatal(err)
		}
		if v.State != core.StateCancelled || !strings.Contains(v.Detail, "OpenAI-compatible stream ended") {
			t.Errorf("job %s %q, want cancelled by the front door", v.State, v.Detail)
		}
	}
}

// A client that leaves cancels the job on its worker, streamed or not.
func TestChatDisconnectCancels(t *testing.T) {
	for _, stream := range []bool{true, false} {
		f := newChatFixture(t, nil)
		ctx, cancel := context.WithCancel(t.Context())
		body := chatBody + `}`
		if stream {
			body = chatBody + `,"stream":true}`
		}
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.srv.URL+OpenAIPrefix+"/chat/completions", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			if res, err := f.srv.Client().Do(req); err == nil {
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
			}
		}()
		o := f.offer(t)
		f.w.Output(o.JobID, o.Gen, []byte(`"one "`))
		cancel()
		f.cancelSent(t, o, "stream %v: the client left and the worker was not told", stream)
	}
}

// openAIError decodes an OpenAI error response.
func openAIError(t *testing.T, res *http.Response) (code, typ string, param any) {
	t.Helper()
	if ct := res.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	var body struct {
		Error map[string]any `json:"error"`
	}
	if err := json.NewDecoder(res.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	code, _ = body.Error["code"].(string)
	typ, _ = body.Error["type"].(string)
	return code, typ, body.Error["param"]
}

// Every refusal under /openai/ is in OpenAI's shape, with the status of
// its code; our own routes keep problem+json.
func TestChatRefusals(t *testing.T) {
	cluster := &fakeCluster{
		nodes: []core.NodeInfo{{ID: "n2", State: core.StateOnline}},
		// The view lists model=big on n2, which this engine cannot route
		// to: a model that exists but that no worker can take now.
		consumers: map[string][]core.ConsumerInfo{"chat": {{ID: "c2", Node: "n2", Capabilities: core.Capabilities{"model": {"big"}}}}},
	}
	f := newChatFixture(t, cluster)
	const path = OpenAIPrefix + "/chat/completions"
	for _, tc := range []struct {
		name, method, path, ctype, body string
		header                          map[string]string
		status                          int
		code, typ                       string
		param                           any
		retryAfter                      string
	}{
		{"unknown model", "POST", path, "application/json", `{"model":"nope","messages":[{"role":"user","content":"a"}]}`, nil, 404, "model_not_found", "invalid_request_error", "model", ""},
		{"known model, no worker now", "POST", path, "application/json", `{"model":"big","messages":[{"role":"user","content":"a"}]}`, nil, 503, "no_capable_worker", "server_error", nil, "1"},
		{"malformed", "POST", path, "application/json", `{"model":`, nil, 400, "malformed_json", "invalid_request_error", nil, ""},
		{"n", "POST", path, "application/json", chatBody + `,"n":3}`, nil, 400, "invalid_field", "invalid_request_error", "n", ""},
		{"not JSON", "POST", path, "text/plain", chatBody + `}`, nil, 415, "unsupported_media_type", "invalid_request_error", nil, ""},
		{"TTL header", "POST", path, "application/json", chatBody + `}`, map[string]string{TTLHeader: "0"}, 422, "ttl_out_of_range", "invalid_request_error", TTLHeader, ""},
		{"affinity header too long", "POST", path, "application/json", chatBody + `}`, map[string]string{AffinityKeyHeader: strings.Repeat("k", 257)}, 400, "invalid_affinity_key", "invalid_request_error", AffinityKeyHeader, ""},
		{"user too long", "POST", path, "application/json", chatBody + `,"user":"` + strings.Repeat("u", 257) + `"}`, nil, 400, "invalid_affinity_key", "invalid_request_error", "user", ""},
		{"user not a string", "POST", path, "application/json", chatBody + `,"user":7}`, nil, 400, "invalid_field", "invalid_request_error", "user", ""},
		{"priority header out of range", "POST", path, "application/json", chatBody + `}`, map[string]string{PriorityHeader: "9"}, 422, "priority_out_of_range", "invalid_request_error", PriorityHeader, ""},
		{"priority header not a number", "POST", path, "application/json", chatBody + `}`, map[string]string{PriorityHeader: "high"}, 400, "invalid_field", "invalid_request_error", PriorityHeader, ""},
		{"no such route", "POST", OpenAIPrefix + "/embeddings", "application/json", `{}`, nil, 404, "not_found", "invalid_request_error", nil, ""},
		{"no such method", "GET", path, "", "", nil, 405, "method_not_allowed", "invalid_request_error", nil, ""},
		{"unknown model by name", "GET", OpenAIPrefix + "/models/nope", "", "", nil, 404, "model_not_found", "invalid_request_error", "model", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := f.request(t.Context(), t, tc.method, tc.path, tc.ctype, tc.body, tc.header)
			code, typ, param := openAIError(t, res)
			if res.StatusCode != tc.status || code != tc.code || typ != tc.typ || param != tc.param {
				t.Errorf("%d %s %s %v, want %d %s %s %v", res.StatusCode, code, typ, param, tc.status, tc.code, tc.typ, tc.param)
			}
			if got := res.Header.Get("Retry-After"); got != tc.retryAfter {
				t.Errorf("Retry-After %q, want %q", got, tc.retryAfter)
			}
		})
	}
	select {
	case o := <-f.conn.offers:
		t.Errorf("a refused request created a job: %+v", o)
	default:
	}
	if res := f.request(t.Context(), t, "GET", "/v1/nope", "", "", nil); res.Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("our own 404 is %q, want problem+json", res.Header.Get("Content-Type"))
	}
}

// A full queue is 429 queue_full with Retry-After, which OpenAI's SDKs
// wait for before they retry.
func TestChatQueueFull(t *testing.T) {
	ecfg := core.DefaultConfig()
	ecfg.Limits.MaxQueueDepth = 1
	f := newChatFixtureWith(t, nil, ecfg)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// The worker holds 4 (its concurrency), the queue 1 more.
	for i := range 5 {
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.srv.URL+OpenAIPrefix+"/chat/completions", strings.NewReader(chatBody+`}`))
			req.Header.Set("Content-Type", "application/json")
			if res, err := f.srv.Client().Do(req); err == nil {
				res.Body.Close()
			}
		}()
		if i < 4 {
			f.offer(t)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for depth := 0; depth < 1; {
		if time.Now().After(deadline) {
			t.Fatal("the fifth job never waited in the queue")
		}
		time.Sleep(5 * time.Millisecond)
		for _, q := range f.s.e.QueueStats() {
			if q.Name == DefaultOpenAIQueue {
				depth = q.Depth
			}
		}
	}
	res := f.post(t.Context(), t, chatBody+`}`, nil)
	code, typ, _ := openAIError(t, res)
	if res.StatusCode != 429 || code != "queue_full" || typ != "rate_limit_error" || res.Header.Get("Retry-After") != "1" {
		t.Errorf("%d %s %s Retry-After %q, want 429 queue_full rate_limit_error 1", res.StatusCode, code, typ, res.Header.Get("Retry-After"))
	}
}

// The listing is the model capability of the front door's queue's
// consumers on online nodes, deduplicated and sorted; no other queue's.
func TestModels(t *testing.T) {
	caps := func(models ...string) core.Capabilities { return core.Capabilities{"model": models, "gpu": {"a100"}} }
	cluster := &fakeCluster{
		nodes: []core.NodeInfo{{ID: "n1", State: core.StateOnline}, {ID: "n2", State: core.StateOnline}, {ID: "n3", State: core.StateSpare}},
		consumers: map[string][]core.ConsumerInfo{
			"chat": {
				{ID: "c1", Node: "n1", Capabilities: caps("demo", "org/llama-3")},
				{ID: "c2", Node: "n2", Capabilities: caps("demo")},
				{ID: "c3", Node: "n3", Capabilities: caps("only-on-a-spare-node")},
				{ID: "c4", Node: "n4-not-in-view", Capabilities: caps("only-on-an-unknown-node")},
			},
			"other": {{ID: "c5", Node: "n1", Capabilities: caps("elsewhere")}},
		},
	}
	f := newChatFixture(t, cluster)
	res, err := f.srv.Client().Get(f.srv.URL + OpenAIPrefix + "/models")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	want := `{"object":"list","data":[{"id":"demo","object":"model","created":0,"owned_by":"switchyard"},{"id":"org/llama-3","object":"model","created":0,"owned_by":"switchyard"}]}`
	if res.StatusCode != 200 || strings.TrimSpace(string(b)) != want {
		t.Errorf("%d %s\nwant %s", res.StatusCode, b, want)
	}
	// As it is, and escaped as an SDK sends it.
	for _, path := range []string{"/models/org/llama-3", "/models/org%2Fllama-3"} {
		res, err = f.srv.Client().Get(f.srv.URL + OpenAIPrefix + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var m OpenAIModel
		if err := json.NewDecoder(res.Body).Decode(&m); err != nil || res.StatusCode != 200 || m.ID != "org/llama-3" || m.Object != "model" {
			t.Errorf("%s: %d %+v %v", path, res.StatusCode, m, err)
		}
	}
}
