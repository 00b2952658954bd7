package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// This file is the worker's side of the chat protocol that a node's
// OpenAI-compatible front door (/openai/v1/chat/completions) speaks; the
// node's side is in httpapi, and docs/openai.md describes both.
//
//   - The job's input is the OpenAI request less what the node acts on
//     itself (stream, stream_options, n), with max_completion_tokens
//     folded into max_tokens: ChatInput reads the fields most workers need;
//     every other field is in Job.Input as the client sent it.
//   - Each output is a content delta: a JSON string (out.Send(ctx, "word "))
//     or an object {"content": "..."}.
//   - The result, if any, is a ChatResult: the finish reason and the token
//     usage. Without one the node reports finish_reason "stop" and counts
//     the deltas as completion tokens.

// ChatInput is the input of a chat job.
type ChatInput struct {
	Model    string        `json:"model"`
	Messages []ChatMessage `json:"messages"`
	// MaxTokens is the most tokens to generate, nil for the model's own
	// limit.
	MaxTokens *int `json:"max_tokens,omitempty"`
}

// ChatMessage is one message of a chat job's conversation.
type ChatMessage struct {
	Role string `json:"role"`
	// Content is a JSON string, an array of content parts, or null.
	Content json.RawMessage `json:"content"`
}

// Text returns the message's text: its content string, or the text of its
// "text" parts joined by newlines.
func (m ChatMessage) Text() string {
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	_ = json.Unmarshal(m.Content, &parts)
	var texts []string
	for _, p := range parts {
		if p.Type == "text" {
			texts = append(texts, p.Text)
		}
	}
	return strings.Join(texts, "\n")
}

// ChatResult is what a chat job's handler returns.
type ChatResult struct {
	// FinishReason is "stop", "length", "content_filter", ...; empty means
	// "stop".
	FinishReason string     `json:"finish_reason,omitempty"`
	Usage        *ChatUsage `json:"usage,omitempty"`
}

// ChatUsage counts a chat job's tokens. A zero TotalTokens is filled in by
// the node as the sum of the other two.
type ChatUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// Chat returns a handler for chat jobs that needs no model: it streams
// the words of the last user message back one by one, waiting delay before
// each, stops after max_tokens words (finish reason "length"), and stops at
// once when cancelled. Its usage counts words: those of every message as
// the prompt, those sent as the completion. It is the demo behind
// `switchyard worker --demo chat`, registered by `switchyard demo`.
//
// An input that is not a chat request with a user message fails with code
// "bad_input", and a message that says what a chat request looks like.
func Chat(delay time.Duration) Handler {
	return func(ctx context.Context, job *Job, out *Output) (any, error) {
		in, err := parseChatInput(job.Input)
		if err != nil {
			return nil, err
		}
		prompt, last := 0, -1
		for i, m := range in.Messages {
			prompt += len(strings.Fields(m.Text()))
			if m.Role == "user" {
				last = i
			}
		}
		if last < 0 {
			return nil, Fail("bad_input", "the conversation has no user message")
		}
		words := strings.Fields(in.Messages[last].Text())
		res := ChatResult{FinishReason: "stop"}
		if in.MaxTokens != nil && *in.MaxTokens < len(words) {
			words, res.FinishReason = words[:max(*in.MaxTokens, 0)], "length"
		}
		t := time.NewTimer(delay)
		defer t.Stop()
		for i, w := range words {
			t.Reset(delay)
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("chat: stopped after %d of %d words: %w", i, len(words), context.Cause(ctx))
			case <-t.C:
			}
			if i < len(words)-1 {
				w += " "
			}
			if err := out.Send(ctx, w); err != nil {
				return nil, fmt.Errorf("chat: send word %d: %w", i, err)
			}
		}
		res.Usage = &ChatUsage{PromptTokens: prompt, CompletionTokens: len(words), TotalTokens: prompt + len(words)}
		return res, nil
	}
}

// chatShape is what a chat request looks like, for the errors that refuse
// one.
const chatShape = `a chat request, {"messages": [{"role": "user", "content": "..."}]}`

// parseChatInput reads a chat job's input. Its errors name the field and
// what it should be, in JSON's words: never a Go type.
func parseChatInput(raw json.RawMessage) (ChatInput, error) {
	var fields struct {
		Model     json.RawMessage `json:"model"`
		Messages  json.RawMessage `json:"messages"`
		MaxTokens json.RawMessage `json:"max_tokens"`
	}
	if kind := jsonKind(raw); kind != "an object" {
		if kind == "" {
			return ChatInput{}, Fail("bad_input", "input is not JSON: want "+chatShape)
		}
		return ChatInput{}, Fail("bad_input", fmt.Sprintf("input is %s: want %s", kind, chatShape))
	}
	if err := json.Unmarshal(raw, &fields); err != nil {
		return ChatInput{}, Fail("bad_input", "input is not JSON: want "+chatShape)
	}
	var in ChatInput
	if len(fields.Model) > 0 && jsonKind(fields.Model) != "null" {
		if json.Unmarshal(fields.Model, &in.Model) != nil {
			return ChatInput{}, Fail("bad_input", fmt.Sprintf(`input "model" is %s: want a string`, jsonKind(fields.Model)))
		}
	}
	if len(fields.MaxTokens) > 0 && jsonKind(fields.MaxTokens) != "null" {
		var n int
		if json.Unmarshal(fields.MaxTokens, &n) != nil || n < 0 {
			return ChatInput{}, Fail("bad_input", fmt.Sprintf(`input "max_tokens" is %s: want a whole number, 0 or more`, string(fields.MaxTokens)))
		}
		in.MaxTokens = &n
	}
	var msgs []json.RawMessage
	if kind := jsonKind(fields.Messages); kind != "an array" {
		if len(fields.Messages) == 0 {
			kind = "missing"
		}
		return ChatInput{}, Fail("bad_input", fmt.Sprintf(`input "messages" is %s: want an array of messages, {"role": "user", "content": "..."}`, kind))
	}
	_ = json.Unmarshal(fields.Messages, &msgs) // an array, checked above
	for i, m := range msgs {
		var msg struct {
			Role    json.RawMessage `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		if kind := jsonKind(m); kind != "an object" {
			return ChatInput{}, Fail("bad_input", fmt.Sprintf(`input "messages"[%d] is %s: want {"role": "user", "content": "..."}`, i, kind))
		}
		_ = json.Unmarshal(m, &msg) // an object, checked above
		var role string
		if json.Unmarshal(msg.Role, &role) != nil {
			return ChatInput{}, Fail("bad_input", fmt.Sprintf(`input "messages"[%d] "role" is %s: want a string (system, user, assistant...)`, i, orMissing(msg.Role)))
		}
		switch jsonKind(msg.Content) {
		case "a string", "an array", "null", "":
		default:
			return ChatInput{}, Fail("bad_input", fmt.Sprintf(`input "messages"[%d] "content" is %s: want a string, or an array of content parts`, i, jsonKind(msg.Content)))
		}
		in.Messages = append(in.Messages, ChatMessage{Role: role, Content: msg.Content})
	}
	return in, nil
}

// jsonKind names the kind of a JSON value as a person reads it ("a
// string", "an object", ...); "" when raw is not JSON.
func jsonKind(raw json.RawMessage) string {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return ""
	}
	switch v.(type) {
	case string:
		return "a string"
	case float64:
		return "a number"
	case bool:
		return "true or false"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return "null"
}

// orMissing is raw's kind, or "missing" when there is none.
func orMissing(raw json.RawMessage) string {
	if len(raw) == 0 {
		return "missing"
	}
	return jsonKind(raw)
}
