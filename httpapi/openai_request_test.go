package httpapi

import (
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/switchyard/switchyard/core"
)

// A request becomes the worker's input: every field but the ones the node
// acts on, passed as it came, with max_tokens normalized; keys sorted, so
// the same request is the same input.
func TestParseChatRequest(t *testing.T) {
	for _, tc := range []struct {
		name, body   string
		stream, usag bool
		input        string
	}{
		{
			name:  "minimal",
			body:  `{"model":"demo","messages":[{"role":"user","content":"hi"}]}`,
			input: `{"messages":[{"role":"user","content":"hi"}],"model":"demo"}`,
		},
		{
			name: "streamed with usage, sampling passed through",
			body: `{"model":"org/m-1:q4","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"}]}],` +
				`"stream":true,"stream_options":{"include_usage":true},"n":1,"temperature":0.2,"top_p":1,"stop":["\n"],"seed":7,"user":"u",` +
				`"response_format":{"type":"text"},"a_field_from_the_future":[1],"tools":[],"tool_choice":"none","logprobs":false,"modalities":["text"]}`,
			stream: true, usag: true,
			input: `{"a_field_from_the_future":[1],"logprobs":false,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"}]}],` +
				`"modalities":["text"],"model":"org/m-1:q4","response_format":{"type":"text"},"seed":7,"stop":["\n"],"temperature":0.2,"tool_choice":"none","tools":[],"top_p":1,"user":"u"}`,
		},
		{
			name:  "max_tokens as is",
			body:  `{"model":"demo","messages":[{"role":"user","content":"hi"}],"max_tokens":3}`,
			input: `{"max_tokens":3,"messages":[{"role":"user","content":"hi"}],"model":"demo"}`,
		},
		{
			name:  "max_completion_tokens wins and becomes max_tokens",
			body:  `{"model":"demo","messages":[{"role":"assistant","content":null},{"role":"user","content":"hi"}],"max_tokens":9,"max_completion_tokens":4}`,
			input: `{"max_tokens":4,"messages":[{"role":"assistant","content":null},{"role":"user","content":"hi"}],"model":"demo"}`,
		},
		{
			name:  "stream false, stop a string",
			body:  `{"model":"demo","messages":[{"role":"user","content":"hi"}],"stream":false,"stop":"."}`,
			input: `{"messages":[{"role":"user","content":"hi"}],"model":"demo","stop":"."}`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := parseChatRequest([]byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if req.stream != tc.stream || req.includeUsage != tc.usag {
				t.Errorf("stream %v include_usage %v, want %v %v", req.stream, req.includeUsage, tc.stream, tc.usag)
			}
			if string(req.input) != tc.input {
				t.Errorf("input\n got %s\nwant %s", req.input, tc.input)
			}
		})
	}
}

