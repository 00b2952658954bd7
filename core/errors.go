package core

import (
	"errors"
	"fmt"
	"time"
)

// Code is a stable, machine-readable error or outcome code: clients match
// on it, never on a detail. Every code any transport emits is declared in
// this file, and package apierr maps each one to its HTTP status and gRPC
// code in one table (a test there fails for a code declared here without a
// mapping; docs/errors.md lists them all).
type Code string

// Codes for requests refused before anything was enqueued.
const (
	CodeMalformedJSON      Code = "malformed_json"
	CodeInvalidField       Code = "invalid_field"
	CodeUnsupportedVersion Code = "unsupported_version"
	CodeMissingInput       Code = "missing_input"
	CodeInvalidQueueName   Code = "invalid_queue_name"
	CodeInputTooLarge      Code = "input_too_large"
	CodeTTLOutOfRange      Code = "ttl_out_of_range"
	CodeLimitAboveCeiling  Code = "limit_above_ceiling"
	CodeNoCapableWorker    Code = "no_capable_worker"
	CodeQueueFull          Code = "queue_full"
	CodeQueueBytesFull     Code = "queue_bytes_full"
	CodeDraining           Code = "draining"
	CodeJobNotFound        Code = "job_not_found"
	CodeIdempotencyReuse   Code = "idempotency_key_reused"
	// CodeInvalidIdempotencyKey refuses an Idempotency-Key longer than
	// MaxIdempotencyKeyBytes.
	CodeInvalidIdempotencyKey Code = "invalid_idempotency_key"
	CodeInvalidWorker         Code = "invalid_worker"
	// CodeModelNotFound: the OpenAI-compatible front door was asked for a
	// model no worker on its queue offers (no consumer declares
	// model=<name>). A model some worker offers but none can take now (its
	// node is not routable) is no_capable_worker instead.
	CodeModelNotFound Code = "model_not_found"
	// CodeRequestTimeout: the request's body did not arrive whole within
	// the node's body timeout (HTTP only).
	CodeRequestTimeout Code = "request_timeout"
	// CodeDispatcherUnavailable: the queue's dispatcher is on another node
	// that could not be reached or elected. Also a job's end when a job
	// going back to its queue could not be handed to any dispatcher.
	CodeDispatcherUnavailable Code = "dispatcher_unavailable"
	// CodeCatalogUnavailable: a write to the catalog that the request needs
	// (a worker's consumer record) failed. The same request may succeed
	// later; the cause is logged on the node, never sent.
	CodeCatalogUnavailable Code = "catalog_unavailable"
	// CodeInvalidResumeToken is the one answer to every resume token that
	// does not verify, whatever the reason (see ErrInvalidResumeToken).
	CodeInvalidResumeToken Code = "invalid_resume_token"
	// CodeInvalidAffinityKey: an envelope's affinity_key (or the OpenAI
	// front door's affinity header or user field) is not a string of 1 to
	// MaxAffinityKeyBytes bytes.
	CodeInvalidAffinityKey Code = "invalid_affinity_key"
	// CodePriorityOutOfRange: an envelope's priority is an integer outside
	// MinPriority to MaxPriority.
	CodePriorityOutOfRange Code = "priority_out_of_range"
	// CodePriorityNotAllowed: an envelope asked for a priority above the
	// one its API key may ask for (the keys file's max_priority).
	CodePriorityNotAllowed Code = "priority_not_allowed"
)

// Codes a job can end with. CodeCancelled and CodeExpired are also outcomes
// of their own; the others end a job as OutcomeFailed.
const (
	CodeCancelled      Code = "cancelled"
	CodeExpired        Code = "expired"
	CodeWorkerLost     Code = "worker_lost"
	CodeRejected       Code = "rejected"
	CodeNodeShutdown   Code = "node_shutdown"
	CodeOutputTooLarge Code = "output_too_large"
	CodeBadOutput      Code = "bad_output"
	CodeWorkerError    Code = "worker_error"
	// CodeTooLarge: a message of the job could not travel between nodes
	// (over the peer message size limit, or not encodable). It is not a
	// stall and is never retried on another transport.
	CodeTooLarge Code = "too_large"
	// CodeCreditExceeded: the job's worker sent output past the output
	// credit it was given (a protocol violation): the output was not
	// relayed, and the worker was told to stop the job.
	CodeCreditExceeded Code = "credit_exceeded"
)

