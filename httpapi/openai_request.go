package httpapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/switchyard/switchyard/core"
)

// This file turns an OpenAI chat completion request into a Switchyard
// envelope: model selects the capability model=<name>, the rest of the
// request (less what the node itself acts on) is the job's input, the
// queue is the front door's, the TTL comes from a header. docs/openai.md
// lists which fields are honoured, passed through or refused.

// ChatCompletionRequest is the body of POST /openai/v1/chat/completions:
// the fields the node reads. Every other field is passed to the worker as
// it is, except the refused ones (see docs/openai.md).
type ChatCompletionRequest struct {
	// Model selects the workers: those declaring the capability
	// model=<model> on the front door's queue.
	Model string `json:"model" example:"demo"`
	// Messages is the conversation, passed to the worker as is.
	Messages []ChatMessage `json:"messages"`
	// Stream asks for chat.completion.chunk objects as server-sent events.
	Stream bool `json:"stream,omitempty"`
	// StreamOptions is only allowed with stream.
	StreamOptions *ChatStreamOptions `json:"stream_options,omitempty"`
	// MaxTokens and MaxCompletionTokens (the newer name, which wins) reach
	// the worker as its input's max_tokens.
	MaxTokens           *int64 `json:"max_tokens,omitempty"`
	MaxCompletionTokens *int64 `json:"max_completion_tokens,omitempty"`
	// N must be 1 when given: one job runs on one worker.
	N *int64 `json:"n,omitempty"`
	// Sampling parameters: type-checked, passed to the worker.
	Temperature      *float64 `json:"temperature,omitempty"`
	TopP             *float64 `json:"top_p,omitempty"`
	PresencePenalty  *float64 `json:"presence_penalty,omitempty"`
	FrequencyPenalty *float64 `json:"frequency_penalty,omitempty"`
	Seed             *int64   `json:"seed,omitempty"`
	// Stop is a string or an array of strings.
	Stop any    `json:"stop,omitempty"`
	User string `json:"user,omitempty"`
} // @name ChatCompletionRequest

// ChatMessage is one message of a conversation.
type ChatMessage struct {
	// Role is system, developer, user, assistant, tool or function.
	Role string `json:"role" example:"user"`
	// Content is a string, an array of content parts, or null.
	Content any    `json:"content"`
	Name    string `json:"name,omitempty"`
} // @name ChatMessage

// ChatStreamOptions are the options of a streamed completion.
type ChatStreamOptions struct {
	// IncludeUsage adds a last chunk, before data: [DONE], with the usage
	// and no choices.
	IncludeUsage bool `json:"include_usage,omitempty"`
} // @name ChatStreamOptions

// TTLHeader sets a chat completion job's TTL, in milliseconds: the OpenAI
// request has no field for it. Without it the node's default TTL applies.
const TTLHeader = "X-Switchyard-TTL-Ms"

// chatRequest is a chat completion request as the front door acts on it.
type chatRequest struct {
	model        string
	stream       bool
	includeUsage bool
	// user is the request's user: the job's affinity key unless a header
	// names one (chatScheduling).
	user string
	// input is the worker's input: the request without the fields the node
	// consumed (stream, stream_options, n, max_completion_tokens), with
	// max_tokens normalized.
	input json.RawMessage
}

// chatRoles are the roles a message may have.
var chatRoles = []string{"system", "developer", "user", "assistant", "tool", "function"}

// consumedFields are acted on by the node and not passed to the worker.
var consumedFields = []string{"stream", "stream_options", "n", "max_tokens", "max_completion_tokens"}

// parseChatRequest validates a chat completion request and builds the
// worker's input. Every refusal names the request field at fault.
func parseChatRequest(body []byte) (*chatRequest, error) {
	raw, err := decodeChatBody(body)
	if err != nil {
		return nil, err
	}
	var req ChatCompletionRequest
	if err := core.DecodeJSON(body, &req); err != nil {
		return nil, err
	}
	if err := checkChatRequest(&req, raw); err != nil {
		return nil, err
	}
	if err := refuseUnsupported(raw); err != nil {
		return nil, err
	}
	input := make(map[string]json.RawMessage, len(raw))
	for k, v := range raw {
		if !slices.Contains(consumedFields, k) {
			input[k] = v
		}
	}
	maxTokens := req.MaxCompletionTokens
	if maxTokens == nil {
		maxTokens = req.MaxTokens
	}
	if maxTokens != nil {
		input["max_tokens"] = json.RawMessage(strconv.FormatInt(*maxTokens, 10))
	}
	// Marshalling a map sorts its keys: the same request is the same input.
	in, err := json.Marshal(input)
	if err != nil {
		return nil, fmt.Errorf("openai: marshal the worker's input: %w", err)
	}
	return &chatRequest{model: req.Model, stream: req.Stream, includeUsage: req.StreamOptions != nil && req.StreamOptions.IncludeUsage, input: in, user: req.User}, nil
}

// decodeChatBody decodes a body that must be one JSON object and nothing
// else, under the strict rules (core.DecodeJSON).
func decodeChatBody(body []byte) (map[string]json.RawMessage, error) {
	var raw map[string]json.RawMessage
	if err := core.DecodeJSON(body, &raw); err != nil {
		return nil, err
	}
	if raw == nil {
		return nil, &core.Error{Code: core.CodeMalformedJSON, Detail: "the body is not a JSON object"}
	}
	return raw, nil
}

