package core

import (
	"bytes"
	"encoding/json"
	"time"
)

// This file is what a requester may ask for: the envelope it posts, and the
// node's limits the envelope is held to (Limits.Apply).

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
	// AffinityKey, when set, sends the job to the same capable consumer
	// as every other job with this key while that consumer lives and has
	// room (affinity.go); "" routes by load alone.
	AffinityKey string
	// Priority orders the job among its subject's waiting jobs, higher
	// first, with aging (fairqueue.go): MinPriority to MaxPriority, 0 by
	// default.
	Priority int
	// OnWorkerLost is what happens to the job if its worker is lost after
	// it produced output: LostFail (the default) ends it worker_lost,
	// LostRestart runs it again (restart.go).
	OnWorkerLost LostPolicy
	// MaxRestarts, when set, lowers the node's restart ceiling for this
	// job (0: never restarted); nil means the node's.
	MaxRestarts *int
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
	// AffinityKey and Priority are raw so that their refusals carry their
	// own codes (checkScheduling), a wrong type included.
	AffinityKey json.RawMessage `json:"affinity_key"`
	Priority    json.RawMessage `json:"priority"`
	// OnWorkerLost and MaxRestarts are raw so that a wrong type is the
	// field's own refusal (checkRestart).
	OnWorkerLost json.RawMessage `json:"on_worker_lost"`
	MaxRestarts  json.RawMessage `json:"max_restarts"`
}

// ParseEnvelope decodes and checks the shape of an envelope, under the
// strict JSON rules (DecodeJSON): one JSON object, valid UTF-8, no member
// named twice, names matched exactly. Limits are checked separately
// (Limits.Apply) because they depend on the node.
func ParseEnvelope(data []byte) (*Envelope, error) {
	var w wireEnvelope
	if err := DecodeJSON(data, &w); err != nil {
		return nil, err
	}
	return checkEnvelope(&w)
}

