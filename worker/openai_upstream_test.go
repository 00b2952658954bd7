package worker_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
	"github.com/switchyard/switchyard/worker"
)

// The wrapper of Example_openAIUpstream, run as a worker: the upstream gets
// the job's input with stream and include_usage set, and its deltas, finish
// reason and usage come back as the job's outputs and result.
func TestOpenAIUpstream(t *testing.T) {
	got := make(chan map[string]any, 1)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req map[string]any
		_ = json.NewDecoder(r.Body).Decode(&req)
		got <- req
		w.Header().Set("Content-Type", "text/event-stream")
		for _, c := range upstreamChunks {
			fmt.Fprintf(w, "data: %s\n\n", c)
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	defer upstream.Close()
	_, _, s := startOnFake(t, worker.Config{}, openAIUpstream(upstream.URL, upstream.Client()))
	s.sendJob(t, &pb.Job{JobId: "u", Generation: 1, Input: []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`)})
	s.expectAccept(t, "u", 1)
	for _, want := range []string{`"Hello"`, `" there"`} {
		if o := s.next(t).GetOutput(); o == nil || string(o.Data) != want {
			t.Fatalf("output %v, want %s", o, want)
		}
	}
	c := s.next(t).GetComplete()
	if want := `{"finish_reason":"stop","usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}`; c == nil || string(c.Result) != want {
		t.Fatalf("complete %v, want result %s", c, want)
	}
	req := recv(t, got, "the upstream request")
	b, _ := json.Marshal(req)
	if want := `{"max_tokens":4,"messages":[{"content":"hi","role":"user"}],"model":"m","stream":true,"stream_options":{"include_usage":true}}`; string(b) != want {
		t.Errorf("upstream got %s, want %s", b, want)
	}
}

// Cancelling the job ends the upstream request: the model stops too.
func TestOpenAIUpstreamCancel(t *testing.T) {
	cancelled := make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: %s\n\n", upstreamChunks[1])
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		close(cancelled)
	}))
	defer upstream.Close()
	_, _, s := startOnFake(t, worker.Config{}, openAIUpstream(upstream.URL, upstream.Client()))
	s.sendJob(t, &pb.Job{JobId: "u", Generation: 1, Input: []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)})
	s.expectAccept(t, "u", 1)
	if o := s.next(t).GetOutput(); o == nil || string(o.Data) != `"Hello"` {
		t.Fatalf("output %v", o)
	}
	s.sendCancel(t, "u", 1, "cancelled")
	if fl := s.expectFail(t, "u", 1); fl.Code != "cancelled" {
		t.Fatalf("code %q, want cancelled", fl.Code)
	}
	recv(t, cancelled, "the upstream request's end")
}

// An upstream error, before or during the stream, fails the job with it.
func TestOpenAIUpstreamErrors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		code    string
	}{
		{"status", func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, `{"error":{"message":"no such model"}}`, http.StatusNotFound)
		}, "upstream_error"},
		{"error chunk", func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintf(w, "data: %s\n\ndata: {\"error\":{\"message\":\"overloaded\"}}\n\n", upstreamChunks[1])
		}, "upstream_error"},
		{"cut short", func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintf(w, "data: %s\n\n", upstreamChunks[1])
		}, "bad_upstream"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			upstream := httptest.NewServer(tc.handler)
			defer upstream.Close()
			_, _, s := startOnFake(t, worker.Config{}, openAIUpstream(upstream.URL, upstream.Client()))
			s.sendJob(t, &pb.Job{JobId: "e", Generation: 1, Input: []byte(`{"model":"m","messages":[]}`)})
			s.expectAccept(t, "e", 1)
			m := s.next(t)
			if m.GetOutput() != nil {
				m = s.next(t)
			}
			if fl := m.GetFail(); fl == nil || fl.Code != tc.code {
				t.Fatalf("got %v, want Fail %s", m, tc.code)
			}
		})
	}
}
