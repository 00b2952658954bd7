package core_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/core"
)

func TestParseEnvelopeRefusals(t *testing.T) {
	long := strings.Repeat("a", 129)
	tests := []struct {
		name  string
		body  string
		code  core.Code
		field string // "" means not checked
	}{
		{"empty body", ``, core.CodeMalformedJSON, ""},
		{"malformed", `{"input":`, core.CodeMalformedJSON, ""},
		{"not json", `hello`, core.CodeMalformedJSON, ""},
		{"array", `[1]`, core.CodeMalformedJSON, ""},
		{"string", `"x"`, core.CodeMalformedJSON, ""},
		{"number", `42`, core.CodeMalformedJSON, ""},
		{"second object", `{"input":"x"} {"input":"y"}`, core.CodeMalformedJSON, ""},
		{"trailing garbage", `{"input":"x"} x`, core.CodeMalformedJSON, ""},
		{"trailing bracket", `{"input":"x"}]`, core.CodeMalformedJSON, ""},
		{"trailing brace", `{"input":"x"}}`, core.CodeMalformedJSON, ""},
		{"ttl_ms string", `{"input":"x","ttl_ms":"100"}`, core.CodeInvalidField, "ttl_ms"},
		{"ttl_ms fraction", `{"input":"x","ttl_ms":1.5}`, core.CodeInvalidField, "ttl_ms"},
		{"grace_ms string", `{"input":"x","grace_ms":"1"}`, core.CodeInvalidField, "grace_ms"},
		{"version string", `{"input":"x","version":"1"}`, core.CodeInvalidField, "version"},
		{"capabilities array", `{"input":"x","capabilities":["model=a"]}`, core.CodeInvalidField, "capabilities"},
		{"capability value number", `{"input":"x","capabilities":{"model":1}}`, core.CodeInvalidField, ""},
		{"limits not object", `{"input":"x","limits":3}`, core.CodeInvalidField, "limits"},
		{"limits field string", `{"input":"x","limits":{"max_queue_depth":"2"}}`, core.CodeInvalidField, "limits.max_queue_depth"},
		{"zone number", `{"input":"x","zone":1}`, core.CodeInvalidField, "zone"},
		{"version 0", `{"input":"x","version":0}`, core.CodeUnsupportedVersion, "version"},
		{"version 2", `{"input":"x","version":2}`, core.CodeUnsupportedVersion, "version"},
		{"version -1", `{"input":"x","version":-1}`, core.CodeUnsupportedVersion, "version"},
		{"missing input", `{"ttl_ms":100}`, core.CodeMissingInput, "input"},
		{"null input", `{"input":null}`, core.CodeMissingInput, "input"},
		{"empty object", `{}`, core.CodeMissingInput, "input"},
		{"null body", `null`, core.CodeMissingInput, "input"},
		{"options array", `{"input":"x","options":[1]}`, core.CodeInvalidField, "options"},
		{"options string", `{"input":"x","options":"o"}`, core.CodeInvalidField, "options"},
		{"options number", `{"input":"x","options":1}`, core.CodeInvalidField, "options"},
		{"ttl zero", `{"input":"x","ttl_ms":0}`, core.CodeTTLOutOfRange, "ttl_ms"},
		{"ttl negative", `{"input":"x","ttl_ms":-5}`, core.CodeTTLOutOfRange, "ttl_ms"},
		// 18446744073711 ms overflows time.Duration into 1.448ms: it must be
		// refused, not silently turned into a tiny TTL.
		{"ttl overflowing duration", `{"input":"x","ttl_ms":18446744073711}`, core.CodeTTLOutOfRange, "ttl_ms"},
		{"ttl max int64", `{"input":"x","ttl_ms":9223372036854775807}`, core.CodeTTLOutOfRange, "ttl_ms"},
		{"ttl beyond int64", `{"input":"x","ttl_ms":9223372036854775808}`, core.CodeInvalidField, "ttl_ms"},
		{"grace negative", `{"input":"x","grace_ms":-1}`, core.CodeInvalidField, "grace_ms"},
		{"limit zero", `{"input":"x","limits":{"max_output_bytes":0}}`, core.CodeInvalidField, "limits.max_output_bytes"},
		{"limit negative", `{"input":"x","limits":{"max_output_bytes":-5}}`, core.CodeInvalidField, "limits.max_output_bytes"},
		{"depth zero", `{"input":"x","limits":{"max_queue_depth":0}}`, core.CodeInvalidField, "limits.max_queue_depth"},
		{"input bytes negative", `{"input":"x","limits":{"max_input_bytes":-1}}`, core.CodeInvalidField, "limits.max_input_bytes"},
		{"queue bytes zero", `{"input":"x","limits":{"max_queue_bytes":0}}`, core.CodeInvalidField, "limits.max_queue_bytes"},
		{"capability space", `{"input":"x","capabilities":{"model":"a b"}}`, core.CodeInvalidField, "capabilities"},
		{"capability empty value", `{"input":"x","capabilities":{"model":""}}`, core.CodeInvalidField, "capabilities"},
		{"capability empty key", `{"input":"x","capabilities":{"":"a"}}`, core.CodeInvalidField, "capabilities"},
		{"capability equals", `{"input":"x","capabilities":{"model":"a=b"}}`, core.CodeInvalidField, "capabilities"},
		{"capability too long", `{"input":"x","capabilities":{"model":"` + long + `"}}`, core.CodeInvalidField, "capabilities"},
		{"zone space", `{"input":"x","zone":"eu west"}`, core.CodeInvalidField, "zone"},
		{"zone slash", `{"input":"x","zone":"eu/west"}`, core.CodeInvalidField, "zone"},
		{"zone leading dot", `{"input":"x","zone":".eu"}`, core.CodeInvalidField, "zone"},
		{"zone too long", `{"input":"x","zone":"` + long + `"}`, core.CodeInvalidField, "zone"},
		// Strict JSON (strictjson.go): what encoding/json would have
		// mended or read two ways is refused, wherever it is.
		{"invalid UTF-8 in input", "{\"input\":\"bad \xff\xfe\"}", core.CodeMalformedJSON, ""},
		{"invalid UTF-8 in a name", "{\"input\":\"x\",\"\xc3\":1}", core.CodeMalformedJSON, ""},
		{"lone high surrogate", `{"input":"\ud800"}`, core.CodeMalformedJSON, ""},
		{"lone low surrogate", `{"input":{"text":"\udc00 x"}}`, core.CodeMalformedJSON, ""},
		{"reversed surrogates", `{"input":"\udc00\ud800"}`, core.CodeMalformedJSON, ""},
		{"duplicate ttl_ms", `{"ttl_ms":1000,"ttl_ms":600000,"input":"x"}`, core.CodeMalformedJSON, "ttl_ms"},
		{"duplicate input", `{"input":"a","input":"b"}`, core.CodeMalformedJSON, "input"},
		{"duplicate capability", `{"input":"x","capabilities":{"model":"a","model":"b"}}`, core.CodeMalformedJSON, "capabilities.model"},
		{"duplicate limit", `{"input":"x","limits":{"max_output_bytes":1,"max_output_bytes":9}}`, core.CodeMalformedJSON, "limits.max_output_bytes"},
		{"duplicate deep in input", `{"input":{"a":[{"b":1,"b":2}]}}`, core.CodeMalformedJSON, "input.a[0].b"},
		{"duplicate in options", `{"input":"x","options":{"k":1,"k":1}}`, core.CodeMalformedJSON, "options.k"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := core.ParseEnvelope([]byte(tt.body))
			if got != nil {
				t.Errorf("ParseEnvelope returned an envelope with its error: %+v", got)
			}
			ce := wantCode(t, err, tt.code)
			if tt.field != "" && ce.Field != tt.field {
				t.Errorf("field = %q, want %q (%v)", ce.Field, tt.field, err)
			}
			if ce.Detail == "" {
				t.Errorf("error %v has no detail", err)
			}
		})
	}
}

