package core

import (
	"errors"
	"reflect"
	"testing"
)

// ParseEnvelope (json.Unmarshal first) decides as the json.Decoder path
// alone does: the same envelope, or an error with the same code.
func FuzzParseEnvelope(f *testing.F) {
	for _, s := range []string{
		`{"input":"x"}`, `{"input":{"text":"x"},"ttl_ms":5000,"options":{"delay_ms":1}}`, `null`, `[1]`, `{"input":"x"} {}`,
		`{"input":"x"}]`, `{"input":"x","version":2}`, `{"input":"x","ttl_ms":1.5}`, `{"input":"x","capabilities":{"model":"m"},"zone":"z"}`,
		`{"input":"x","limits":{"max_output_bytes":10}}`, `{"input":null}`, `{"input":"x","options":[1]}`, `{"input":"x","grace_ms":-1}`, ` {"input":1} `,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, gotErr := ParseEnvelope(data)
		want, wantErr := parseEnvelopeDecoder(data)
		var ge, we *Error
		switch {
		case (gotErr == nil) != (wantErr == nil):
			t.Fatalf("%q: %v, want %v", data, gotErr, wantErr)
		case gotErr != nil && (!errors.As(gotErr, &ge) || !errors.As(wantErr, &we) || ge.Code != we.Code):
			t.Fatalf("%q: %v, want %v", data, gotErr, wantErr)
		case gotErr == nil && !reflect.DeepEqual(got, want):
			t.Fatalf("%q: %+v, want %+v", data, got, want)
		}
	})
}