// Codes the transports add: refusals of a request before it reaches the
// engine, and the ends of a stream or worker session that the transport
// decides.
const (
	CodeUnsupportedMediaType Code = "unsupported_media_type"
	CodeBodyTooLarge         Code = "body_too_large"
	CodeNotFound             Code = "not_found"
	CodeMethodNotAllowed     Code = "method_not_allowed"
	// CodeInternal is a server fault. Its cause is logged and counted on
	// the node and never sent: the client sees only this code.
	CodeInternal Code = "internal"
	// CodeWriteFailed ends a job stream whose last event could not be
	// written (the client stopped reading, or the write timed out): the
	// client resumes from the last resume token it received.
	CodeWriteFailed Code = "write_failed"
	// CodeUnexpectedMessage ends a worker session whose message is not
	// valid where it came: a first message that is not a registration, a
	// second registration, a message of a kind the node does not know.
	CodeUnexpectedMessage Code = "unexpected_message"
	// CodeSetupTimeout ends a worker session that did not register within
	// the setup timeout.
	CodeSetupTimeout Code = "setup_timeout"
	// CodeIdleTimeout ends a worker session the node heard nothing from for
	// the idle timeout.
	CodeIdleTimeout Code = "idle_timeout"
	// CodeSessionClosed ends a worker session the engine dropped: it did
	// not answer in time (a stall) or its send queue was full.
	CodeSessionClosed Code = "session_closed"
	// CodeTooManyUpdates ends a worker session that sent capability
	// updates without waiting for the answers.
	CodeTooManyUpdates Code = "too_many_updates"
	// CodeSessionNotFound refuses an HTTP worker's post for a session this
	// node does not have: it ended (the worker opens a new one) or never
	// existed.
	CodeSessionNotFound Code = "session_not_found"
	// CodeJobNotHeld refuses an HTTP worker's post about a job its session
	// does not hold at that generation: never offered to it, already ended,
	// or bound again since (fencing).
	CodeJobNotHeld Code = "job_not_held"
	// CodeUnauthenticated refuses a call without a valid API key on a node
	// that checks keys.
	CodeUnauthenticated Code = "unauthenticated"
	// CodePermissionDenied refuses a call whose key lacks the role, or the
	// queue, it needs.
	CodePermissionDenied Code = "permission_denied"
	// CodeRateLimited refuses a submission whose key is over its rate or
	// its ceiling on jobs in flight; nothing is enqueued.
	CodeRateLimited Code = "rate_limited"
	// CodeReaderBehind refuses an HTTP worker's output post that waited
	// for the job's output credit as long as the node lets a post wait:
	// the job's reader is behind. Nothing was taken; the worker posts the
	// same output again after Retry-After.
	CodeReaderBehind Code = "reader_behind"
)

// Error is a refusal with a stable code. It wraps nothing: it is the
// reason, meant to be shown to the caller.
type Error struct {
	Code   Code
	Detail string
	// Field names the envelope field at fault, when there is one.
	Field string
	// RetryAfter is a hint for refusals that may succeed later (queue_full).
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("switchyard: %s: %s: %s", e.Code, e.Field, e.Detail)
	}
	return fmt.Sprintf("switchyard: %s: %s", e.Code, e.Detail)
}

// Is makes errors.Is match any *Error with the same code, so callers can
// compare against the sentinels below whatever the detail says.
func (e *Error) Is(target error) bool {
	var t *Error
	return errors.As(target, &t) && t.Code == e.Code
}

// Sentinels for errors.Is.
var (
	ErrNoCapableWorker = &Error{Code: CodeNoCapableWorker}
	ErrQueueFull       = &Error{Code: CodeQueueFull}
	ErrDraining        = &Error{Code: CodeDraining}
	ErrJobNotFound     = &Error{Code: CodeJobNotFound}
)

// ErrInvalidResumeToken is the refusal of every resume token that does not
// verify, on every transport: the same code and detail whatever the reason,
// so a caller probing tokens learns nothing from the answer. The reason is
// only logged and counted.
var ErrInvalidResumeToken = &Error{Code: CodeInvalidResumeToken, Detail: "the resume token is not valid for this stream"}

func errorf(code Code, field, format string, args ...any) *Error {
	return &Error{Code: code, Field: field, Detail: fmt.Sprintf(format, args...)}
}

// CodeOf returns the code of err if it is (or wraps) an *Error.
func CodeOf(err error) (Code, bool) {
	// The common answers first: errors.As needs its target on the heap,
	// one allocation per call for nothing when err is nil or an *Error.
	switch e := err.(type) {
	case nil:
		return "", false
	case *Error:
		if e != nil {
			return e.Code, true
		}
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code, true
	}
	return "", false
}

// ConfigError is a node configuration value that cannot work. Field names
// the setting as the operator wrote it (the flag, without its dashes); the
// message shows it as the flag, "--field", so it points at the fix.
type ConfigError struct {
	Field string
	Value any
	Err   error
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("config --%s=%v: %v", e.Field, e.Value, e.Err)
}

func (e *ConfigError) Unwrap() error { return e.Err }

// setting is one rule a Validate checks: the flag and value of a setting,
// and what it must be (the ConfigError's Err) when broken says it is not.
type setting struct {
	broken bool
	flag   string
	value  any
	must   string
}

// number is what the positive and notNegative rules take.
type number interface {
	~int | ~int64 | ~float64
}

// positive is the rule that v, the value of flag, is above zero.
func positive[T number](flag string, v T) setting {
	return setting{v <= 0, flag, v, "must be positive"}
}

// notNegative is the rule that v, the value of flag, is zero or above.
func notNegative[T number](flag string, v T) setting {
	return setting{v < 0, flag, v, "must not be negative"}
}

// firstBroken is the ConfigError of the first broken setting, in order, or
// nil when none is.
func firstBroken(settings []setting) error {
	for _, s := range settings {
		if s.broken {
			return &ConfigError{s.flag, s.value, errors.New(s.must)}
		}
	}
	return nil
}
