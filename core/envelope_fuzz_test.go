package core

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/go-json-experiment/json/jsontext"
)

// ParseEnvelope holds an envelope to the strict JSON rules and otherwise
// reads it as encoding/json would:
//   - what is not one strict JSON value (invalid UTF-8 anywhere, a lone
//     surrogate escape, a member named twice, anything after the object)
//     is refused malformed_json, whatever else is in it;
//   - what it accepts is strict JSON, and encoding/json reads the same
//     envelope from it, unless a member's name differs from a field's in
//     case only (encoding/json folds case; ParseEnvelope ignores such a
//     member as unknown).
func FuzzParseEnvelope(f *testing.F) {
	for _, s := range []string{
		`{"input":"x"}`, `{"input":{"text":"x"},"ttl_ms":5000,"options":{"delay_ms":1}}`, `null`, `[1]`, `{"input":"x"} {}`,
		`{"input":"x"}]`, `{"input":"x","version":2}`, `{"input":"x","ttl_ms":1.5}`, `{"input":"x","capabilities":{"model":"m"},"zone":"z"}`,
		`{"input":"x","limits":{"max_output_bytes":10}}`, `{"input":null}`, `{"input":"x","options":[1]}`, `{"input":"x","grace_ms":-1}`, ` {"input":1} `,
		"{\"input\":\"bad \xff\xfe\"}", `{"input":"\ud800"}`, `{"input":"\ud83d\ude00"}`, `{"ttl_ms":1000,"ttl_ms":600000,"input":"x"}`,
		`{"ttl_ms":1000,"TTL_MS":600000,"input":"x"}`, `{"input":{"a":1,"a":2}}`, `{"input":"x","limits":{"Max_Output_Bytes":1}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := ParseEnvelope(data)
		if !jsontext.Value(data).IsValid() {
			var ce *Error
			if !errors.As(err, &ce) || ce.Code != CodeMalformedJSON {
				t.Fatalf("%q is not strict JSON: got %+v, %v; want malformed_json", data, got, err)
			}
			return
		}
		if err != nil || foldedName(data) {
			return
		}
		var w wireEnvelope
		if json.Unmarshal(data, &w) != nil {
			t.Fatalf("%q: accepted, but encoding/json cannot read it", data)
		}
		want, werr := checkEnvelope(&w)
		if werr != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: %+v, encoding/json reads %+v (%v)", data, got, want, werr)
		}
	})
}

// wireNames are the member names of the envelope and of its limits.
var wireNames = []string{"version", "ttl_ms", "capabilities", "input", "options", "limits", "zone", "grace_ms",
	"max_input_bytes", "max_queue_depth", "max_queue_bytes", "max_output_bytes"}

// foldedName reports whether data, strict JSON, has a member name at the
// top or in limits that equals one of wireNames in all but case.
func foldedName(data []byte) bool {
	dec := jsontext.NewDecoder(bytes.NewReader(data))
	for {
		tok, err := dec.ReadToken()
		if err != nil {
			return false
		}
		depth := dec.StackDepth()
		if tok.Kind() != '"' || depth > 2 || depth == 0 {
			continue
		}
		if kind, n := dec.StackIndex(depth); kind != '{' || n%2 == 0 {
			continue // a value, not a name
		}
		name := tok.String()
		for _, w := range wireNames {
			if name != w && strings.EqualFold(name, w) {
				return true
			}
		}
	}
}
