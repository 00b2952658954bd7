package resume_test

import (
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/core/resume"
)

// fuzzKeys are the keys of the fuzz targets' keyring, k1 signing and k2
// verifying only; the seed corpus under testdata/fuzz holds tokens signed
// with both.
var fuzzKeys = []resume.Key{testKey("k1", 1), testKey("k2", 2)}

// fuzzRing is the keyring both fuzz targets use.
func fuzzRing(tb testing.TB) *resume.Keyring {
	return MustKeyring(tb, "k1", fuzzKeys...)
}

// FuzzVerify feeds Verify arbitrary strings. It must never panic; it must
// reject with an ErrInvalidToken error carrying a known Reason; and a string
// it accepts must be exactly the token Sign produces for the position it
// returns, that is, nothing verifies that a node did not sign.
func FuzzVerify(f *testing.F) {
	kr := fuzzRing(f)
	// signers re-sign an accepted token with the key it names.
	signers := map[string]*resume.Keyring{}
	for _, k := range fuzzKeys {
		signers[k.ID] = MustKeyring(f, k.ID, fuzzKeys...)
	}
	p := samplePosition()
	want := expectFor(p)
	for _, ttl := range []time.Duration{time.Second, 10 * time.Minute, resume.MaxTTL} {
		tok := MustSign(f, kr, p, t0, ttl)
		f.Add(tok)
		f.Add(tok[:len(tok)-1])
		f.Add(tok + ".")
	}
	f.Add("")
	f.Add("..")
	f.Add("k1..")
	f.Add(strings.Repeat("A", resume.MaxTokenLen+1))

	reasons := resume.Reasons()
	now := t0.Add(time.Second)
	f.Fuzz(func(t *testing.T, token string) {
		got, err := kr.Verify(token, now, want)
		if err != nil {
			if !errors.Is(err, resume.ErrInvalidToken) {
				t.Fatalf("Verify(%q) = %v, not ErrInvalidToken", token, err)
			}
			if r := resume.ReasonOf(err); !slices.Contains(reasons, r) {
				t.Fatalf("Verify(%q): unknown reason %q", token, r)
			}
			if len(token) > resume.MaxTokenLen && resume.ReasonOf(err) != resume.ReasonOversized {
				t.Fatalf("Verify(%d-byte token): reason %q, want oversized", len(token), resume.ReasonOf(err))
			}
			return
		}
		kid, _, _ := strings.Cut(token, ".")
		signer, ok := signers[kid]
		if !ok {
			t.Fatalf("accepted %q under key id %q, which is not in the ring", token, kid)
		}
		resigned, err := signer.Sign(got, got.IssuedAt, got.ExpiresAt.Sub(got.IssuedAt))
		if err != nil {
			t.Fatalf("accepted %q but cannot re-sign its position %+v: %v", token, got, err)
		}
		if resigned != token {
			t.Fatalf("accepted %q, but Sign gives %q for its position", token, resigned)
		}
	})
}

// FuzzRoundTrip signs arbitrary positions: Sign must fail exactly on the
// documented bounds, and otherwise produce a short, SSE-safe token that
// Verify turns back into the same position. The fingerprints come in as
// integers rather than strings: any 16 bytes are a valid fingerprint, and
// string arguments that only feed a hash make the fuzzer's input
// minimization crawl. For the same reason the stream id is cut to a little
// over MaxStreamLen: every longer one takes the same path through Sign,
// but the minimizer's quadratic pass over a kilobyte-long string takes
// tens of seconds (the length is formatted into Sign's error, so it
// cannot just drop the tail without changing coverage).
func FuzzRoundTrip(f *testing.F) {
	kr := fuzzRing(f)
	f.Add("6f1c2a5e-3b7d-4e8f-9a0b-1c2d3e4f5a6b", uint64(3), uint64(1042), uint64(7), uint64(1), uint64(2), uint64(3), uint64(4), int64(1_790_000_000), int64(600))
	f.Add("j", uint64(0), uint64(0), uint64(0), uint64(0), uint64(0), uint64(0), uint64(0), int64(0), int64(1))
	f.Add(strings.Repeat("\xff", resume.MaxStreamLen), ^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0), int64(1<<42-1), int64(86400))
	f.Add("", uint64(1), uint64(2), uint64(3), uint64(0), uint64(0), uint64(0), uint64(0), int64(-1), int64(0))

	f.Fuzz(func(t *testing.T, stream string, gen, seq, snap, c0, c1, f0, f1 uint64, issued, ttlSec int64) {
		if len(stream) > resume.MaxStreamLen+8 {
			stream = stream[:resume.MaxStreamLen+8]
		}
		p := resume.Position{Stream: stream, Generation: gen, Seq: seq, Snapshot: snap}
		binary.LittleEndian.PutUint64(p.Caller[:8], c0)
		binary.LittleEndian.PutUint64(p.Caller[8:], c1)
		binary.LittleEndian.PutUint64(p.Filter[:8], f0)
		binary.LittleEndian.PutUint64(p.Filter[8:], f1)
		var ttl time.Duration
		switch {
		case ttlSec > int64(resume.MaxTTL/time.Second):
			ttl = resume.MaxTTL + time.Second
		case ttlSec < 0:
			ttl = -time.Second
		default:
			ttl = time.Duration(ttlSec) * time.Second
		}
		now := time.Unix(issued, 0)
		tok, err := kr.Sign(p, now, ttl)

		signable := len(stream) >= 1 && len(stream) <= resume.MaxStreamLen &&
			ttl >= time.Second && ttl <= resume.MaxTTL && issued >= 0 && issued < 1<<42
		if !signable {
			if !errors.Is(err, resume.ErrUnsignable) {
				t.Fatalf("Sign(%+v, %v, %v) = (%q, %v), want ErrUnsignable", p, now, ttl, tok, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("Sign(%+v, %v, %v): %v", p, now, ttl, err)
		}
		if len(tok) > resume.MaxTokenLen {
			t.Fatalf("token is %d bytes, over MaxTokenLen", len(tok))
		}
		checkTokenChars(t, tok)

		got, err := kr.Verify(tok, now, expectFor(p))
		if err != nil {
			t.Fatalf("Verify(Sign(%+v)) = %v", p, err)
		}
		p.IssuedAt = time.Unix(issued, 0).UTC()
		p.ExpiresAt = p.IssuedAt.Add(ttl)
		if got != p {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got, p)
		}
		if _, err := kr.Verify(tok, p.ExpiresAt, expectFor(p)); resume.ReasonOf(err) != resume.ReasonExpired {
			t.Fatalf("Verify at expiry = %v, want expired", err)
		}
	})
}
