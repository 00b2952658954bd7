package core

import (
	"errors"
	"time"
)

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
	}
}

// Validate reports the first limit that cannot work, naming its flag.
func (l Limits) Validate() error {
	switch {
	case l.MaxInputBytes <= 0:
		return &ConfigError{"max-input-bytes", l.MaxInputBytes, errors.New("must be positive")}
	case l.MaxQueueDepth <= 0:
		return &ConfigError{"max-queue-depth", l.MaxQueueDepth, errors.New("must be positive")}
	case l.MaxQueueBytes < l.MaxInputBytes:
		return &ConfigError{"max-queue-bytes", l.MaxQueueBytes, errors.New("must be at least max-input-bytes, or no job could ever be queued")}
	case l.MaxTTL < time.Millisecond:
		return &ConfigError{"max-ttl", l.MaxTTL, errors.New("must be at least 1ms")}
	case l.DefaultTTL <= 0 || l.DefaultTTL > l.MaxTTL:
		return &ConfigError{"default-ttl", l.DefaultTTL, errors.New("must be positive and at most max-ttl")}
	case l.MaxOutputBytes <= 0:
		return &ConfigError{"max-output-bytes", l.MaxOutputBytes, errors.New("must be positive")}
	case l.MaxGrace < 0:
		return &ConfigError{"max-grace", l.MaxGrace, errors.New("must not be negative")}
	}
	return nil
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
}

// Apply checks an envelope against the node's ceilings and returns the limits
// that apply to its job. It refuses, rather than clamps, a limit above a
// ceiling: a caller that asked for more than it can get should hear so. The
// grace window is the exception: one above MaxGrace is capped to it (and
// to the TTL), as the node has always documented — a grace window is a
// courtesy to a client that may come back, not a bound the client relies
// on. Negative values are invalid_field.
func (l Limits) Apply(env *Envelope) (Effective, error) {
	eff := Effective{
		TTL:            l.DefaultTTL,
		MaxInputBytes:  l.MaxInputBytes,
		MaxQueueDepth:  l.MaxQueueDepth,
		MaxQueueBytes:  l.MaxQueueBytes,
		MaxOutputBytes: l.MaxOutputBytes,
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
	if n := int64(len(env.Input)); n > eff.MaxInputBytes {
		return Effective{}, errorf(CodeInputTooLarge, "input", "input is %d bytes, the limit is %d", n, eff.MaxInputBytes)
	}
	return eff, nil
}
