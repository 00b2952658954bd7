package integration_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/worker"
)

// These tests drive the OpenAI-compatible front door with the official Go
// SDK, unchanged but for its base URL, against real nodes and SDK workers.

// sdkClient is an OpenAI SDK client of n's front door. It sends an API
// key, as every SDK call does; no node checks one yet. It never retries:
// a test sees the first answer.
func sdkClient(n *switchyard.Node) openai.Client {
	return openai.NewClient(
		option.WithBaseURL(baseURL(n)+"/openai/v1/"),
		option.WithAPIKey("sk-switchyard-test"),
		option.WithMaxRetries(0),
	)
}

// startChatWorker runs the demo chat handler on the front door's queue.
func startChatWorker(tb testing.TB, n *switchyard.Node, delay time.Duration) {
	tb.Helper()
	MustStartWorker(tb, n, worker.Config{Queue: "chat", Name: "chat", Concurrency: 4}, worker.Chat(delay))
}

// userSays is a request for model demo with one user message.
func userSays(text string) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:    "demo",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("echo me"), openai.UserMessage(text)},
	}
}

// chunkArrival is one chunk and when the SDK handed it over.
type chunkArrival struct {
	chunk openai.ChatCompletionChunk
	at    time.Time
}

// streamCompletion reads a whole streamed completion through the SDK.
func streamCompletion(tb testing.TB, client openai.Client, params openai.ChatCompletionNewParams) ([]chunkArrival, openai.ChatCompletion) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s := client.Chat.Completions.NewStreaming(ctx, params)
	defer s.Close()
	var got []chunkArrival
	var acc openai.ChatCompletionAccumulator
	for s.Next() {
		got = append(got, chunkArrival{s.Current(), time.Now()})
		if !acc.AddChunk(s.Current()) {
			tb.Fatalf("the SDK's accumulator refused chunk %d: %s", len(got), s.Current().RawJSON())
		}
	}
	if err := s.Err(); err != nil {
		tb.Fatalf("stream: %v", err)
	}
	return got, acc.ChatCompletion
}

// A streamed completion arrives through the SDK token by token, each word
// in its own chunk as the worker sends it, and ends: role first, finish
// reason last, then the usage.
func TestOpenAISDKStreams(t *testing.T) {
	n := MustStartNode(t, nil)
	const delay = 40 * time.Millisecond
	startChatWorker(t, n, delay)
	params := userSays("the quick brown fox jumps")
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	chunks, whole := streamCompletion(t, sdkClient(n), params)

	var deltas []string
	var times []time.Time
	for _, c := range chunks {
		if len(c.chunk.Choices) == 1 && c.chunk.Choices[0].Delta.Content != "" {
			deltas = append(deltas, c.chunk.Choices[0].Delta.Content)
			times = append(times, c.at)
		}
	}
	if want := []string{"the ", "quick ", "brown ", "fox ", "jumps"}; !slices.Equal(deltas, want) {
		t.Fatalf("deltas %q, want %q", deltas, want)
	}
	// Streamed, not buffered: the words arrive spread over the worker's
	// delays (4 of them between first and last; at least half, for a
	// loaded machine), not in one burst at the end.
	if spread := times[len(times)-1].Sub(times[0]); spread < 2*delay {
		t.Errorf("first to last word in %v: they came in a burst, not as the worker sent them (%v apart)", spread, delay)
	}
	first, last, usage := chunks[0].chunk, chunks[len(chunks)-2].chunk, chunks[len(chunks)-1].chunk
	if first.Choices[0].Delta.Role != "assistant" || !strings.HasPrefix(first.ID, "chatcmpl-j_") || first.Model != "demo" {
		t.Errorf("first chunk %s: want the assistant role, id chatcmpl-<job id>, model demo", first.RawJSON())
	}
	if len(last.Choices) != 1 || last.Choices[0].FinishReason != "stop" {
		t.Errorf("last choice chunk %s: want finish_reason stop", last.RawJSON())
	}
	if len(usage.Choices) != 0 || usage.Usage.PromptTokens != 7 || usage.Usage.CompletionTokens != 5 || usage.Usage.TotalTokens != 12 {
		t.Errorf("usage chunk %s: want no choices and 7 + 5 tokens", usage.RawJSON())
	}
	if got := whole.Choices[0].Message.Content; got != "the quick brown fox jumps" {
		t.Errorf("the SDK accumulated %q", got)
	}
	// Counted once the writer has returned, a moment after the client
	// read [DONE].
	waitFor(t, 5*time.Second, "the stream counted as ended at its terminal event", func() bool {
		return metric(t, n, "switchyard_stream_ended_total", map[string]string{"transport": "openai", "reason": "terminal"}) == 1
	})
}