func TestParseEnvelopeAccepts(t *testing.T) {
	tests := []struct {
		name  string
		body  string
		check func(t *testing.T, e *core.Envelope)
	}{
		{"minimal gets defaults", `{"input":"x"}`, func(t *testing.T, e *core.Envelope) {
			if e.Version != 1 {
				t.Errorf("Version = %d, want 1", e.Version)
			}
			if e.TTL != 0 || e.Grace != 0 {
				t.Errorf("TTL = %v, Grace = %v, want 0 (the node's default)", e.TTL, e.Grace)
			}
			if string(e.Input) != `"x"` {
				t.Errorf("Input = %s", e.Input)
			}
			if e.Options != nil || len(e.Capabilities) != 0 || e.Zone != "" || e.Limits != (core.RequestLimits{}) {
				t.Errorf("unexpected non-zero fields: %+v", e)
			}
		}},
		{"surrounding whitespace", " \n\t{\"input\":\"x\"}\n\n ", func(t *testing.T, e *core.Envelope) {
			if string(e.Input) != `"x"` {
				t.Errorf("Input = %s", e.Input)
			}
		}},
		{"unknown fields ignored", `{"input":1,"future":{"deep":[1,2]},"urgency":"high","version":1}`, func(t *testing.T, e *core.Envelope) {
			if string(e.Input) != `1` || e.Version != 1 {
				t.Errorf("got %+v", e)
			}
		}},
		{"every field", `{"version":1,"ttl_ms":1500,"grace_ms":250,"capabilities":{"model":"demo:v1/x","gpu":"a_1.0-b"},
			"input":{"prompt":"hi"},"options":{"temp":0.5},"zone":"eu-west_1.a",
			"limits":{"max_input_bytes":10,"max_queue_depth":2,"max_queue_bytes":30,"max_output_bytes":40}}`,
			func(t *testing.T, e *core.Envelope) {
				if e.TTL != 1500*time.Millisecond || e.Grace != 250*time.Millisecond {
					t.Errorf("TTL = %v, Grace = %v", e.TTL, e.Grace)
				}
				if e.Capabilities["model"] != "demo:v1/x" || e.Capabilities["gpu"] != "a_1.0-b" || len(e.Capabilities) != 2 {
					t.Errorf("Capabilities = %v", e.Capabilities)
				}
				if string(e.Input) != `{"prompt":"hi"}` || string(e.Options) != `{"temp":0.5}` {
					t.Errorf("Input = %s, Options = %s", e.Input, e.Options)
				}
				if e.Zone != "eu-west_1.a" {
					t.Errorf("Zone = %q", e.Zone)
				}
				want := core.RequestLimits{MaxInputBytes: 10, MaxQueueDepth: 2, MaxQueueBytes: 30, MaxOutputBytes: 40}
				if e.Limits != want {
					t.Errorf("Limits = %+v, want %+v", e.Limits, want)
				}
			}},
		{"null options are no options", `{"input":"x","options":null}`, func(t *testing.T, e *core.Envelope) {
			if e.Options != nil {
				t.Errorf("Options = %s, want nil", e.Options)
			}
		}},
		{"empty options object kept", `{"input":"x","options":{}}`, func(t *testing.T, e *core.Envelope) {
			if string(e.Options) != `{}` {
				t.Errorf("Options = %s, want {}", e.Options)
			}
		}},
		{"input of any JSON type", `{"input":[1,"two",{"3":null}]}`, func(t *testing.T, e *core.Envelope) {
			var v []any
			if err := json.Unmarshal(e.Input, &v); err != nil || len(v) != 3 {
				t.Errorf("Input = %s (%v)", e.Input, err)
			}
		}},
		{"input false is an input", `{"input":false}`, func(t *testing.T, e *core.Envelope) {
			if string(e.Input) != `false` {
				t.Errorf("Input = %s", e.Input)
			}
		}},
		{"grace zero", `{"input":"x","grace_ms":0}`, func(t *testing.T, e *core.Envelope) {
			if e.Grace != 0 {
				t.Errorf("Grace = %v", e.Grace)
			}
		}},
		// Capped to the node's --max-grace when applied; here only kept
		// from overflowing a Duration.
		{"grace overflowing duration", `{"input":"x","grace_ms":18446744073711}`, func(t *testing.T, e *core.Envelope) {
			if e.Grace <= 0 {
				t.Errorf("Grace = %v", e.Grace)
			}
		}},
		{"ttl one ms", `{"input":"x","ttl_ms":1}`, func(t *testing.T, e *core.Envelope) {
			if e.TTL != time.Millisecond {
				t.Errorf("TTL = %v", e.TTL)
			}
		}},
		{"ttl integer written as exponent", `{"input":"x","ttl_ms":2e3}`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := core.ParseEnvelope([]byte(tt.body))
			if tt.check == nil {
				// Documented behaviour only: 2e3 is not an int64 literal for
				// encoding/json, so it is refused as a field of the wrong type.
				wantCode(t, err, core.CodeInvalidField)
				return
			}
			if err != nil {
				t.Fatalf("ParseEnvelope(%s): %v", tt.body, err)
			}
			tt.check(t, e)
		})
	}
}