// checkEnvelope checks a decoded envelope's fields.
func checkEnvelope(w *wireEnvelope) (*Envelope, error) {
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
	if err := checkScheduling(w, env); err != nil {
		return nil, err
	}
	if err := checkRestart(w, env); err != nil {
		return nil, err
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

// Limits are a node's ceilings. An envelope may lower any of them for its own
// job and never raise one: a node's memory is bounded by that node's own
// configuration, which is the only place it can be bounded honestly.
type Limits struct {
	// MaxInputBytes caps the size of an envelope's input (its JSON text).
	MaxInputBytes int64
	// MaxQueueDepth caps the jobs waiting in one queue (bound jobs excluded).
	MaxQueueDepth int
	// MaxQueueBytes caps the summed input bytes of the jobs waiting in one queue.
	MaxQueueBytes int64
	// MaxTTL is the longest TTL an envelope may ask for.
	MaxTTL time.Duration
	// DefaultTTL applies when an envelope names none.
	DefaultTTL time.Duration
	// MaxOutputBytes caps the summed output a job may produce.
	MaxOutputBytes int64
	// MaxGrace caps the disconnect grace window an envelope may ask for.
	MaxGrace time.Duration
	// MaxRestarts caps how many times a job that opted into restarts may
	// run again after losing its worker (0: never).
	MaxRestarts int
}

// DefaultLimits returns the limits a node uses when it is not told otherwise.
func DefaultLimits() Limits {
	return Limits{
		MaxInputBytes:  1 << 20,
		MaxQueueDepth:  1024,
		MaxQueueBytes:  64 << 20,
		MaxTTL:         10 * time.Minute,
		DefaultTTL:     time.Minute,
		MaxOutputBytes: 64 << 20,
		MaxGrace:       30 * time.Second,
		MaxRestarts:    DefaultMaxRestarts,
	}
}

// Validate reports the first limit that cannot work, naming its flag.
func (l Limits) Validate() error {
	return firstBroken([]setting{
		positive("max-input-bytes", l.MaxInputBytes),
		positive("max-queue-depth", l.MaxQueueDepth),
		{l.MaxQueueBytes < l.MaxInputBytes, "max-queue-bytes", l.MaxQueueBytes, "must be at least max-input-bytes, or no job could ever be queued"},
		{l.MaxTTL < time.Millisecond, "max-ttl", l.MaxTTL, "must be at least 1ms"},
		{l.DefaultTTL <= 0 || l.DefaultTTL > l.MaxTTL, "default-ttl", l.DefaultTTL, "must be positive and at most max-ttl"},
		positive("max-output-bytes", l.MaxOutputBytes),
		notNegative("max-grace", l.MaxGrace),
		notNegative("max-restarts", l.MaxRestarts),
	})
}

// RequestLimits are the limits an envelope asks for. Zero means "the node's".
type RequestLimits struct {
	MaxInputBytes  int64
	MaxQueueDepth  int
	MaxQueueBytes  int64
	MaxOutputBytes int64
}

// Effective is what applies to one job: the node's limits, lowered by the
// envelope, plus the envelope's resolved TTL and grace window.
type Effective struct {
	TTL            time.Duration
	Grace          time.Duration
	MaxInputBytes  int64
	MaxQueueDepth  int
	MaxQueueBytes  int64
	MaxOutputBytes int64
	// MaxRestarts is how many times the job may restart after losing its
	// worker, if it opted in.
	MaxRestarts int
}

// Apply checks an envelope against the node's ceilings and returns the limits
// that apply to its job. It refuses, rather than clamps, a limit above a
// ceiling: a caller that asked for more than it can get should hear so. The
// grace window is the exception: one above MaxGrace is capped to it (and
// to the TTL), as docs/api.md documents — a grace window is a
// courtesy to a client that may come back, not a bound the client relies
// on. Negative values are invalid_field.
func (l Limits) Apply(env *Envelope) (Effective, error) {
	eff := Effective{
		TTL:            l.DefaultTTL,
		MaxInputBytes:  l.MaxInputBytes,
		MaxQueueDepth:  l.MaxQueueDepth,
		MaxQueueBytes:  l.MaxQueueBytes,
		MaxOutputBytes: l.MaxOutputBytes,
		MaxRestarts:    l.MaxRestarts,
	}
	if env.TTL != 0 {
		if env.TTL < time.Millisecond || env.TTL > l.MaxTTL {
			return Effective{}, errorf(CodeTTLOutOfRange, "ttl_ms", "ttl_ms must be between 1 and %d", l.MaxTTL.Milliseconds())
		}
		eff.TTL = env.TTL
	}
	if env.Grace < 0 {
		return Effective{}, errorf(CodeInvalidField, "grace_ms", "grace_ms must not be negative")
	}
	eff.Grace = min(env.Grace, l.MaxGrace, eff.TTL)
	lower := func(field string, asked, ceiling int64) (int64, error) {
		switch {
		case asked == 0:
			return ceiling, nil
		case asked < 0:
			return 0, errorf(CodeInvalidField, "limits."+field, "%s must be at least 1", field)
		case asked > ceiling:
			return 0, errorf(CodeLimitAboveCeiling, "limits."+field, "%s must be between 1 and the node's %d", field, ceiling)
		}
		return asked, nil
	}
	var err error
	if eff.MaxInputBytes, err = lower("max_input_bytes", env.Limits.MaxInputBytes, l.MaxInputBytes); err != nil {
		return Effective{}, err
	}
	depth, err := lower("max_queue_depth", int64(env.Limits.MaxQueueDepth), int64(l.MaxQueueDepth))
	if err != nil {
		return Effective{}, err
	}
	eff.MaxQueueDepth = int(depth)
	if eff.MaxQueueBytes, err = lower("max_queue_bytes", env.Limits.MaxQueueBytes, l.MaxQueueBytes); err != nil {
		return Effective{}, err
	}
	if eff.MaxOutputBytes, err = lower("max_output_bytes", env.Limits.MaxOutputBytes, l.MaxOutputBytes); err != nil {
		return Effective{}, err
	}
	if r := env.MaxRestarts; r != nil {
		switch {
		case *r < 0:
			return Effective{}, errorf(CodeInvalidField, "max_restarts", "max_restarts must be at least 0")
		case *r > l.MaxRestarts:
			return Effective{}, errorf(CodeLimitAboveCeiling, "max_restarts", "max_restarts must be between 0 and the node's %d", l.MaxRestarts)
		}
		eff.MaxRestarts = *r
	}
	if n := int64(len(env.Input)); n > eff.MaxInputBytes {
		return Effective{}, errorf(CodeInputTooLarge, "input", "input is %d bytes, the limit is %d", n, eff.MaxInputBytes)
	}
	return eff, nil
}
