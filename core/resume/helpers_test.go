package resume_test

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"testing"
	"time"

	"github.com/switchyard/switchyard/core/resume"
)

// t0 is the tests' "now": 2026-09-21T20:26:40Z.
var t0 = time.Unix(1_790_000_000, 0)

// testKey returns a key named id whose secret is 32 copies of fill, so that
// tokens are reproducible across runs.
func testKey(id string, fill byte) resume.Key {
	return resume.Key{ID: id, Secret: bytes.Repeat([]byte{fill}, 32)}
}

// MustKeyring builds a keyring or fails the test.
func MustKeyring(tb testing.TB, signing string, keys ...resume.Key) *resume.Keyring {
	tb.Helper()
	kr, err := resume.NewKeyring(signing, keys...)
	if err != nil {
		tb.Fatalf("NewKeyring(%q): %v", signing, err)
	}
	return kr
}

// MustSign signs p or fails the test.
func MustSign(tb testing.TB, kr *resume.Keyring, p resume.Position, now time.Time, ttl time.Duration) string {
	tb.Helper()
	tok, err := kr.Sign(p, now, ttl)
	if err != nil {
		tb.Fatalf("Sign(%+v): %v", p, err)
	}
	return tok
}

// samplePosition is a typical position: a UUID job id, small counters.
func samplePosition() resume.Position {
	return resume.Position{
		Stream:     "6f1c2a5e-3b7d-4e8f-9a0b-1c2d3e4f5a6b",
		Generation: 3,
		Seq:        1042,
		Snapshot:   7,
		Caller:     resume.Fingerprint("tenant-a", "user-42"),
		Filter:     resume.Fingerprint("stdout"),
	}
}

// expectFor is the Expect a request matching p would have.
func expectFor(p resume.Position) resume.Expect {
	return resume.Expect{Stream: p.Stream, Caller: p.Caller, Filter: p.Filter}
}

// forge builds a token from a raw payload with the documented MAC
// construction, independently of the package: it both checks that
// construction and lets tests sign payloads Sign would never produce.
func forge(k resume.Key, payload []byte) string {
	enc := base64.RawURLEncoding
	signed := k.ID + "." + enc.EncodeToString(payload)
	h := hmac.New(sha256.New, k.Secret)
	h.Write([]byte("swy-resume-v1" + signed))
	return signed + "." + enc.EncodeToString(h.Sum(nil))
}

// isTokenChar reports whether c may appear in a token.
func isTokenChar(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '_' || c == '.'
}

// checkTokenChars fails the test if tok has a character outside base64url
// and '.'.
func checkTokenChars(tb testing.TB, tok string) {
	tb.Helper()
	for i := 0; i < len(tok); i++ {
		if !isTokenChar(tok[i]) {
			tb.Fatalf("token %q has byte %q at %d", tok, tok[i], i)
		}
	}
}
