package resume

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"time"
)

// Position is what a resume token says: where in which stream the client
// is, for whom, and until when.
type Position struct {
	// Stream is the stream's id (the job id): 1 to MaxStreamLen bytes.
	Stream string
	// Generation is the stream's generation when the token was issued.
	Generation uint64
	// Seq is the sequence number of the last event the client received.
	Seq uint64
	// Snapshot is the version of the stream's history the sequence numbers
	// refer to.
	Snapshot uint64
	// Caller is the Fingerprint of the caller the token was issued to.
	Caller [16]byte
	// Filter is the Fingerprint of the filter the stream was opened with.
	Filter [16]byte
	// IssuedAt is when the token was signed, to the second (UTC). Sign sets
	// it; its input value is ignored.
	IssuedAt time.Time
	// ExpiresAt is when the token stops verifying, to the second (UTC). Sign
	// sets it; its input value is ignored.
	ExpiresAt time.Time
}

// Expect is what the current request has, against which Verify checks a
// token: the stream it asks to resume and the fingerprints of its caller and
// of its filter. All three must equal the token's; a zero fingerprint is not
// a wildcard.
type Expect struct {
	// Stream is the stream (job) id the request addresses.
	Stream string
	// Caller is the Fingerprint of the authenticated caller.
	Caller [16]byte
	// Filter is the Fingerprint of the request's filter.
	Filter [16]byte
}

// Check compares the token's generation and snapshot version with the
// stream's current ones, and returns an error matching ErrInvalidToken with
// reason ReasonGenerationMoved or ReasonSnapshotMoved if either moved: a
// sequence number from another generation or snapshot does not name the same
// event, so resuming from it would guess.
func (p Position) Check(generation, snapshot uint64) error {
	if p.Generation != generation {
		return invalid(ReasonGenerationMoved)
	}
	if p.Snapshot != snapshot {
		return invalid(ReasonSnapshotMoved)
	}
	return nil
}

// fingerprintDomain separates Fingerprint's hashes from any other SHA-256
// use.
const fingerprintDomain = "swy-resume-fp-v1"

// Fingerprint returns a 16-byte fingerprint of parts, for Position.Caller,
// Position.Filter and Expect: SHA-256, truncated, over a domain prefix and
// each part preceded by its length, so that distinct part lists never
// collide by concatenation (("ab", "c") and ("a", "bc") differ, and so do
// ("a") and ("a", "")). Tokens are readable by their holder, so parts should
// be identifiers (a tenant and subject, a normalized filter), not secrets.
func Fingerprint(parts ...string) [16]byte {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	h.Write([]byte(fingerprintDomain))
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(parts)))])
	for _, p := range parts {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(p)))])
		h.Write([]byte(p))
	}
	var sum [sha256.Size]byte
	var fp [16]byte
	copy(fp[:], h.Sum(sum[:0]))
	return fp
}

// equalFingerprint compares two fingerprints in constant time.
func equalFingerprint(a, b [16]byte) bool {
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}
