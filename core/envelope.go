package core

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"time"
)

// EnvelopeVersion is the newest envelope version this node understands.
const EnvelopeVersion = 1

// Envelope is what a requester posts: the work to run and how to run it.
// Only Input is required. Unknown JSON fields are ignored, never fatal, so
// old and new nodes and clients read each other during a rolling upgrade.
type Envelope struct {
	Version int
	// TTL is relative: the time the job may take from now, decremented at
	// every hop by measured elapsed time. Zero means the node's default.
	TTL time.Duration
	// Capabilities the worker must have, one value per key.
	Capabilities map[string]string
	// Input is handed to the worker as is (a JSON value).
	Input json.RawMessage
	// Options is handed to the worker as is (a JSON object, may be empty).
	Options json.RawMessage
	// Limits lower the node's ceilings for this job.
	Limits RequestLimits
	// Zone, when set, restricts the job to workers on nodes of that zone.
	Zone string
	// Grace keeps a streamed job alive this long after its client
	// disconnects, so a resume can pick it up.
	Grace time.Duration
}

// wireEnvelope is the JSON form. Pointers tell "absent" from "zero".
type wireEnvelope struct {
	Version      *int              `json:"version"`
	TTLMs        *int64            `json:"ttl_ms"`
	Capabilities map[string]string `json:"capabilities"`
	Input        json.RawMessage   `json:"input"`
	Options      json.RawMessage   `json:"options"`
	Limits       *struct {
		MaxInputBytes  *int64 `json:"max_input_bytes"`
		MaxQueueDepth  *int   `json:"max_queue_depth"`
		MaxQueueBytes  *int64 `json:"max_queue_bytes"`
		MaxOutputBytes *int64 `json:"max_output_bytes"`
	} `json:"limits"`
	Zone    string `json:"zone"`
	GraceMs *int64 `json:"grace_ms"`
}

// ParseEnvelope decodes and checks the shape of an envelope. Limits are
// checked separately (Limits.Apply) because they depend on the node.
func ParseEnvelope(data []byte) (*Envelope, error) {
	var w wireEnvelope
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&w); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) && typeErr.Field != "" {
			return nil, errorf(CodeInvalidField, typeErr.Field, "%s must be %s, not %s", typeErr.Field, typeErr.Type, typeErr.Value)
		}
		return nil, errorf(CodeMalformedJSON, "", "the body is not a JSON object: %v", err)
	}
	if dec.More() {
		return nil, errorf(CodeMalformedJSON, "", "the body holds more than one JSON value")
	}
	// More stops at a stray ']' or '}'; only whitespace may follow the object.
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errorf(CodeMalformedJSON, "", "the body has data after the JSON object")
	}
	env := &Envelope{Version: EnvelopeVersion, Capabilities: w.Capabilities, Zone: w.Zone}
	if w.Version != nil {
		if *w.Version < 1 || *w.Version > EnvelopeVersion {
			return nil, errorf(CodeUnsupportedVersion, "version", "version %d is not supported; this node reads 1 to %d", *w.Version, EnvelopeVersion)
		}
		env.Version = *w.Version
	}
	if len(w.Input) == 0 || bytes.Equal(w.Input, []byte("null")) {
		return nil, errorf(CodeMissingInput, "input", "input is required")
	}
	env.Input = w.Input
	if len(w.Options) > 0 && !bytes.Equal(w.Options, []byte("null")) {
		if w.Options[0] != '{' {
			return nil, errorf(CodeInvalidField, "options", "options must be an object")
		}
		env.Options = w.Options
	}
	if w.TTLMs != nil {
		// An absurd ttl_ms must not wrap around into a small Duration.
		if *w.TTLMs <= 0 || *w.TTLMs > maxDurationMs {
			return nil, errorf(CodeTTLOutOfRange, "ttl_ms", "ttl_ms must be positive and at most %d", maxDurationMs)
		}
		env.TTL = time.Duration(*w.TTLMs) * time.Millisecond
	}
	if w.GraceMs != nil {
		if *w.GraceMs < 0 {
			return nil, errorf(CodeInvalidField, "grace_ms", "grace_ms must not be negative")
		}
		// Above the node's --max-grace a window is capped to it (Limits.Apply);
		// clamping here only keeps a huge one from overflowing a Duration.
		env.Grace = time.Duration(min(*w.GraceMs, maxDurationMs)) * time.Millisecond
	}
	for k, v := range w.Capabilities {
		if !validCapabilityPart(k) || !validCapabilityPart(v) {
			return nil, errorf(CodeInvalidField, "capabilities", "capability %q=%q: keys and values are 1-128 of [A-Za-z0-9._:/-]", k, v)
		}
	}
	if w.Zone != "" && !ValidName(w.Zone) {
		return nil, errorf(CodeInvalidField, "zone", "zone must be 1-128 of [A-Za-z0-9._-]")
	}
	if l := w.Limits; l != nil {
		var err error
		if env.Limits.MaxInputBytes, err = requestLimit("max_input_bytes", l.MaxInputBytes); err != nil {
			return nil, err
		}
		depth, err := requestLimit("max_queue_depth", l.MaxQueueDepth)
		if err != nil {
			return nil, err
		}
		env.Limits.MaxQueueDepth = int(depth)
		if env.Limits.MaxQueueBytes, err = requestLimit("max_queue_bytes", l.MaxQueueBytes); err != nil {
			return nil, err
		}
		if env.Limits.MaxOutputBytes, err = requestLimit("max_output_bytes", l.MaxOutputBytes); err != nil {
			return nil, err
		}
	}
	return env, nil
}

// requestLimit reads one of an envelope's limits: absent is the node's
// (0 in RequestLimits); a value must be at least 1 — an explicit 0 is
// refused rather than read as "the node's", which is what leaving it out
// says, because a client that asks for no output at all cannot get it.
func requestLimit[T int | int64](name string, v *T) (int64, error) {
	switch {
	case v == nil:
		return 0, nil
	case *v < 1:
		return 0, errorf(CodeInvalidField, "limits."+name, "%s must be at least 1 (leave it out for the node's ceiling)", name)
	}
	return int64(*v), nil
}

// maxDurationMs is the largest millisecond count a time.Duration can hold.
const maxDurationMs = int64(1<<63-1) / int64(time.Millisecond)

// ValidName reports whether s can name a queue, a zone or a node:
// 1-128 characters of [A-Za-z0-9._-], not starting with a dot. Names become
// catalog key segments, so '/' is never allowed.
func ValidName(s string) bool {
	if s == "" || len(s) > 128 || s[0] == '.' {
		return false
	}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		case r == '.', r == '_', r == '-':
		default:
			return false
		}
	}
	return true
}

// CheckQueueName returns a typed error for a queue name that cannot be used.
func CheckQueueName(name string) error {
	if !ValidName(name) {
		return errorf(CodeInvalidQueueName, "queue", "queue names are 1-128 of [A-Za-z0-9._-], not starting with '.'")
	}
	return nil
}
