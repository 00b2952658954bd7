package worker_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os/signal"
	"strings"
	"syscall"

	"github.com/switchyard/switchyard/worker"
)

// openAIUpstream wraps a model server that streams OpenAI chat
// completions itself (vLLM, llama.cpp's server, Ollama, a hosted API) as a
// Switchyard chat worker: the job's input is the client's request, so it
// goes upstream nearly as it came, and each content delta of the upstream
// stream is re-emitted as an output. Cancelling the job cancels ctx, which
// ends the upstream request, so the model stops generating too.
func openAIUpstream(baseURL string, client *http.Client) worker.Handler {
	return func(ctx context.Context, job *worker.Job, out *worker.Output) (any, error) {
		var req map[string]any
		if err := json.Unmarshal(job.Input, &req); err != nil {
			return nil, worker.Fail("bad_input", err.Error())
		}
		// The node took stream and stream_options for itself: ask the
		// upstream to stream, with the usage at the end.
		req["stream"] = true
		req["stream_options"] = map[string]any{"include_usage": true}
		body, err := json.Marshal(req)
		if err != nil {
			return nil, err
		}
		hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"/chat/completions", bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		hreq.Header.Set("Content-Type", "application/json")
		res, err := client.Do(hreq)
		if err != nil {
			return nil, err
		}
		defer res.Body.Close()
		if res.StatusCode != http.StatusOK {
			msg, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
			return nil, worker.Fail("upstream_error", fmt.Sprintf("%s: %s", res.Status, msg))
		}
		return relayChatStream(res.Body, func(delta string) error { return out.Send(ctx, delta) })
	}
}

// relayChatStream reads an OpenAI chat completion stream, calls emit with
// each content delta, and returns the finish reason and usage it reported.
func relayChatStream(r io.Reader, emit func(delta string) error) (worker.ChatResult, error) {
	var res worker.ChatResult
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue // blank lines, comments, event names
		}
		if data == "[DONE]" {
			return res, nil
		}
		var chunk struct {
			Choices []struct {
				Delta        struct{ Content string }
				FinishReason string `json:"finish_reason"`
			}
			Usage *worker.ChatUsage
			Error *struct{ Message string }
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			return res, worker.Fail("bad_upstream", err.Error())
		}
		if chunk.Error != nil {
			return res, worker.Fail("upstream_error", chunk.Error.Message)
		}
		if chunk.Usage != nil {
			res.Usage = chunk.Usage
		}
		for _, c := range chunk.Choices {
			if c.Delta.Content != "" {
				if err := emit(c.Delta.Content); err != nil {
					return res, err
				}
			}
			if c.FinishReason != "" {
				res.FinishReason = c.FinishReason
			}
		}
	}
	if err := sc.Err(); err != nil {
		return res, err
	}
	return res, worker.Fail("bad_upstream", "the upstream stream ended without [DONE]")
}

// fakeUpstream is a model server that streams chunks as OpenAI does.
func fakeUpstream(chunks ...string) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, c := range chunks {
			fmt.Fprintf(w, "data: %s\n\n", c)
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
}

// upstreamChunks is what a model server streams for "Hello there".
var upstreamChunks = []string{
	`{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`,
	`{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hello"},"finish_reason":null}]}`,
	`{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" there"},"finish_reason":null}]}`,
	`{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
	`{"id":"c1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}`,
}

// A model server that speaks OpenAI's streaming chat completions, wrapped
// as a worker: every delta it streams is re-emitted as the job's output,
// and its finish reason and usage become the job's result.
func Example_openAIUpstream() {
	upstream := fakeUpstream(upstreamChunks...)
	defer upstream.Close()

	res, err := http.Post(upstream.URL+"/chat/completions", "application/json", strings.NewReader(`{"model":"m","stream":true}`))
	if err != nil {
		log.Fatal(err)
	}
	defer res.Body.Close()
	result, err := relayChatStream(res.Body, func(delta string) error {
		fmt.Printf("output %q\n", delta)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	b, _ := json.Marshal(result)
	fmt.Printf("result %s\n", b)
	// Output:
	// output "Hello"
	// output " there"
	// result {"finish_reason":"stop","usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}
}

// The wrapper as a running worker, serving the model its upstream has.
func Example_openAIUpstreamWorker() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	err := worker.Run(ctx, worker.Config{
		Server: "localhost:9090", Queue: "chat", Capabilities: []string{"model=llama-3.1-8b"}, Concurrency: 8,
	}, openAIUpstream("http://localhost:8000/v1", http.DefaultClient))
	if err != nil {
		log.Fatal(err)
	}
}
