package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// maxTokensDelay bounds the "delay_ms" option of Tokens.
const maxTokensDelay = 10 * time.Second

// Tokens returns a handler that streams the words of the job's input back
// one by one, waiting delay before each, and stops at once when cancelled.
// It is the demo behind `switchyard worker --demo tokens`.
//
// The input is a JSON string ("hello world") or an object {"text": "..."};
// anything else fails with code "bad_input". Each output is a JSON string:
// the word followed by a space, except for the last. The result is
// {"words": N}. The job option "delay_ms" (0..10000) overrides delay; an
// option outside that range fails with code "bad_options".
func Tokens(delay time.Duration) Handler {
	return func(ctx context.Context, job *Job, out *Output) (any, error) {
		text, err := tokensText(job.Input)
		if err != nil {
			return nil, err
		}
		d, err := tokensDelay(job.Options, delay)
		if err != nil {
			return nil, err
		}
		words := strings.Fields(text)
		t := time.NewTimer(d)
		defer t.Stop()
		for i, w := range words {
			if d > 0 {
				// A timer, not time.Sleep: a cancelled job must stop now,
				// not after the current delay.
				t.Reset(d)
				select {
				case <-ctx.Done():
					return nil, fmt.Errorf("tokens: stopped after %d of %d words: %w", i, len(words), context.Cause(ctx))
				case <-t.C:
				}
			} else if ctx.Err() != nil {
				// No delay, no timer to wait on (a wake-up per word); a
				// cancelled job still stops before its next word.
				return nil, fmt.Errorf("tokens: stopped after %d of %d words: %w", i, len(words), context.Cause(ctx))
			}
			if i < len(words)-1 {
				w += " "
			}
			if err := out.Send(ctx, w); err != nil {
				return nil, fmt.Errorf("tokens: send word %d: %w", i, err)
			}
		}
		return tokensResult{Words: len(words)}, nil
	}
}

type tokensResult struct {
	Words int `json:"words"`
}

func tokensText(input json.RawMessage) (string, error) {
	var v any
	if json.Unmarshal(input, &v) != nil {
		return "", Fail("bad_input", `input is not JSON: want a JSON string ("hello world") or an object {"text": "..."}`)
	}
	switch v := v.(type) {
	case string:
		return v, nil
	case map[string]any:
		if s, ok := v["text"].(string); ok {
			return s, nil
		}
		return "", Fail("bad_input", `input object needs a string field "text"`)
	}
	return "", Fail("bad_input", fmt.Sprintf(`input is %s: want a JSON string ("hello world") or an object {"text": "..."}`, jsonKind(input)))
}

func tokensDelay(options json.RawMessage, def time.Duration) (time.Duration, error) {
	if o := bytes.TrimSpace(options); len(o) == 0 || bytes.Equal(o, []byte("null")) {
		return max(def, 0), nil
	}
	var o struct {
		DelayMS json.RawMessage `json:"delay_ms"`
	}
	// Only an object unmarshals into o (null was handled above); what it
	// was otherwise is worked out only for the message.
	if json.Unmarshal(options, &o) != nil {
		return 0, Fail("bad_options", fmt.Sprintf(`options are %s: want an object, {"delay_ms": 150}`, orNotJSON(jsonKind(options))))
	}
	if len(o.DelayMS) == 0 || jsonKind(o.DelayMS) == "null" {
		return max(def, 0), nil
	}
	var ms int64
	if json.Unmarshal(o.DelayMS, &ms) != nil {
		return 0, Fail("bad_options", fmt.Sprintf("delay_ms is %s: want a whole number of milliseconds, 0..%d", string(o.DelayMS), maxTokensDelay.Milliseconds()))
	}
	// Compared in milliseconds before converting, so a huge value cannot
	// overflow into an acceptable Duration.
	if ms < 0 || ms > maxTokensDelay.Milliseconds() {
		return 0, Fail("bad_options", fmt.Sprintf("delay_ms must be 0..%d, not %d", maxTokensDelay.Milliseconds(), ms))
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// orNotJSON is a kind from jsonKind, or "not JSON" for none.
func orNotJSON(kind string) string {
	if kind == "" {
		return "not JSON"
	}
	return kind
}