func TestValidName(t *testing.T) {
	tests := []struct {
		name string
		ok   bool
	}{
		{"q", true},
		{"jobs.v1_a-b", true},
		{"A9", true},
		{strings.Repeat("x", 128), true},
		{"", false},
		{strings.Repeat("x", 129), false},
		{".hidden", false},
		{"a/b", false},
		{"a b", false},
		{"a:b", false},
		{"é", false},
	}
	for _, tt := range tests {
		if got := core.ValidName(tt.name); got != tt.ok {
			t.Errorf("ValidName(%q) = %v, want %v", tt.name, got, tt.ok)
		}
		err := core.CheckQueueName(tt.name)
		if tt.ok && err != nil {
			t.Errorf("CheckQueueName(%q) = %v", tt.name, err)
		}
		if !tt.ok {
			wantCode(t, err, core.CodeInvalidQueueName)
		}
	}
}

// Member names are matched exactly: a name that differs from a field's in
// case only is an unknown member (ignored), never a second way to set the
// field that a proxy reading the exact name would miss. Valid UTF-8, a
// surrogate pair among it, passes untouched.
func TestParseEnvelopeExactNames(t *testing.T) {
	env, err := core.ParseEnvelope([]byte(`{"ttl_ms":1000,"TTL_MS":600000,"Input":"no","input":"h\u00e9 \ud83d\ude00 ✓","Zone":"z9"}`))
	if err != nil {
		t.Fatal(err)
	}
	if env.TTL != time.Second || env.Zone != "" {
		t.Errorf("TTL %v, zone %q: want 1s and none (TTL_MS and Zone are unknown members)", env.TTL, env.Zone)
	}
	if want := `"h\u00e9 \ud83d\ude00 ✓"`; string(env.Input) != want {
		t.Errorf("input %s, want %s as sent", env.Input, want)
	}
}
