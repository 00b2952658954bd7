package core

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"time"
	"unicode/utf8"
)

// This file is what a requester and its key may ask of the dispatcher's
// order: the envelope's affinity_key and priority, the key's fair-share
// weight and priority cap, and the node's settings for both. The order
// itself is fairqueue.go (subjects, weights, priorities) and affinity.go
// (which consumer); docs/scheduling.md explains the rules and their bounds.

// The envelope's priority range. Higher runs first among one subject's
// waiting jobs; 0 is the default, so a background job asks for less and an
// urgent one for more, and a key's cap can forbid asking for more at all.
const (
	MinPriority = -5
	MaxPriority = 5
)

// MaxAffinityKeyBytes is the longest affinity key an envelope may carry, in
// bytes of UTF-8: a session id, a user id or a prefix hash fits, a prompt
// does not (the key travels with every hop and is remembered by the
// dispatcher).
const MaxAffinityKeyBytes = 256

// MaxWeight is the largest fair-share weight a key may give its subject.
const MaxWeight = 1000

// SchedulingConfig is how a node's dispatchers order and place jobs. Every
// node of a cluster should use the same values: a queue's dispatcher can
// move, and a key's consumer is the same whichever node dispatches only if
// they agree.
type SchedulingConfig struct {
	// AffinityLoadFactor is the bound of consistent hashing with bounded
	// loads: a consumer is skipped for the next in a key's order when its
	// jobs (running, and waiting for it) would pass its slots plus this
	// factor times the queue's average per slot (affinity.go). At least 1;
	// larger keeps more keys on their consumer, smaller balances tighter.
	AffinityLoadFactor float64
	// AffinityWait is how long a job with an affinity key waits for a
	// free slot on its key's consumer (which has room under the bound)
	// while another capable consumer has one; then it goes there. 0 sends
	// it at once: a slot never idles while a job it can run waits.
	AffinityWait time.Duration
	// PriorityAging is how long a waiting job takes to gain one level of
	// priority over jobs posted after it: a job is passed by a later job of
	// its subject only if that one asked for more priority than the
	// waiting time between them makes up (fairqueue.go).
	PriorityAging time.Duration
}

// DefaultSchedulingConfig is the scheduling a node uses unless told
// otherwise.
func DefaultSchedulingConfig() SchedulingConfig {
	return SchedulingConfig{AffinityLoadFactor: 1.5, AffinityWait: time.Second, PriorityAging: 5 * time.Second}
}

// Validate reports the first setting that cannot work, naming its flag.
func (c SchedulingConfig) Validate() error {
	return firstBroken([]setting{
		{!(c.AffinityLoadFactor >= 1) || c.AffinityLoadFactor > 100, "affinity-load-factor", c.AffinityLoadFactor, "must be between 1 and 100"},
		notNegative("affinity-wait", c.AffinityWait),
		positive("priority-aging", c.PriorityAging),
	})
}

// Share is what a submitter's API key says about its jobs' place in a
// queue: its subject's weight and the highest priority it may ask for.
type Share struct {
	// Weight is the subject's fair-share weight, 1 to MaxWeight; 0 is 1.
	Weight int
	// MaxPriority, when set, is the highest priority the key may ask for;
	// nil: any in the range.
	MaxPriority *int
}

// weight is the share's weight, 1 when unset.
func (s Share) weight() int {
	if s.Weight < 1 {
		return 1
	}
	return min(s.Weight, MaxWeight)
}

// allow refuses a priority above the key's cap.
func (s Share) allow(priority int) error {
	if s.MaxPriority != nil && priority > *s.MaxPriority {
		return errorf(CodePriorityNotAllowed, "priority", "this key may ask for a priority of at most %d, not %d", *s.MaxPriority, priority)
	}
	return nil
}

// checkScheduling reads an envelope's affinity_key and priority.
func checkScheduling(w *wireEnvelope, env *Envelope) error {
	if raw := w.AffinityKey; len(raw) > 0 && !bytes.Equal(raw, []byte("null")) {
		var key string
		if raw[0] != '"' || json.Unmarshal(raw, &key) != nil {
			return errorf(CodeInvalidAffinityKey, "affinity_key", "affinity_key must be a string")
		}
		if err := CheckAffinityKey(key, "affinity_key"); err != nil {
			return err
		}
		env.AffinityKey = key
	}
	if raw := w.Priority; len(raw) > 0 && !bytes.Equal(raw, []byte("null")) {
		p, err := ParsePriority(string(raw), "priority")
		if err != nil {
			return err
		}
		env.Priority = p
	}
	return nil
}

// CheckAffinityKey refuses an affinity key that is empty, longer than
// MaxAffinityKeyBytes or not UTF-8; field names where it came from (an
// envelope field, a header).
func CheckAffinityKey(key, field string) error {
	if key == "" || len(key) > MaxAffinityKeyBytes || !utf8.ValidString(key) {
		return errorf(CodeInvalidAffinityKey, field, "%s must be 1 to %d bytes of UTF-8, not %d", field, MaxAffinityKeyBytes, len(key))
	}
	return nil
}

// ParsePriority reads a priority written as a JSON number or a header
// value: a whole number in decimal (invalid_field otherwise, as for any
// field of the wrong type) from MinPriority to MaxPriority
// (priority_out_of_range otherwise).
func ParsePriority(s, field string) (int, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	switch {
	case errors.Is(err, strconv.ErrRange) || err == nil && (n < MinPriority || n > MaxPriority):
		return 0, errorf(CodePriorityOutOfRange, field, "%s must be from %d to %d, not %s", field, MinPriority, MaxPriority, s)
	case err != nil:
		return 0, errorf(CodeInvalidField, field, "%s must be a whole number from %d to %d", field, MinPriority, MaxPriority)
	}
	return int(n), nil
}
