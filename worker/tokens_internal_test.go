package worker

import (
	"encoding/json"
	"slices"
	"strings"
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
			if got := appendWord([]byte("prefix"), []byte(w), space); string(got) != "prefix"+string(b) {
				t.Errorf("appendWord([]byte(%q), %v) = %s, want prefix%s", w, space, got, b)
			}
		}
	}
	for _, in := range []string{`"a b c"`, ` "padded" `, `""`, `"a\nb"`, `"\u00e9t\u00e9"`, `"<&>"`, "\"\xff\"", `"é"`} {
		var want string
		if err := json.Unmarshal([]byte(in), &want); err != nil {
			t.Fatal(in, err)
		}
		if got, err := tokensText(json.RawMessage(in)); err != nil || string(got) != want {
			t.Errorf("tokensText(%s) = %q, %v; want %q", in, got, err, want)
		}
	}
}

// nextWord splits as strings.Fields does, Unicode spaces, runs of them and
// invalid UTF-8 included.
func TestNextWordAsFields(t *testing.T) {
	for _, in := range []string{"", " ", "a", " a  b\tc\n", "x\u00a0y\u2003z ", "\xff \xfe\xfd", "é è", "  lead", "trail  "} {
		var got []string
		for w, rest := nextWord([]byte(in)); len(w) > 0; w, rest = nextWord(rest) {
			got = append(got, string(w))
		}
		if want := strings.Fields(in); !slices.Equal(got, want) {
			t.Errorf("words of %q = %q, want %q", in, got, want)
		}
	}
}
