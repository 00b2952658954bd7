package core

import (
	"bytes"
	"encoding/json"
	"strconv"
	"testing"
)

// outputEvent makes the bytes json.Marshal makes of {"data": output}, and
// refuses what is not one JSON value.
func TestOutputEventMatchesMarshal(t *testing.T) {
	for _, out := range []string{`"x"`, `{"a": [1, 2], "b": "<b>&amp;</b>"}`, "[1,\n 2]", "\"\u2028\u2029 é\"", `  {"k":"\u003c"}  `, `null`, "\"\xff\""} {
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
	for _, bad := range []string{"", " ", "1 2", "{}x", "nul", `{"a":1} {}`} {
		if _, _, ok := outputEvent([]byte(bad)); ok {
			t.Errorf("%q: accepted", bad)
		}
	}
}

func BenchmarkOutputEvent(b *testing.B) {
	for _, size := range []int{32, 4096} {
		out, _ := json.Marshal(string(bytes.Repeat([]byte("x"), size-2)))
		b.Run(strconv.Itoa(size), func(b *testing.B) {
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
// exactly what json.Compact refuses, whatever the output.
func FuzzOutputEvent(f *testing.F) {
	for _, s := range []string{`"x"`, `"\"`, `"a\\"`, `"\u00e9\n"`, `"\u00g9"`, `"\u12"`, " \"x\"\n", `"x" "y"`, `"x`, `x"`, "\"\x01\"", `"\/\b\f\r\t"`, `"\q"`, `{"a":"b"}`, `["x", 1]`, `""`, `"`, "\"\xff\""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, out []byte) {
		got, n, ok := outputEvent(out)
		var c bytes.Buffer
		wantOK := json.Compact(&c, out) == nil
		if ok != wantOK {
			t.Fatalf("%q: ok %v, json.Compact says %v", out, ok, wantOK)
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
