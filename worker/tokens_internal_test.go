package worker

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"unicode"
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
		got, plain, err := tokensText(json.RawMessage(in))
		if err != nil || string(got) != want {
			t.Errorf("tokensText(%s) = %q, %v; want %q", in, got, err, want)
		}
		// A plain text's words are split at ' ' alone and not escaped.
		if plain && (!jsonPlain(want) || strings.ContainsFunc(want, func(r rune) bool { return r != ' ' && unicode.IsSpace(r) })) {
			t.Errorf("tokensText(%s): %q is not plain", in, want)
		}
	}
}

// nextWord splits as strings.Fields does, Unicode spaces, runs of them and
// invalid UTF-8 included; nextPlainWord does on texts of words and ' '.
func TestNextWordAsFields(t *testing.T) {
	for _, in := range []string{"", " ", "a", " a  b\tc\n", "x\u00a0y\u2003z ", "\xff \xfe\xfd", "é è", "  lead", "trail  ", "a b  c   d"} {
		split := func(next func([]byte) ([]byte, []byte)) []string {
			var got []string
			for w, rest := next([]byte(in)); len(w) > 0; w, rest = next(rest) {
				got = append(got, string(w))
			}
			return got
		}
		want := strings.Fields(in)
		if got := split(nextWord); !slices.Equal(got, want) {
			t.Errorf("nextWord: words of %q = %q, want %q", in, got, want)
		}
		if strings.ContainsFunc(in, func(r rune) bool { return r != ' ' && unicode.IsSpace(r) }) {
			continue
		}
		if got := split(nextPlainWord); !slices.Equal(got, want) {
			t.Errorf("nextPlainWord: words of %q = %q, want %q", in, got, want)
		}
	}
}