// Without stream, one chat.completion carries the whole text and usage;
// max_tokens reaches the worker, which stops there.
func TestOpenAISDKNotStreamed(t *testing.T) {
	n := MustStartNode(t, nil)
	startChatWorker(t, n, time.Millisecond)
	client := sdkClient(n)
	c, err := client.Chat.Completions.New(t.Context(), userSays("hello through switchyard"))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Choices) != 1 || c.Choices[0].Message.Content != "hello through switchyard" || c.Choices[0].FinishReason != "stop" ||
		c.Choices[0].Message.Role != "assistant" || c.Object != "chat.completion" {
		t.Errorf("completion %s", c.RawJSON())
	}
	if c.Usage.PromptTokens != 5 || c.Usage.CompletionTokens != 3 || c.Usage.TotalTokens != 8 {
		t.Errorf("usage %+v, want 5 + 3", c.Usage)
	}
	params := userSays("one two three four five")
	params.MaxCompletionTokens = openai.Int(2)
	c, err = client.Chat.Completions.New(t.Context(), params)
	if err != nil {
		t.Fatal(err)
	}
	if c.Choices[0].Message.Content != "one two" || c.Choices[0].FinishReason != "length" || c.Usage.CompletionTokens != 2 {
		t.Errorf("with max_completion_tokens 2: %s", c.RawJSON())
	}
}

// Cancelling the SDK's context cancels the job on its worker, whether the
// SDK streams or waits for the whole answer.
func TestOpenAISDKCancel(t *testing.T) {
	n := MustStartNode(t, nil)
	started := make(chan string, 1)
	cancelled := make(chan time.Time, 1)
	MustStartWorker(t, n, worker.Config{Queue: "chat", Concurrency: 2}, func(ctx context.Context, job *worker.Job, out *worker.Output) (any, error) {
		started <- job.ID
		if err := out.Send(ctx, "first "); err != nil {
			return nil, err
		}
		<-ctx.Done()
		cancelled <- time.Now()
		return nil, ctx.Err()
	})
	client := sdkClient(n)
	for _, streamed := range []bool{true, false} {
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		if streamed {
			s := client.Chat.Completions.NewStreaming(ctx, userSays("never finished"))
			// Read until the worker's first word is in: the job is running.
			for s.Next() && (len(s.Current().Choices) == 0 || s.Current().Choices[0].Delta.Content == "") {
			}
			go func() {
				for s.Next() {
				}
				done <- s.Err()
			}()
		} else {
			go func() {
				_, err := client.Chat.Completions.New(ctx, userSays("never finished"))
				done <- err
			}()
		}
		id := recvWithin(t, started, 10*time.Second, "the worker started the job")
		cancel()
		left := time.Now()
		at := recvWithin(t, cancelled, 5*time.Second, "the worker's context cancelled")
		t.Logf("streamed %v: the worker saw the cancel %v after the SDK's context ended", streamed, at.Sub(left))
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("streamed %v: the SDK returned %v, want context.Canceled", streamed, err)
		}
		waitFor(t, 5*time.Second, "job "+id+" cancelled", func() bool {
			var view struct{ State string }
			getJSON(t, baseURL(n)+"/v1/jobs/"+id, &view)
			return view.State == "cancelled"
		})
	}
}