// Every refusal has its code and names the field at fault.
func TestParseChatRequestRefusals(t *testing.T) {
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	for _, tc := range []struct {
		name, body, field string
		code              core.Code
	}{
		{"not JSON", `{"model":`, "", core.CodeMalformedJSON},
		{"not an object", `["model"]`, "", core.CodeMalformedJSON},
		{"null", `null`, "", core.CodeMalformedJSON},
		{"trailing data", `{"model":"demo",` + msgs + `} {}`, "", core.CodeMalformedJSON},
		{"no model", `{` + msgs + `}`, "model", core.CodeInvalidField},
		{"model not a string", `{"model":3,` + msgs + `}`, "model", core.CodeInvalidField},
		{"model not a capability", `{"model":"gpt 4",` + msgs + `}`, "model", core.CodeInvalidField},
		{"no messages", `{"model":"demo"}`, "messages", core.CodeMissingInput},
		{"empty messages", `{"model":"demo","messages":[]}`, "messages", core.CodeMissingInput},
		{"messages not an array", `{"model":"demo","messages":"hi"}`, "messages", core.CodeInvalidField},
		{"unknown role", `{"model":"demo","messages":[{"role":"user","content":"a"},{"role":"robot","content":"b"}]}`, "messages[1].role", core.CodeInvalidField},
		{"content a number", `{"model":"demo","messages":[{"role":"user","content":3}]}`, "messages[0].content", core.CodeInvalidField},
		{"n 2", `{"model":"demo",` + msgs + `,"n":2}`, "n", core.CodeInvalidField},
		{"max_tokens 0", `{"model":"demo",` + msgs + `,"max_tokens":0}`, "max_tokens", core.CodeInvalidField},
		{"max_completion_tokens -1", `{"model":"demo",` + msgs + `,"max_completion_tokens":-1}`, "max_completion_tokens", core.CodeInvalidField},
		{"temperature a string", `{"model":"demo",` + msgs + `,"temperature":"hot"}`, "temperature", core.CodeInvalidField},
		{"stream_options without stream", `{"model":"demo",` + msgs + `,"stream_options":{"include_usage":true}}`, "stream_options", core.CodeInvalidField},
		{"stop a number", `{"model":"demo",` + msgs + `,"stop":1}`, "stop", core.CodeInvalidField},
		{"stop an array of numbers", `{"model":"demo",` + msgs + `,"stop":[1]}`, "stop", core.CodeInvalidField},
		{"tools", `{"model":"demo",` + msgs + `,"tools":[{"type":"function","function":{"name":"f"}}]}`, "tools", core.CodeInvalidField},
		{"functions", `{"model":"demo",` + msgs + `,"functions":[{"name":"f"}]}`, "functions", core.CodeInvalidField},
		{"tool_choice auto", `{"model":"demo",` + msgs + `,"tool_choice":"auto"}`, "tool_choice", core.CodeInvalidField},
		{"function_call", `{"model":"demo",` + msgs + `,"function_call":{"name":"f"}}`, "function_call", core.CodeInvalidField},
		{"logprobs", `{"model":"demo",` + msgs + `,"logprobs":true}`, "logprobs", core.CodeInvalidField},
		{"top_logprobs", `{"model":"demo",` + msgs + `,"top_logprobs":2}`, "top_logprobs", core.CodeInvalidField},
		{"audio", `{"model":"demo",` + msgs + `,"audio":{"voice":"alloy","format":"wav"}}`, "audio", core.CodeInvalidField},
		{"audio modality", `{"model":"demo",` + msgs + `,"modalities":["text","audio"]}`, "modalities", core.CodeInvalidField},
		{"modalities not strings", `{"model":"demo",` + msgs + `,"modalities":"text"}`, "modalities", core.CodeInvalidField},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseChatRequest([]byte(tc.body))
			var ce *core.Error
			if !errors.As(err, &ce) {
				t.Fatalf("err %v, want a *core.Error", err)
			}
			if ce.Code != tc.code || ce.Field != tc.field || ce.Detail == "" {
				t.Errorf("got %s field %q (%s), want %s field %q", ce.Code, ce.Field, ce.Detail, tc.code, tc.field)
			}
		})
	}
}

func TestChatTTL(t *testing.T) {
	for _, tc := range []struct {
		header string
		want   time.Duration
		ok     bool
	}{
		{"", 0, true},
		{"1500", 1500 * time.Millisecond, true},
		{"600000", 10 * time.Minute, true},
		{"600001", 0, false},
		{"0", 0, false},
		{"-5", 0, false},
		{"1.5", 0, false},
		{"soon", 0, false},
	} {
		r := httptest.NewRequest("POST", "/openai/v1/chat/completions", nil)
		if tc.header != "" {
			r.Header.Set(TTLHeader, tc.header)
		}
		got, err := chatTTL(r, 10*time.Minute)
		if tc.ok != (err == nil) || got != tc.want {
			t.Errorf("%q: %v %v, want %v (ok %v)", tc.header, got, err, tc.want, tc.ok)
		}
		if err != nil {
			if c, _ := core.CodeOf(err); c != core.CodeTTLOutOfRange || err.(*core.Error).Field != TTLHeader {
				t.Errorf("%q: %v, want ttl_out_of_range naming the header", tc.header, err)
			}
		}
	}
}
