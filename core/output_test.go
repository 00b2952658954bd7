package core

import (
	"bytes"
	"encoding/json"
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
