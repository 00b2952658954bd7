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
// "bad_input".
func Chat(delay time.Duration) Handler {
	return func(ctx context.Context, job *Job, out *Output) (any, error) {
		var in ChatInput
		if err := json.Unmarshal(job.Input, &in); err != nil {
			return nil, Fail("bad_input", fmt.Sprintf("input is not a chat request: %v", err))
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