// Refusals reach the SDK as its typed error, with the status, type, code
// and param it expects.
func TestOpenAISDKErrors(t *testing.T) {
	n := MustStartNode(t, nil)
	startChatWorker(t, n, time.Millisecond)
	client := sdkClient(n)
	unknown := userSays("hi")
	unknown.Model = "gpt-nonexistent"
	twoChoices := userSays("hi")
	twoChoices.N = openai.Int(2)
	tools := userSays("hi")
	tools.Tools = []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{Name: "f"})}
	for _, tc := range []struct {
		name             string
		params           openai.ChatCompletionNewParams
		status           int
		typ, code, param string
	}{
		{"unknown model", unknown, 404, "invalid_request_error", "model_not_found", "model"},
		{"n above 1", twoChoices, 400, "invalid_request_error", "invalid_field", "n"},
		{"tools", tools, 400, "invalid_request_error", "invalid_field", "tools"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, streamed := range []bool{false, true} {
				var err error
				if streamed {
					s := client.Chat.Completions.NewStreaming(t.Context(), tc.params)
					for s.Next() {
					}
					err = s.Err()
				} else {
					_, err = client.Chat.Completions.New(t.Context(), tc.params)
				}
				var apiErr *openai.Error
				if !errors.As(err, &apiErr) {
					t.Fatalf("streamed %v: %v (%T), want *openai.Error", streamed, err, err)
				}
				if apiErr.StatusCode != tc.status || apiErr.Type != tc.typ || apiErr.Code != tc.code || apiErr.Param != tc.param || apiErr.Message == "" {
					t.Errorf("streamed %v: %d type %q code %q param %q (%q), want %d %q %q %q", streamed,
						apiErr.StatusCode, apiErr.Type, apiErr.Code, apiErr.Param, apiErr.Message, tc.status, tc.typ, tc.code, tc.param)
				}
			}
		})
	}
	_, err := client.Models.Get(t.Context(), "gpt-nonexistent")
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "model_not_found" {
		t.Errorf("models.get of an unknown model: %v", err)
	}
}

// waitModels waits until n's front door lists want: the listing is the
// catalog view, which sees a worker's registration a moment after it is
// written.
func waitModels(tb testing.TB, client openai.Client, want string) []string {
	tb.Helper()
	var ids []string
	waitFor(tb, 5*time.Second, "models.list shows "+want, func() bool {
		page, err := client.Models.List(context.Background())
		if err != nil {
			tb.Fatalf("models.list: %v", err)
		}
		ids = ids[:0]
		for _, m := range page.Data {
			ids = append(ids, m.ID)
		}
		return slices.Contains(ids, want)
	})
	return ids
}

// models.list shows the models the front door's workers offer, and only
// theirs.
func TestOpenAISDKModels(t *testing.T) {
	n := MustStartNode(t, nil)
	startChatWorker(t, n, time.Millisecond)
	MustStartWorker(t, n, worker.Config{Queue: "chat", Name: "big", Capabilities: []string{"model=demo", "model=big-model"}}, worker.Chat(0))
	MustStartWorker(t, n, worker.Config{Queue: "demo", Name: "elsewhere", Capabilities: []string{"model=not-on-the-chat-queue"}}, worker.Tokens(0))
	client := sdkClient(n)
	if ids := waitModels(t, client, "big-model"); !slices.Equal(ids, []string{"big-model", "demo"}) {
		t.Errorf("models %v, want big-model and demo, once each", ids)
	}
	m, err := client.Models.Get(t.Context(), "demo")
	if err != nil || m.ID != "demo" || m.OwnedBy != "switchyard" {
		t.Errorf("models.get demo: %+v %v", m, err)
	}
}

// The SDK talks to n1; the only chat worker is on n3: the completion
// streams across the cluster, and n1 lists n3's model.
func TestOpenAISDKCrossNode(t *testing.T) {
	nodes := startCluster(t, 3, nil)
	n1, n3 := nodes[0], nodes[2]
	startChatWorker(t, n3, 10*time.Millisecond)
	waitFor(t, 5*time.Second, "n3 dispatches chat in n1's view", func() bool { return dispatcherOf(n1, "chat") == "n3" })
	client := sdkClient(n1)
	if ids := waitModels(t, client, "demo"); !slices.Equal(ids, []string{"demo"}) {
		t.Errorf("n1 lists %v, want demo", ids)
	}
	before := peerMessages(t, nodes)
	_, whole := streamCompletion(t, client, userSays("routed across the cluster"))
	if got := whole.Choices[0].Message.Content; got != "routed across the cluster" {
		t.Errorf("content %q", got)
	}
	if fwd := peerMessages(t, nodes)["forward"] - before["forward"]; fwd != 1 {
		t.Errorf("%v forwards, want the one from n1 to n3", fwd)
	}
	c, err := client.Chat.Completions.New(t.Context(), userSays("and back again"))
	if err != nil || c.Choices[0].Message.Content != "and back again" {
		t.Errorf("not streamed across the cluster: %v %v", c, err)
	}
}
