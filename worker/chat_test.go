package worker_test

import (
	"encoding/json"
	"strings"
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
			_, _, s := startOnFake(t, worker.Config{}, worker.Chat(time.Millisecond))
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

// A chat job refused for its input says what is wrong and what a chat
// request looks like, in JSON's words: never a Go type.
func TestChatBadInput(t *testing.T) {
	for _, tc := range []struct{ name, input, says string }{
		{"a string", `"hello"`, `input is a string: want a chat request, {"messages": [{"role": "user", "content": "..."}]}`},
		{"not JSON", `{"messages":`, `input is not JSON: want a chat request`},
		{"no messages", `{"model":"demo"}`, `input "messages" is missing: want an array of messages`},
		{"messages not an array", `{"messages":"hello"}`, `input "messages" is a string: want an array of messages`},
		{"a message not an object", `{"messages":["hello"]}`, `input "messages"[0] is a string: want {"role": "user", "content": "..."}`},
		{"role not a string", `{"messages":[{"role":1,"content":"hi"}]}`, `input "messages"[0] "role" is a number: want a string`},
		{"no role", `{"messages":[{"content":"hi"}]}`, `input "messages"[0] "role" is missing`},
		{"content a number", `{"messages":[{"role":"user","content":7}]}`, `"content" is a number: want a string, or an array of content parts`},
		{"model a number", `{"model":7,"messages":[{"role":"user","content":"hi"}]}`, `input "model" is a number: want a string`},
		{"max_tokens negative", `{"max_tokens":-1,"messages":[{"role":"user","content":"hi"}]}`, `input "max_tokens" is -1: want a whole number`},
		{"no user message", `{"messages":[{"role":"system","content":"hi"}]}`, `the conversation has no user message`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, s := startOnFake(t, worker.Config{}, worker.Chat(0))
			s.sendJob(t, &pb.Job{JobId: "b", Generation: 1, Input: []byte(tc.input)})
			s.expectAccept(t, "b", 1)
			fl := s.expectFail(t, "b", 1)
			if fl.Code != "bad_input" || !strings.Contains(fl.Message, tc.says) {
				t.Fatalf("failed %q: %s\nwant bad_input saying %s", fl.Code, fl.Message, tc.says)
			}
			for _, goWords := range []string{"Go value", "Go struct", "worker.", "ChatInput", "unmarshal"} {
				if strings.Contains(fl.Message, goWords) {
					t.Errorf("the message names Go's types (%q): %s", goWords, fl.Message)
				}
			}
		})
	}
}

func TestChatCancelledPromptly(t *testing.T) {
	cancelledPromptly(t, worker.Chat(10*time.Second), &pb.Job{JobId: "c", Generation: 1, Input: []byte(`{"messages":[{"role":"user","content":"a b c"}]}`)})
}
