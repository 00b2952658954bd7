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
		var t *time.Timer // at d > 0 only: a timer is an allocation per job
		if d > 0 {
			t = time.NewTimer(d)
			defer t.Stop()
		}
		var chunk []byte // one word's output, encoded; Output.send copies it
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
			chunk = appendWord(chunk[:0], w, i < len(words)-1)
			if err := out.send(ctx, chunk); err != nil {
				return nil, fmt.Errorf("tokens: send word %d: %w", i, err)
			}
		}
		return tokensResult{Words: len(words)}, nil
	}
}

type tokensResult struct {
	Words int `json:"words"`
}

// appendWord appends w, followed by a space if space is set, as a JSON
// string, exactly as json.Marshal encodes it (HTML characters escaped, as
// its default is): as it is between quotes when it has nothing to escape,
// the usual case, by json.Marshal otherwise.
func appendWord(dst []byte, w string, space bool) []byte {
	if !jsonPlain(w) {
		if space {
			w += " "
		}
		b, _ := json.Marshal(w) // a string always marshals
		return append(dst, b...)
	}
	dst = append(append(dst, '"'), w...)
	if space {
		dst = append(dst, ' ')
	}
	return append(dst, '"')
}

// jsonPlain reports whether s is printable ASCII that encoding/json
// writes unescaped in a string: no quote, backslash or HTML character.
func jsonPlain[T string | []byte](s T) bool {
	for i := range len(s) {
		switch c := s[i]; {
		case c < 0x20 || c >= 0x7f, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}

func tokensText(input json.RawMessage) (string, error) {
	// The usual input, a string with nothing escaped in it, is its bytes
	// between the quotes.
	if in := bytes.Trim(input, " \t\r\n"); len(in) >= 2 && in[0] == '"' && in[len(in)-1] == '"' && jsonPlain(in[1:len(in)-1]) {
		return string(in[1 : len(in)-1]), nil
	}
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
