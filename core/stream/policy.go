package stream

import (
	"errors"
	"time"

	"github.com/switchyard/switchyard/core"
)

// SlowPolicy is what happens when a stream falls too far behind.
type SlowPolicy int

// Slow-consumer policies.
const (
	// Terminate ends the stream with a terminated event; the client resumes
	// from the last id it received. The default: a client cannot detect a
	// message it never saw, so dropping must be asked for.
	Terminate SlowPolicy = iota
	// DropOldest skips the oldest unsent events and says so with a gap event.
	DropOldest
)

// Policy is one stream's bounds and clocks.
type Policy struct {
	// MaxLagEvents and MaxLagBytes bound the events appended to the job but
	// not yet written to this stream: its queue.
	MaxLagEvents int
	MaxLagBytes  int64
	Slow         SlowPolicy
	// Setup bounds the time until the first write has been handed over.
	Setup time.Duration
	// Idle ends a stream that wrote no event for this long (heartbeats do
	// not count: they are not events).
	Idle time.Duration
	// MaxDuration ends any stream after this long; the client resumes.
	MaxDuration time.Duration
	// Heartbeat is sent after this much silence. Liveness only.
	Heartbeat time.Duration
	// WriteTimeout bounds each write after the first: a client that cannot
	// take one in this long is gone or hopelessly slow.
	WriteTimeout time.Duration
	// Stall is how long a paced stream (its job's owner: Request.Sent) may
	// make no progress while it has something to send before it is
	// terminated as a slow consumer. Such a stream is never judged by how
	// far behind it is: its job's worker waits for it instead. 0 means
	// half WriteTimeout; it must be shorter than WriteTimeout.
	Stall time.Duration
}

// DefaultPolicy returns the bounds and clocks a node uses unless told
// otherwise.
func DefaultPolicy() Policy {
	return Policy{
		MaxLagEvents: 1024,
		MaxLagBytes:  4 << 20,
		Setup:        10 * time.Second,
		Idle:         5 * time.Minute,
		MaxDuration:  time.Hour,
		Heartbeat:    15 * time.Second,
		WriteTimeout: 10 * time.Second,
	}
}

// Validate refuses a combination in which one clock could never fire, or a
// bound that could never hold an event.
func (p Policy) Validate() error {
	bad := func(field string, v any, msg string) error {
		return &core.ConfigError{Field: field, Value: v, Err: errors.New(msg)}
	}
	switch {
	case p.MaxLagEvents < 1:
		return bad("stream-max-events", p.MaxLagEvents, "must be positive")
	case p.MaxLagBytes < 1:
		return bad("stream-max-bytes", p.MaxLagBytes, "must be positive")
	case p.Setup <= 0:
		return bad("stream-setup-timeout", p.Setup, "must be positive")
	case p.Idle <= 0:
		return bad("stream-idle-timeout", p.Idle, "must be positive")
	case p.MaxDuration <= 0:
		return bad("stream-max-duration", p.MaxDuration, "must be positive")
	case p.Heartbeat <= 0:
		return bad("stream-heartbeat", p.Heartbeat, "must be positive")
	case p.WriteTimeout <= 0:
		return bad("stream-write-timeout", p.WriteTimeout, "must be positive")
	case p.Stall < 0:
		return bad("stream-stall-timeout", p.Stall, "must not be negative (0: half stream-write-timeout)")
	case p.Heartbeat >= p.Idle:
		return bad("stream-heartbeat", p.Heartbeat, "must be shorter than stream-idle-timeout, or the idle timeout fires on a healthy stream before any heartbeat could show it alive")
	case p.Setup >= p.Idle:
		return bad("stream-setup-timeout", p.Setup, "must be shorter than stream-idle-timeout, or the idle timeout could pre-empt setup")
	case p.Idle >= p.MaxDuration:
		return bad("stream-idle-timeout", p.Idle, "must be shorter than stream-max-duration, or it could never fire")
	case p.WriteTimeout >= p.Idle:
		return bad("stream-write-timeout", p.WriteTimeout, "must be shorter than stream-idle-timeout")
	case p.Stall >= p.WriteTimeout:
		return bad("stream-stall-timeout", p.Stall, "must be shorter than stream-write-timeout, or a reader that stopped is cut by a failed write (its job cancelled as if the client had left) instead of terminated with a resume hint")
	}
	return nil
}

// stall is the stall timeout in force: Stall, or half WriteTimeout when
// it is 0. Shorter than WriteTimeout either way, so a reader that stopped
// is judged stalled (terminated, and it may resume) before a write of its
// times out (a failed write: the client is taken to have left).
func (p Policy) stall() time.Duration {
	if p.Stall > 0 {
		return p.Stall
	}
	return p.WriteTimeout / 2
}

// abortGrace is how long a stream judged slow gets to finish the write it
// is blocked in and send its terminated event. A client that reads slowly
// gets the event telling it how to resume (on SSE at once, the sink making
// room for it; see Sink.Abort); a write still blocked when the grace runs
// out is cut — and the client resumes all the same.
func abortGrace(p Policy) time.Duration { return min(p.WriteTimeout, time.Second) }
