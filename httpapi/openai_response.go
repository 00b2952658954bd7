package httpapi

import (
	"encoding/json"
	"errors"
	"strings"
	"time"

	sse "github.com/tmaxmax/go-sse"

	"github.com/switchyard/switchyard/apierr"
	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/stream"
)

// This file turns a chat job's events into OpenAI's response objects: a
// chat.completion.chunk per event on a stream (chatStreamSink), or one
// chat.completion at the end (chatCollector). Both are core/stream sinks,
// so the one stream writer serves them with its clocks and bounds.
//
// The worker's side of the protocol (docs/openai.md): each output is a
// content delta, a JSON string or an object {"content": "..."}; the
// result, when it is an object, may carry finish_reason and usage.

// ChatCompletion is the answer to a chat completion request without
// stream.
type ChatCompletion struct {
	ID      string                 `json:"id" example:"chatcmpl-j_2x7k"`
	Object  string                 `json:"object" example:"chat.completion"`
	Created int64                  `json:"created"`
	Model   string                 `json:"model" example:"demo"`
	Choices []ChatCompletionChoice `json:"choices"`
	Usage   ChatUsage              `json:"usage"`
} // @name ChatCompletion

// ChatCompletionChoice is the one choice of a completion.
type ChatCompletionChoice struct {
	Index        int                   `json:"index"`
	Message      ChatCompletionMessage `json:"message"`
	Logprobs     map[string]any        `json:"logprobs" extensions:"x-nullable"`
	FinishReason string                `json:"finish_reason" example:"stop"`
} // @name ChatCompletionChoice

// ChatCompletionMessage is the assistant's message.
type ChatCompletionMessage struct {
	Role    string  `json:"role" example:"assistant"`
	Content string  `json:"content"`
	Refusal *string `json:"refusal" extensions:"x-nullable"`
} // @name ChatCompletionMessage

// ChatCompletionEventStream describes a streamed chat completion's
// text/event-stream (stream: true) for the OpenAPI document, one field per
// event type: OpenAI's stream names no events, so each is a message (the
// SSE default), whose data is a chunk; the last is the literal [DONE], or
// an error object that ends the stream instead (openapi/gen widens the
// data to those three).
type ChatCompletionEventStream struct {
	// Message is every event: a chunk, then [DONE]; or an error object
	// instead of the rest.
	Message ChatCompletionChunk `json:"message"`
} // @name ChatCompletionEventStream

// ChatCompletionChunk is one server-sent event of a streamed completion.
// The first carries the role, the last choice the finish reason; with
// stream_options.include_usage one more follows with the usage and no
// choices. Usage is null in every other chunk.
type ChatCompletionChunk struct {
	ID      string                      `json:"id"`
	Object  string                      `json:"object" example:"chat.completion.chunk"`
	Created int64                       `json:"created"`
	Model   string                      `json:"model"`
	Choices []ChatCompletionChunkChoice `json:"choices"`
	Usage   *ChatUsage                  `json:"usage" extensions:"x-nullable"`
	// SwitchyardRestart is set, on a chunk with no choices, only in the
	// stream of a request that opted into restarts (the
	// X-Switchyard-On-Worker-Lost header): the job's worker was lost and
	// the completion starts again; the text before this chunk belongs to
	// the abandoned attempt (docs/openai.md).
	SwitchyardRestart *ChatRestart `json:"switchyard_restart,omitempty"`
} // @name ChatCompletionChunk

// ChatRestart is a restart event as a chat stream carries it.
type ChatRestart struct {
	// Reason is worker_lost or node_gone; Detail says what was lost.
	Reason string `json:"reason"`
	Detail string `json:"detail"`
	// Attempt is the new run's binding generation, Gen its stream
	// generation; Restarts counts the restarts so far.
	Attempt  uint64 `json:"attempt"`
	Gen      uint64 `json:"gen"`
	Restarts int    `json:"restarts"`
} // @name ChatRestart

// chatRestart reads a restart event.
func chatRestart(ev core.Event) *ChatRestart {
	r := &ChatRestart{Attempt: ev.Gen, Gen: ev.Stream}
	_ = json.Unmarshal(ev.Data, r)
	return r
}

// ChatCompletionChunkChoice is the one choice of a chunk.
type ChatCompletionChunkChoice struct {
	Index        int                 `json:"index"`
	Delta        ChatCompletionDelta `json:"delta"`
	Logprobs     map[string]any      `json:"logprobs" extensions:"x-nullable"`
	FinishReason *string             `json:"finish_reason" extensions:"x-nullable"`
} // @name ChatCompletionChunkChoice

// ChatCompletionDelta is what a chunk adds to the message.
type ChatCompletionDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
} // @name ChatCompletionDelta

