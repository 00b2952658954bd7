package core

import (
	"bytes"
	"encoding/json"
	"strconv"
	"testing"

	"github.com/go-json-experiment/json/jsontext"
)

// outputEvent makes the bytes json.Marshal makes of {"data": output}, and
// refuses what is not one strict JSON value.
func TestOutputEventMatchesMarshal(t *testing.T) {
	for _, out := range []string{`"x"`, `{"a": [1, 2], "b": "<b>&amp;</b>"}`, "[1,\n 2]", "\"\u2028\u2029 é\"", `  {"k":"\u003c"}  `, `null`,
		`"\ud83d\ude00"`, `{"t":"\uD83D\uDE00 ✓"}`, `{"a":{"a":1},"b":{"a":2}}`} {
		got, n, ok := outputEvent([]byte(out))
		want, err := json.Marshal(map[string]any{"data": json.RawMessage(out)})
		if !ok || err != nil || string(got) != string(want) {
			t.Errorf("%q: %s (ok %v), want %s (%v)", out, got, ok, want, err)
		}
		var c bytes.Buffer
		_ = json.Compact(&c, []byte(out))
		if n != c.Len() {
			t.Errorf("%q: n = %d, want %d", out, n, c.Len())
		}
	}
	for _, bad := range []string{"", " ", "1 2", "{}x", "nul", `{"a":1} {}`,
		// Strict JSON: invalid UTF-8, lone surrogates, a member named twice.
		"\"\xff\"", "{\"t\":\"ok \xc3\"}", "\"\xed\xa0\x80\"", `"\ud800"`, `"\udc00"`, `"\ud800\u0041"`, `"\ud800x"`, `["\udbff"]`,
		`{"a":1,"a":2}`, `[{"x":{"k":1,"k":1}}]`} {
		if _, _, ok := outputEvent([]byte(bad)); ok {
			t.Errorf("%q: accepted", bad)
		}
	}
}

// BenchmarkOutputEvent is the per-output cost at the ingress: strings
// (the usual output, a token or a chunk of text) of 32 B and 4 KiB, ASCII
// and not, and objects (a chat delta, and one of 4 KiB), which take the
// tokenizer's path.
func BenchmarkOutputEvent(b *testing.B) {
	cases := map[string][]byte{}
	for _, size := range []int{32, 4096} {
		cases[strconv.Itoa(size)], _ = json.Marshal(string(bytes.Repeat([]byte("x"), size-2)))
	}
	cases["4096-utf8"], _ = json.Marshal(string(bytes.Repeat([]byte("é"), 2047)))
	cases["object-24"] = []byte(`{"content":"one token "}`)
	obj, _ := json.Marshal(map[string]any{"content": string(bytes.Repeat([]byte("y"), 4000)), "index": 3, "role": "assistant"})
	cases["object-4096"] = obj
	for _, name := range []string{"32", "4096", "4096-utf8", "object-24", "object-4096"} {
		out := cases[name]
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(out)))
			for b.Loop() {
				if _, _, ok := outputEvent(out); !ok {
					b.Fatal("refused")
				}
			}
		})
	}
}

// outputEvent agrees with json.Marshal of {"data": output}, and refuses
// exactly what json.Compact refuses and what is not strict JSON
// (jsontext's validation), whatever the output.
func FuzzOutputEvent(f *testing.F) {
	for _, s := range []string{`"x"`, `"\"`, `"a\\"`, `"\u00e9\n"`, `"\u00g9"`, `"\u12"`, " \"x\"\n", `"x" "y"`, `"x`, `x"`, "\"\x01\"", `"\/\b\f\r\t"`, `"\q"`, `{"a":"b"}`, `["x", 1]`, `""`, `"`, "\"\xff\"",
		`"\ud800"`, `"\ud83d\ude00"`, `{"a":1,"a":2}`, "{\"a\":\"\xe2\x82\"}"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, out []byte) {
		got, n, ok := outputEvent(out)
		var c bytes.Buffer
		wantOK := json.Compact(&c, out) == nil && jsontext.Value(out).IsValid()
		if ok != wantOK {
			t.Fatalf("%q: ok %v, json.Compact and jsontext say %v", out, ok, wantOK)
		}
		if !ok {
			return
		}
		want, err := json.Marshal(map[string]any{"data": json.RawMessage(out)})
		if err != nil || string(got) != string(want) || n != c.Len() {
			t.Fatalf("%q: %s (n %d), want %s (n %d, %v)", out, got, n, want, c.Len(), err)
		}
	})
}
