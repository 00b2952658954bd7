package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"
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
		text, plain, err := tokensText(job.Input)
		if err != nil {
			return nil, err
		}
		// A plain text (tokensText) has ' ' for its only white space and
		// words that need no escaping: split and quoted without looking
		// at every byte again.
		next, appendW := nextWord, appendWord[[]byte]
		if plain {
			next, appendW = nextPlainWord, appendQuoted
		}
		d, err := tokensDelay(job.Options, delay)
		if err != nil {
			return nil, err
		}
		var t *time.Timer // at d > 0 only: a timer is an allocation per job
		if d > 0 {
			t = time.NewTimer(d)
			defer t.Stop()
		}
		// The words are read where they lie, in the input, one ahead: the
		// last goes without its space.
		var chunk []byte // one word's output, encoded; Output.send copies it
		words := 0
		for w, rest := next(text); len(w) > 0; words++ {
			if d > 0 {
				// A timer, not time.Sleep: a cancelled job must stop now,
				// not after the current delay.
				t.Reset(d)
				select {
				case <-ctx.Done():
					return nil, tokensStopped(ctx, words, text)
				case <-t.C:
				}
			} else if ctx.Err() != nil {
				// No delay, no timer to wait on (a wake-up per word); a
				// cancelled job still stops before its next word.
				return nil, tokensStopped(ctx, words, text)
			}
			following, after := next(rest)
			chunk = appendW(chunk[:0], w, len(following) > 0)
			if err := out.send(ctx, chunk); err != nil {
				return nil, fmt.Errorf("tokens: send word %d: %w", words, err)
			}
			w, rest = following, after
		}
		return tokensResult{Words: words}, nil
	}
}

// tokensStopped is the error of a job cancelled after sent of its words.
func tokensStopped(ctx context.Context, sent int, text []byte) error {
	words := 0
	for w, rest := nextWord(text); len(w) > 0; w, rest = nextWord(rest) {
		words++
	}
	return fmt.Errorf("tokens: stopped after %d of %d words: %w", sent, words, context.Cause(ctx))
}

type tokensResult struct {
	Words int `json:"words"`
}

// nextWord returns the first word of b, split as strings.Fields splits
// (at runs of Unicode white space), and what follows it; no word is
// empty. A loop over it allocates nothing, where one over bytes.FieldsSeq
// moves what its body captures to the heap.
func nextWord(b []byte) (word, rest []byte) {
	i := 0
	for i < len(b) && isSpaceAt(b, i) {
		i += runeLen(b[i:])
	}
	b = b[i:]
	i = 0
	for i < len(b) && !isSpaceAt(b, i) {
		i += runeLen(b[i:])
	}
	return b[:i], b[i:]
}

// isSpaceAt reports whether the rune at b[i] is white space, by a table
// for ASCII (nearly every byte of a usual text) and unicode.IsSpace else.
func isSpaceAt(b []byte, i int) bool {
	if c := b[i]; c < utf8.RuneSelf {
		return asciiSpace[c]
	}
	r, _ := utf8.DecodeRune(b[i:])
	return unicode.IsSpace(r)
}

func runeLen(b []byte) int {
	if b[0] < utf8.RuneSelf {
		return 1
	}
	_, n := utf8.DecodeRune(b)
	return n
}

// nextPlainWord is nextWord for a text whose only white space is ' '.
func nextPlainWord(b []byte) (word, rest []byte) {
	i := 0
	for i < len(b) && b[i] == ' ' {
		i++
	}
	b = b[i:]
	if end := bytes.IndexByte(b, ' '); end >= 0 {
		return b[:end], b[end:]
	}
	return b, nil
}

var asciiSpace = [utf8.RuneSelf]bool{'\t': true, '\n': true, '\v': true, '\f': true, '\r': true, ' ': true}

// appendWord appends w, followed by a space if space is set, as a JSON
// string, exactly as json.Marshal encodes it (HTML characters escaped, as
// its default is): as it is between quotes when it has nothing to escape,
// the usual case, by json.Marshal otherwise.
func appendWord[T string | []byte](dst []byte, w T, space bool) []byte {
	if !jsonPlain(w) {
		s := string(w)
		if space {
			s += " "
		}
		b, _ := json.Marshal(s) // a string always marshals
		return append(dst, b...)
	}
	return appendQuoted(dst, w, space)
}

// appendQuoted is appendWord for a word jsonPlain accepts.
func appendQuoted[T string | []byte](dst []byte, w T, space bool) []byte {
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

// tokensText is the text of a tokens job's input. The usual input, a
// string with nothing escaped in it, is its bytes between the quotes, not
// copied (the handler only reads them), and plain: jsonPlain holds for
// all of it.
func tokensText(input json.RawMessage) (text []byte, plain bool, err error) {
	if in := bytes.Trim(input, " \t\r\n"); len(in) >= 2 && in[0] == '"' && in[len(in)-1] == '"' && jsonPlain(in[1:len(in)-1]) {
		return in[1 : len(in)-1], true, nil
	}
	b, err := tokensDecoded(input)
	return b, false, err
}

func tokensDecoded(input json.RawMessage) ([]byte, error) {
	var v any
	if json.Unmarshal(input, &v) != nil {
		return nil, Fail("bad_input", `input is not JSON: want a JSON string ("hello world") or an object {"text": "..."}`)
	}
	switch v := v.(type) {
	case string:
		return []byte(v), nil
	case map[string]any:
		if s, ok := v["text"].(string); ok {
			return []byte(s), nil
		}
		return nil, Fail("bad_input", `input object needs a string field "text"`)
	}
	return nil, Fail("bad_input", fmt.Sprintf(`input is %s: want a JSON string ("hello world") or an object {"text": "..."}`, jsonKind(input)))
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
