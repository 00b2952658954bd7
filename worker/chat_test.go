package worker_test

import (
	"encoding/json"
	"testing"
	"time"

	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
	"github.com/switchyard/switchyard/worker"
)

func TestChat(t *testing.T) {
	for _, tc := range []struct {
		name, input string
		want        []string
		result      string
	}{
		{
			name:   "last user message",
			input:  `{"model":"demo","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"old words"},{"role":"assistant","content":"ok"},{"role":"user","content":"hello  big world"}],"temperature":0.5}`,
			want:   []string{`"hello "`, `"big "`, `"world"`},
			result: `{"finish_reason":"stop","usage":{"prompt_tokens":8,"completion_tokens":3,"total_tokens":11}}`,
		},
		{
			name:   "max_tokens",
			input:  `{"model":"demo","messages":[{"role":"user","content":"one two three four"}],"max_tokens":2}`,
			want:   []string{`"one "`, `"two"`},
			result: `{"finish_reason":"length","usage":{"prompt_tokens":4,"completion_tokens":2,"total_tokens":6}}`,
		},
		{
			name:   "max_tokens above the words",
			input:  `{"model":"demo","messages":[{"role":"user","content":"one two"}],"max_tokens":9}`,
			want:   []string{`"one "`, `"two"`},
			result: `{"finish_reason":"stop","usage":{"prompt_tokens":2,"completion_tokens":2,"total_tokens":4}}`,
		},
		{
			name:   "content parts",
			input:  `{"model":"demo","messages":[{"role":"user","content":[{"type":"text","text":"a b"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"c"}]}]}`,
			want:   []string{`"a "`, `"b "`, `"c"`},
			result: `{"finish_reason":"stop","usage":{"prompt_tokens":3,"completion_tokens":3,"total_tokens":6}}`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeNode()
			addr := f.start(t)
			startWorker(t, addr, worker.Config{}, worker.Chat(time.Millisecond))
			s := f.nextSession(t)
			s.sendJob(t, &pb.Job{JobId: "c", Generation: 1, Input: []byte(tc.input)})
			s.expectAccept(t, "c", 1)
			for i, w := range tc.want {
				if o := s.next(t).GetOutput(); o == nil || string(o.Data) != w {
					t.Fatalf("output %d = %v, want %s", i, o, w)
				}
			}
			c := s.next(t).GetComplete()
			if c == nil || string(c.Result) != tc.result {
				t.Fatalf("complete %v, want result %s", c, tc.result)
			}
			var res worker.ChatResult
			if err := json.Unmarshal(c.Result, &res); err != nil || res.Usage == nil {
				t.Fatalf("result does not read as a ChatResult: %v", err)
			}
		})
	}
}

func TestChatBadInput(t *testing.T) {
	for _, tc := range []struct{ name, input string }{
		{"not an object", `"hello"`},
		{"messages not an array", `{"messages":"hello"}`},
		{"no user message", `{"messages":[{"role":"system","content":"hi"}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeNode()
			addr := f.start(t)
			startWorker(t, addr, worker.Config{}, worker.Chat(0))
			s := f.nextSession(t)
			s.sendJob(t, &pb.Job{JobId: "b", Generation: 1, Input: []byte(tc.input)})
			s.expectAccept(t, "b", 1)
			if fl := s.expectFail(t, "b", 1); fl.Code != "bad_input" {
				t.Fatalf("code = %q (%s), want bad_input", fl.Code, fl.Message)
			}
		})
	}
}

func TestChatCancelledPromptly(t *testing.T) {
	f := newFakeNode()
	addr := f.start(t)
	startWorker(t, addr, worker.Config{}, worker.Chat(10*time.Second))
	s := f.nextSession(t)
	s.sendJob(t, &pb.Job{JobId: "c", Generation: 1, Input: []byte(`{"messages":[{"role":"user","content":"a b c"}]}`)})
	s.expectAccept(t, "c", 1)
	start := time.Now()
	s.sendCancel(t, "c", 1, "cancelled")
	if fl := s.expectFail(t, "c", 1); fl.Code != "cancelled" {
		t.Fatalf("code = %q, want cancelled", fl.Code)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("cancel took %s: the 10s delay was not interrupted", d)
	}
}
