package worker

import (
	"encoding/json"
	"testing"
)

// appendWord encodes a word as json.Marshal does, and tokensText reads a
// string input as json.Unmarshal does, on their fast paths and off them.
func TestTokensJSONAsEncodingJSON(t *testing.T) {
	for _, w := range []string{"", "x", "hello", "a<b", "AT&T", "say \"hi\"", `back\slash`, "tab\there", "é", "\u2028", "\xff", "del\x7f"} {
		for _, space := range []bool{false, true} {
			want := w
			if space {
				want += " "
			}
			b, _ := json.Marshal(want)
			if got := appendWord([]byte("prefix"), w, space); string(got) != "prefix"+string(b) {
				t.Errorf("appendWord(%q, %v) = %s, want prefix%s", w, space, got, b)
			}
		}
	}
	for _, in := range []string{`"a b c"`, ` "padded" `, `""`, `"a\nb"`, `"\u00e9t\u00e9"`, `"<&>"`, "\"\xff\"", `"é"`} {
		var want string
		if err := json.Unmarshal([]byte(in), &want); err != nil {
			t.Fatal(in, err)
		}
		if got, err := tokensText(json.RawMessage(in)); err != nil || got != want {
			t.Errorf("tokensText(%s) = %q, %v; want %q", in, got, err, want)
		}
	}
}
