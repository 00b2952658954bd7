package core

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"strings"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// Strict JSON. Every JSON text a node takes from outside — an envelope, an
// OpenAI request, an HTTP worker's post, a worker's output and result — is
// held to RFC 7493 (I-JSON) before anything acts on it:
//
//   - valid UTF-8 throughout: no byte sequence that is not UTF-8, and no
//     \u escape of a lone surrogate. encoding/json replaces both with
//     U+FFFD without a word, so what a worker (or a proxy in front of the
//     node) reads is not what the client sent; and text/event-stream,
//     which carries outputs, must be UTF-8.
//   - no object that names a member twice. encoding/json keeps the last
//     one, so {"ttl_ms":1000,"ttl_ms":600000} passes a gateway that reads
//     the first and runs ten minutes here.
//   - member names matched exactly: encoding/json folds case, so
//     "TTL_MS" would set ttl_ms behind a gateway's back. Here it is an
//     unknown member, ignored like any other.
//
// These are the defaults of github.com/go-json-experiment/json (the JSON v2
// proposal, whose jsontext package does the syntax): DecodeJSON decodes
// with it, CheckJSON validates a raw value with it.

// DecodeJSON decodes data, which must be exactly one JSON value, into v
// under the strict rules. A refusal is an *Error: malformed_json naming the
// fault and where it is, or invalid_field (Field set) when a member holds
// a value of the wrong type for v.
func DecodeJSON(data []byte, v any) error {
	err := jsonv2.Unmarshal(data, v)
	if err == nil {
		return nil
	}
	// The decoder stops at the first error, and a member of the wrong type
	// can come before what breaks the syntax: the syntax is reported first,
	// so a body that is not strict JSON is malformed_json whatever else is
	// wrong with it.
	var sem *jsonv2.SemanticError
	if errors.As(err, &sem) {
		if serr := CheckJSON(data); serr != nil {
			return serr
		}
	}
	return jsonError(err)
}

// CheckJSON refuses, with malformed_json, data that is not exactly one JSON
// value under the strict rules (whitespace around it is allowed). A valid
// value costs one pass and no allocation.
func CheckJSON(data []byte) error {
	if jsontext.Value(data).IsValid() {
		return nil
	}
	dec := jsontext.NewDecoder(bytes.NewReader(data))
	if _, err := dec.ReadValue(); err != nil {
		return jsonError(err)
	}
	if _, err := dec.ReadToken(); err != io.EOF {
		return jsonError(err)
	}
	// IsValid refused what the decoder takes: only possible if the two
	// disagree on a rule. Refuse all the same.
	return errorf(CodeMalformedJSON, "", "not valid JSON")
}

// jsonFault is what CheckJSON finds wrong with data, for a detail.
func jsonFault(data []byte) string {
	var e *Error
	if errors.As(CheckJSON(data), &e) {
		return e.Detail
	}
	return "not valid JSON"
}

// jsonError turns an error of the JSON v2 decoder into the *Error a client
// is answered with. The detail names what is wrong and where: the
// decoder's own words, which say "duplicate object member name", "invalid
// UTF-8" or "invalid surrogate pair", with a JSON pointer and a byte
// offset.
func jsonError(err error) error {
	var syn *jsontext.SyntacticError
	var sem *jsonv2.SemanticError
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
		return errorf(CodeMalformedJSON, "", "not valid JSON: it ends before the value does")
	case errors.As(err, &syn):
		e := errorf(CodeMalformedJSON, "", "not valid JSON: %s", strings.TrimPrefix(syn.Error(), "jsontext: "))
		if errors.Is(syn.Err, jsontext.ErrDuplicateName) {
			// The member named twice: the field a client (or a proxy) would
			// have read two ways.
			e.Field = pointerField(syn.JSONPointer)
		}
		return e
	case errors.As(err, &sem) && sem.JSONPointer != "":
		field := pointerField(sem.JSONPointer)
		if sem.GoType != nil && sem.JSONKind != 0 {
			return errorf(CodeInvalidField, field, "%s must be %s, not %s", field, jsonTypeName(sem.GoType), jsonKindName(sem.JSONKind))
		}
		return errorf(CodeInvalidField, field, "%s: %v", field, sem.Err)
	case errors.As(err, &sem):
		return errorf(CodeMalformedJSON, "", "not a JSON object")
	}
	return errorf(CodeMalformedJSON, "", "not valid JSON: %v", err)
}

// pointerField writes a JSON pointer the way error fields are named:
// "/limits/max_input_bytes" is limits.max_input_bytes, an array index is
// [i].
func pointerField(p jsontext.Pointer) string {
	var b strings.Builder
	for tok := range p.Tokens() {
		if isIndex(tok) {
			b.WriteString("[" + tok + "]")
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(tok)
	}
	return b.String()
}

func isIndex(s string) bool {
	if s == "" || len(s) > 1 && s[0] == '0' {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// jsonTypeName is how the Go type a member decodes into reads in an
// error: the JSON it takes.
func jsonTypeName(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	}
	return "another JSON value"
}

// jsonKindName names the JSON a member held: a string, a number, ...
func jsonKindName(k jsontext.Kind) string {
	switch k {
	case 'n':
		return "null"
	case 'f', 't':
		return "a boolean"
	case '"':
		return "a string"
	case '0':
		return "a number"
	case '{':
		return "an object"
	case '[':
		return "an array"
	}
	return "this value"
}