// ChatUsage counts tokens as the worker reported them; without a report,
// completion_tokens is the number of deltas relayed and prompt_tokens 0.
type ChatUsage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
} // @name ChatUsage

// chatMeta is what every object of one completion repeats.
type chatMeta struct {
	id      string
	created int64
	model   string
}

func newChatMeta(j *core.Job, model string) chatMeta {
	return chatMeta{id: "chatcmpl-" + j.ID, created: j.Created.Unix(), model: model}
}

// chatDelta returns the content an output event carries.
func chatDelta(ev core.Event) (string, error) {
	var out struct {
		Data json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(ev.Data, &out); err != nil {
		return "", err
	}
	var s string
	if json.Unmarshal(out.Data, &s) == nil {
		return s, nil
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if json.Unmarshal(out.Data, &obj) == nil && obj.Content != nil {
		return *obj.Content, nil
	}
	return "", &core.Error{Code: core.CodeBadOutput, Detail: "the worker sent an output that is neither a string nor an object with a string content: a chat worker's outputs are content deltas"}
}

// chatEnd reads a terminal event: the finish reason and usage of a job
// that completed (outputs is the number of deltas, usage's fallback), or
// the error of one that did not.
func chatEnd(ev core.Event, outputs int64) (string, ChatUsage, error) {
	var end struct {
		Code   core.Code       `json:"code"`
		Detail string          `json:"detail"`
		Result json.RawMessage `json:"result"`
	}
	if err := json.Unmarshal(ev.Data, &end); err != nil {
		return "", ChatUsage{}, err
	}
	if ev.Kind == core.EventError {
		return "", ChatUsage{}, &core.Error{Code: end.Code, Detail: end.Detail}
	}
	// Any result that is not an object with these members (a worker
	// written for another protocol) leaves the defaults.
	var res struct {
		FinishReason string     `json:"finish_reason"`
		Usage        *ChatUsage `json:"usage"`
	}
	_ = json.Unmarshal(end.Result, &res)
	usage := ChatUsage{CompletionTokens: outputs, TotalTokens: outputs}
	if res.Usage != nil {
		usage = *res.Usage
		if usage.TotalTokens == 0 {
			usage.TotalTokens = usage.PromptTokens + usage.CompletionTokens
		}
	}
	if res.FinishReason == "" {
		res.FinishReason = "stop"
	}
	return res.FinishReason, usage, nil
}

// controlError is how a stream the node ended looks to an OpenAI client,
// which cannot resume: a slow consumer's stream could not be written on;
// anything else lost events the stream cannot send.
func controlError(c stream.Control, data map[string]any) *core.Error {
	if c == stream.Terminated && data["reason"] == "slow_consumer" {
		return &core.Error{Code: core.CodeWriteFailed, Detail: "the client stopped reading the stream (no progress for --stream-stall-timeout); the job is cancelled"}
	}
	return &core.Error{Code: core.CodeInternal, Detail: "the stream lost events it cannot send (" + string(c) + ")"}
}

// errChatStreamCut ends a stream the sink cannot continue: the rest of
// the job's text would not make sense after a hole.
var errChatStreamCut = errors.New("httpapi: chat stream cut")

// chatResponse is what a chat job's events become, step by step: a stream
// of chunks (chatStreamSink) or one completion (chatCollector).
type chatResponse interface {
	start() error
	text(delta string) error
	restart(ev core.Event) error
	end(finish string, usage ChatUsage) error
	// fail takes the job's error, or an output no delta can be read from.
	fail(err error) error
}

// chatEvents reads a chat job's events for a chatResponse, which the
// sinks share: outputs counts the current attempt's deltas, the usage's
// fallback at the end.
type chatEvents struct {
	outputs int64
}

func (c *chatEvents) event(r chatResponse, ev core.Event) error {
	switch ev.Kind {
	case core.EventAccepted:
		return r.start()
	case core.EventOutput:
		text, err := chatDelta(ev)
		if err != nil {
			// The job still runs: ending the stream is what cancels it.
			if werr := r.fail(err); werr != nil {
				return werr
			}
			return errChatStreamCut
		}
		c.outputs++
		return r.text(text)
	case core.EventRestart:
		// The usage counts the new attempt's output alone.
		c.outputs = 0
		return r.restart(ev)
	}
	finish, usage, err := chatEnd(ev, c.outputs)
	if err != nil {
		return r.fail(err)
	}
	return r.end(finish, usage)
}

// chatStreamSink writes a chat job's events as chat.completion.chunk
// server-sent events: data lines only (no event names, no ids: an OpenAI
// client neither resumes nor reads them), then data: [DONE].
type chatStreamSink struct {
	sseConn
	chatEvents
	meta         chatMeta
	includeUsage bool
}

var _ stream.Sink = (*chatStreamSink)(nil)

func (s *chatStreamSink) Event(ev core.Event, _ []byte) error { return s.event(s, ev) }

func (s *chatStreamSink) start() error {
	empty := ""
	return s.chunk(ChatCompletionDelta{Role: "assistant", Content: &empty}, nil)
}

func (s *chatStreamSink) text(delta string) error {
	return s.chunk(ChatCompletionDelta{Content: &delta}, nil)
}

// restart tells the client: what was sent cannot be taken back.
func (s *chatStreamSink) restart(ev core.Event) error {
	return s.write(ChatCompletionChunk{ID: s.meta.id, Object: "chat.completion.chunk", Created: s.meta.created, Model: s.meta.model,
		Choices: []ChatCompletionChunkChoice{}, SwitchyardRestart: chatRestart(ev)})
}

func (s *chatStreamSink) end(finish string, usage ChatUsage) error {
	if err := s.chunk(ChatCompletionDelta{}, &finish); err != nil {
		return err
	}
	if s.includeUsage {
		if err := s.write(ChatCompletionChunk{ID: s.meta.id, Object: "chat.completion.chunk", Created: s.meta.created, Model: s.meta.model,
			Choices: []ChatCompletionChunkChoice{}, Usage: &usage}); err != nil {
			return err
		}
	}
	return s.data([]byte("[DONE]"))
}

// chunk writes one chunk with one choice.
func (s *chatStreamSink) chunk(delta ChatCompletionDelta, finish *string) error {
	return s.write(ChatCompletionChunk{ID: s.meta.id, Object: "chat.completion.chunk", Created: s.meta.created, Model: s.meta.model,
		Choices: []ChatCompletionChunkChoice{{Delta: delta, FinishReason: finish}}})
}

// fail writes an error chunk, as OpenAI ends a stream that fails after it
// started: {"error": {...}}, and no [DONE].
func (s *chatStreamSink) fail(err error) error {
	return s.write(apierr.OpenAIErrorResponse{Error: apierr.OpenAIErrorOf(err)})
}

func (s *chatStreamSink) write(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return s.data(b)
}

func (s *chatStreamSink) data(b []byte) error {
	m := &sse.Message{}
	m.AppendData(string(b))
	_, err := m.WriteTo(s.w)
	return err
}

func (s *chatStreamSink) Control(c stream.Control, data map[string]any) error {
	if err := s.fail(controlError(c, data)); err != nil {
		return err
	}
	if c == stream.Gap {
		// A gap does not end a stream by itself; a hole in a text does.
		return errChatStreamCut
	}
	return nil
}

// chatCollector gathers a chat job's events into one chat.completion. It
// writes nothing, so heartbeats, flushes and deadlines are no-ops: the
// response is written once the job has ended.
type chatCollector struct {
	chatEvents
	meta   chatMeta
	buf    strings.Builder
	finish string
	usage  ChatUsage
	// err is the job's error, or the reason the collection stopped.
	err error
}

var _ stream.Sink = (*chatCollector)(nil)

func (c *chatCollector) Event(ev core.Event, _ []byte) error { return c.event(c, ev) }

func (c *chatCollector) start() error { return nil }

func (c *chatCollector) text(delta string) error {
	c.buf.WriteString(delta)
	return nil
}

// restart drops the text so far: the completion is the last attempt's.
func (c *chatCollector) restart(core.Event) error {
	c.buf.Reset()
	return nil
}

func (c *chatCollector) end(finish string, usage ChatUsage) error {
	c.finish, c.usage = finish, usage
	return nil
}

func (c *chatCollector) fail(err error) error {
	c.err = err
	return nil
}

func (c *chatCollector) Control(ctl stream.Control, data map[string]any) error {
	c.err = controlError(ctl, data)
	return errChatStreamCut
}

func (c *chatCollector) Heartbeat() error                 { return nil }
func (c *chatCollector) Flush() error                     { return nil }
func (c *chatCollector) SetWriteDeadline(time.Time) error { return nil }
func (c *chatCollector) Abort(time.Time)                  {}

// completion is the chat.completion the collected events make.
func (c *chatCollector) completion() ChatCompletion {
	return ChatCompletion{
		ID: c.meta.id, Object: "chat.completion", Created: c.meta.created, Model: c.meta.model,
		Choices: []ChatCompletionChoice{{Message: ChatCompletionMessage{Role: "assistant", Content: c.buf.String()}, FinishReason: c.finish}},
		Usage:   c.usage,
	}
}
