package resume

import "errors"

// Errors returned by this package.
var (
	// ErrInvalidToken is the single error every rejected resume token
	// matches, whatever the cause. Transports map it to one response and
	// never reveal more; see InvalidError for the logged cause.
	ErrInvalidToken = errors.New("resume: invalid token")
	// ErrInvalidKey is matched by key and keyring configuration errors from
	// ParseKey and NewKeyring.
	ErrInvalidKey = errors.New("resume: invalid key")
	// ErrUnsignable is matched by Sign's errors: the position or TTL cannot
	// be represented in a token. It signals a bug in the caller, never
	// client input.
	ErrUnsignable = errors.New("resume: cannot sign position")
)

// Reason is the internal cause of a rejected token. It is meant for logs and
// metric labels on the node, never for the client.
type Reason string

// Reasons a token is rejected, in the order Verify checks them, followed by
// the reasons Position.Check reports.
const (
	// ReasonOversized: the token is longer than MaxTokenLen.
	ReasonOversized Reason = "oversized"
	// ReasonEmpty: the token is the empty string.
	ReasonEmpty Reason = "empty"
	// ReasonMalformed: the token is not three non-empty '.'-separated
	// segments.
	ReasonMalformed Reason = "malformed"
	// ReasonUnknownKey: the key id is not in the keyring (never was, or the
	// key has been retired).
	ReasonUnknownKey Reason = "unknown_key"
	// ReasonMACLength: the MAC segment has the wrong length (a truncated or
	// padded token).
	ReasonMACLength Reason = "mac_length"
	// ReasonMACEncoding: the MAC segment is not canonical unpadded base64url.
	ReasonMACEncoding Reason = "mac_encoding"
	// ReasonBadSignature: the MAC does not match the key id and payload.
	ReasonBadSignature Reason = "bad_signature"
	// ReasonUnsupportedVersion: the payload is correctly signed but its
	// version byte is not one this build decodes.
	ReasonUnsupportedVersion Reason = "unsupported_version"
	// ReasonBadPayload: the payload is correctly signed but does not decode.
	ReasonBadPayload Reason = "bad_payload"
	// ReasonNotYetValid: the token was issued more than ClockSkew in the
	// future.
	ReasonNotYetValid Reason = "not_yet_valid"
	// ReasonExpired: the token's expiry has passed.
	ReasonExpired Reason = "expired"
	// ReasonStreamMismatch: the token was issued for another stream.
	ReasonStreamMismatch Reason = "stream_mismatch"
	// ReasonCallerMismatch: the token was issued to another caller.
	ReasonCallerMismatch Reason = "caller_mismatch"
	// ReasonFilterMismatch: the token was issued for another filter.
	ReasonFilterMismatch Reason = "filter_mismatch"
	// ReasonGenerationMoved: the stream's generation is no longer the
	// token's (reported by Position.Check).
	ReasonGenerationMoved Reason = "generation_moved"
	// ReasonSnapshotMoved: the stream's snapshot version is no longer the
	// token's (reported by Position.Check).
	ReasonSnapshotMoved Reason = "snapshot_moved"
)

// Reasons returns every Reason this package reports, for example to create
// one counter per reason up front.
func Reasons() []Reason {
	return []Reason{
		ReasonOversized, ReasonEmpty, ReasonMalformed, ReasonUnknownKey,
		ReasonMACLength, ReasonMACEncoding, ReasonBadSignature,
		ReasonUnsupportedVersion, ReasonBadPayload, ReasonNotYetValid,
		ReasonExpired, ReasonStreamMismatch, ReasonCallerMismatch,
		ReasonFilterMismatch, ReasonGenerationMoved, ReasonSnapshotMoved,
	}
}

// InvalidError is the error returned for a rejected token. It unwraps to
// ErrInvalidToken and carries the internal Reason. Its message includes the
// reason, so it is for node logs only: send clients the text of
// ErrInvalidToken, or better, a fixed transport-level response.
type InvalidError struct {
	Reason Reason
}

// Error implements error.
func (e *InvalidError) Error() string {
	return ErrInvalidToken.Error() + ": " + string(e.Reason)
}

// Unwrap returns ErrInvalidToken.
func (e *InvalidError) Unwrap() error { return ErrInvalidToken }

// ReasonOf returns the Reason carried by err, or "" if err is not (and does
// not wrap) an *InvalidError.
func ReasonOf(err error) Reason {
	var ie *InvalidError
	if errors.As(err, &ie) {
		return ie.Reason
	}
	return ""
}

// invalid returns an *InvalidError for r.
func invalid(r Reason) error { return &InvalidError{Reason: r} }