// checkChatRequest checks the fields the node reads.
func checkChatRequest(req *ChatCompletionRequest, raw map[string]json.RawMessage) error {
	if req.Model == "" {
		return invalidField("model", "model is required: one of GET %s/models", OpenAIPrefix)
	}
	if _, err := core.ParseCapabilities([]string{"model=" + req.Model}); err != nil {
		return invalidField("model", "model %q cannot name a capability: 1-128 of [A-Za-z0-9._:/-]", req.Model)
	}
	if len(req.Messages) == 0 {
		return &core.Error{Code: core.CodeMissingInput, Field: "messages", Detail: "messages is required and must not be empty"}
	}
	for i, m := range req.Messages {
		if !slices.Contains(chatRoles, m.Role) {
			return invalidField(fmt.Sprintf("messages[%d].role", i), "role must be one of %v, not %q", chatRoles, m.Role)
		}
		switch m.Content.(type) {
		case nil, string, []any:
		default:
			return invalidField(fmt.Sprintf("messages[%d].content", i), "content must be a string, an array of content parts, or null")
		}
	}
	if req.N != nil && *req.N != 1 {
		return invalidField("n", "n must be 1: a job runs on one worker, which gives one choice")
	}
	for field, v := range map[string]*int64{"max_tokens": req.MaxTokens, "max_completion_tokens": req.MaxCompletionTokens} {
		if v != nil && *v < 1 {
			return invalidField(field, "%s must be at least 1", field)
		}
	}
	if req.StreamOptions != nil && !req.Stream {
		return invalidField("stream_options", "stream_options is only allowed when stream is true")
	}
	if _, ok := raw["stop"]; ok {
		if err := checkStop(req.Stop); err != nil {
			return err
		}
	}
	return nil
}

func checkStop(stop any) error {
	switch v := stop.(type) {
	case nil, string:
		return nil
	case []any:
		for _, s := range v {
			if _, ok := s.(string); !ok {
				return invalidField("stop", "stop must be a string or an array of strings")
			}
		}
		return nil
	}
	return invalidField("stop", "stop must be a string or an array of strings")
}

// refuseUnsupported refuses the fields whose answer the front door could
// not carry back: tool calls, log probabilities and audio need parts of
// the response it does not translate, so accepting them would drop what
// the caller asked for without a word.
func refuseUnsupported(raw map[string]json.RawMessage) error {
	for _, field := range []string{"tools", "functions"} {
		if !absent(raw[field]) && string(raw[field]) != "[]" {
			return invalidField(field, "%s is not supported: this front door relays text only, not tool calls", field)
		}
	}
	for _, field := range []string{"tool_choice", "function_call"} {
		if !absent(raw[field]) && string(raw[field]) != `"none"` {
			return invalidField(field, "%s is not supported: this front door relays text only, not tool calls", field)
		}
	}
	if !absent(raw["logprobs"]) && string(raw["logprobs"]) != "false" {
		return invalidField("logprobs", "logprobs is not supported")
	}
	if !absent(raw["top_logprobs"]) {
		return invalidField("top_logprobs", "top_logprobs is not supported")
	}
	if !absent(raw["audio"]) {
		return invalidField("audio", "audio output is not supported")
	}
	if m := raw["modalities"]; !absent(m) {
		var mods []string
		if json.Unmarshal(m, &mods) != nil {
			return invalidField("modalities", "modalities must be an array of strings")
		}
		if slices.ContainsFunc(mods, func(s string) bool { return s != "text" }) {
			return invalidField("modalities", "only the text modality is supported")
		}
	}
	return nil
}

// absent reports whether a field is missing or null.
func absent(v json.RawMessage) bool { return len(v) == 0 || string(v) == "null" }

func invalidField(field, format string, args ...any) *core.Error {
	return &core.Error{Code: core.CodeInvalidField, Field: field, Detail: fmt.Sprintf(format, args...)}
}

// chatEnvelope is the job a chat completion request asks for: the request,
// validated, and the envelope of its model and input with what its headers
// set (TTL, affinity key, priority, on_worker_lost). Every refusal names
// the request field or header at fault.
func chatEnvelope(r *http.Request, body []byte, maxTTL time.Duration) (*chatRequest, *core.Envelope, error) {
	req, err := parseChatRequest(body)
	if err != nil {
		return nil, nil, err
	}
	env := &core.Envelope{Version: core.EnvelopeVersion, Capabilities: map[string]string{"model": req.model}, Input: req.input}
	if env.TTL, err = chatTTL(r, maxTTL); err != nil {
		return nil, nil, err
	}
	if env.AffinityKey, env.Priority, err = chatScheduling(r, req); err != nil {
		return nil, nil, err
	}
	if env.OnWorkerLost, err = chatLostPolicy(r); err != nil {
		return nil, nil, err
	}
	return req, env, nil
}

// chatTTL is the TTL the request's header asks for, zero for the node's
// default.
func chatTTL(r *http.Request, maxTTL time.Duration) (time.Duration, error) {
	h := r.Header.Get(TTLHeader)
	if h == "" {
		return 0, nil
	}
	ms, err := strconv.ParseInt(h, 10, 64)
	if err != nil || ms < 1 || ms > maxTTL.Milliseconds() {
		return 0, &core.Error{Code: core.CodeTTLOutOfRange, Field: TTLHeader, Detail: fmt.Sprintf("%s must be a whole number of milliseconds between 1 and %d", TTLHeader, maxTTL.Milliseconds())}
	}
	return time.Duration(ms) * time.Millisecond, nil
}
