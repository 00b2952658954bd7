package resume_test

import (
	"encoding/base64"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard/switchyard/core/resume"
)

// segments splits a token into its three segments.
func segments(tb testing.TB, tok string) (kid, payload, mac string) {
	tb.Helper()
	s := strings.Split(tok, ".")
	if len(s) != 3 {
		tb.Fatalf("token %q has %d segments", tok, len(s))
	}
	return s[0], s[1], s[2]
}

// replaceAt returns s with the byte at i replaced by c.
func replaceAt(s string, i int, c byte) string {
	b := []byte(s)
	b[i] = c
	return string(b)
}

// flip returns s with the base64url character at i changed to another one.
func flip(s string, i int) string {
	if s[i] == 'A' {
		return replaceAt(s, i, 'B')
	}
	return replaceAt(s, i, 'A')
}

func TestVerifyMatrix(t *testing.T) {
	const ttl = 10 * time.Minute
	keyA, keyB, keyOld := testKey("a", 0xA1), testKey("b", 0xB2), testKey("old", 0x01)
	kr := MustKeyring(t, "a", keyA, keyB)

	p := samplePosition()
	want := expectFor(p)
	valid := MustSign(t, kr, p, t0, ttl)
	kid, payload, mac := segments(t, valid)
	rawPayload, err := base64.RawURLEncoding.DecodeString(payload)
	if err != nil {
		t.Fatal(err)
	}

	// Signed by a ring whose key "old" is later retired.
	retired := MustSign(t, MustKeyring(t, "old", keyOld, keyA), p, t0, ttl)
	// The same payload under key "b"'s name: the kid is covered by the MAC.
	relabelled := "b." + payload + "." + mac
	// The last MAC character carries 4 bits and 2 zero bits; setting one of
	// the zero bits decodes to the same MAC unless decoding is strict.
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	last := strings.IndexByte(alphabet, mac[len(mac)-1])
	nonCanonical := kid + "." + payload + "." + replaceAt(mac, len(mac)-1, alphabet[last+1])
	// Validly signed payloads Sign would never produce.
	v2 := append([]byte{2}, rawPayload[1:]...)
	trailing := append(append([]byte{}, rawPayload...), 0)

	other := p
	other.Stream = "another-job"
	fromOtherStream := MustSign(t, kr, other, t0, ttl)

	type check struct{ gen, snap uint64 }
	tests := []struct {
		name  string
		token string
		now   time.Time
		want  resume.Expect
		check *check // if set, Position.Check is called after Verify
		err   resume.Reason
	}{
		{name: "valid", token: valid, err: ""},
		{name: "valid checked", token: valid, check: &check{p.Generation, p.Snapshot}, err: ""},
		{name: "valid just before expiry", token: valid, now: t0.Add(ttl - time.Nanosecond), err: ""},
		{name: "valid within clock skew", token: valid, now: t0.Add(-resume.ClockSkew), err: ""},
		{name: "flipped payload byte", token: kid + "." + flip(payload, len(payload)/2) + "." + mac, err: resume.ReasonBadSignature},
		{name: "flipped MAC byte", token: kid + "." + payload + "." + flip(mac, 0), err: resume.ReasonBadSignature},
		{name: "relabelled key id", token: relabelled, err: resume.ReasonBadSignature},
		{name: "payload not base64", token: kid + "." + replaceAt(payload, 3, '*') + "." + mac, err: resume.ReasonBadSignature},
		{name: "truncated", token: valid[:len(valid)-5], err: resume.ReasonMACLength},
		{name: "truncated to two segments", token: kid + "." + payload, err: resume.ReasonMalformed},
		{name: "extra segment", token: valid + ".AAAA", err: resume.ReasonMalformed},
		{name: "empty segment", token: kid + ".." + mac, err: resume.ReasonMalformed},
		{name: "no dots", token: "garbage", err: resume.ReasonMalformed},
		{name: "expired", token: valid, now: t0.Add(ttl), err: resume.ReasonExpired},
		{name: "not yet valid", token: valid, now: t0.Add(-resume.ClockSkew - time.Second), err: resume.ReasonNotYetValid},
		{name: "wrong caller", token: valid, want: resume.Expect{Stream: p.Stream, Caller: resume.Fingerprint("tenant-a", "user-43"), Filter: p.Filter}, err: resume.ReasonCallerMismatch},
		{name: "wrong filter", token: valid, want: resume.Expect{Stream: p.Stream, Caller: p.Caller, Filter: resume.Fingerprint("stderr")}, err: resume.ReasonFilterMismatch},
		{name: "generation moved", token: valid, check: &check{p.Generation + 1, p.Snapshot}, err: resume.ReasonGenerationMoved},
		{name: "snapshot moved", token: valid, check: &check{p.Generation, p.Snapshot + 1}, err: resume.ReasonSnapshotMoved},
		{name: "unknown key id", token: "zz." + payload + "." + mac, err: resume.ReasonUnknownKey},
		{name: "retired key id", token: retired, err: resume.ReasonUnknownKey},
		{name: "oversized", token: strings.Repeat("A", resume.MaxTokenLen+1), err: resume.ReasonOversized},
		{name: "oversized valid prefix", token: valid + strings.Repeat("A", resume.MaxTokenLen), err: resume.ReasonOversized},
		{name: "empty", token: "", err: resume.ReasonEmpty},
		{name: "MAC not base64", token: kid + "." + payload + "." + replaceAt(mac, 7, '!'), err: resume.ReasonMACEncoding},
		{name: "MAC padded", token: kid + "." + payload + "." + mac[:len(mac)-1] + "=", err: resume.ReasonMACEncoding},
		{name: "MAC non-canonical", token: nonCanonical, err: resume.ReasonMACEncoding},
		{name: "unsupported payload version", token: forge(keyA, v2), err: resume.ReasonUnsupportedVersion},
		{name: "signed garbage payload", token: forge(keyA, trailing), err: resume.ReasonBadPayload},
		{name: "token from another stream", token: fromOtherStream, err: resume.ReasonStreamMismatch},
	}

	seen := map[resume.Reason]bool{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := tt.now
			if now.IsZero() {
				now = t0.Add(time.Minute)
			}
			exp := tt.want
			if exp == (resume.Expect{}) {
				exp = want
			}
			got, err := kr.Verify(tt.token, now, exp)
			if err == nil && tt.check != nil {
				err = got.Check(tt.check.gen, tt.check.snap)
			}
			if tt.err == "" {
				if err != nil {
					t.Fatalf("Verify(%q) = %v, want success", tt.token, err)
				}
				if got.Stream != p.Stream || got.Seq != p.Seq || got.Generation != p.Generation {
					t.Fatalf("Verify = %+v, want %+v", got, p)
				}
				return
			}
			if !errors.Is(err, resume.ErrInvalidToken) {
				t.Fatalf("Verify(%q) = %v, want an error matching ErrInvalidToken", tt.token, err)
			}
			if r := resume.ReasonOf(err); r != tt.err {
				t.Fatalf("reason = %q, want %q", r, tt.err)
			}
			if tt.check == nil && got != (resume.Position{}) {
				t.Fatalf("rejected token returned position %+v, want zero", got)
			}
			seen[tt.err] = true
		})
	}
	for _, r := range resume.Reasons() {
		if !seen[r] {
			t.Errorf("reason %q not exercised by the matrix", r)
		}
	}
}

func TestKeyRotation(t *testing.T) {
	const ttl = time.Hour
	oldKey, newKey := testKey("k2026a", 0x11), testKey("k2026b", 0x22)
	p := samplePosition()
	want := expectFor(p)
	now := t0.Add(time.Minute)

	before := MustKeyring(t, "k2026a", oldKey)
	oldTok := MustSign(t, before, p, t0, ttl)

	// Step 1: the new key is known everywhere but does not sign yet.
	staged := MustKeyring(t, "k2026a", oldKey, newKey)
	// Step 2: the new key signs; the old one still verifies.
	rotated := MustKeyring(t, "k2026b", oldKey, newKey)
	newTok := MustSign(t, rotated, p, t0, ttl)
	if kid, _, _ := segments(t, newTok); kid != "k2026b" {
		t.Fatalf("rotated ring signed with %q, want k2026b", kid)
	}
	// Step 3: the old key is retired.
	retired := MustKeyring(t, "k2026b", newKey)

	tests := []struct {
		name  string
		ring  *resume.Keyring
		token string
		err   resume.Reason
	}{
		{"old token, old ring", before, oldTok, ""},
		{"new token, old ring", before, newTok, resume.ReasonUnknownKey},
		{"old token, staged ring", staged, oldTok, ""},
		{"new token, staged ring", staged, newTok, ""},
		{"old token, rotated ring", rotated, oldTok, ""},
		{"new token, rotated ring", rotated, newTok, ""},
		{"old token, old key retired", retired, oldTok, resume.ReasonUnknownKey},
		{"new token, old key retired", retired, newTok, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.ring.Verify(tt.token, now, want)
			if r := resume.ReasonOf(err); r != tt.err || (tt.err == "") != (err == nil) {
				t.Fatalf("Verify = (%+v, %v), want reason %q", got, err, tt.err)
			}
			if err == nil && got.Seq != p.Seq {
				t.Fatalf("Seq = %d, want %d", got.Seq, p.Seq)
			}
		})
	}
}

// randomPosition draws a position whose integers span every varint length
// and whose stream id is arbitrary bytes of any allowed length.
func randomPosition(r *rand.Rand) resume.Position {
	u := func() uint64 {
		switch r.IntN(4) {
		case 0:
			return uint64(r.IntN(128))
		case 1:
			return r.Uint64() >> r.IntN(64)
		case 2:
			return math.MaxUint64
		default:
			return r.Uint64()
		}
	}
	stream := make([]byte, 1+r.IntN(resume.MaxStreamLen))
	for i := range stream {
		stream[i] = byte(r.Uint32())
	}
	var p resume.Position
	p.Stream = string(stream)
	p.Generation, p.Seq, p.Snapshot = u(), u(), u()
	for i := range p.Caller {
		p.Caller[i] = byte(r.Uint32())
		p.Filter[i] = byte(r.Uint32())
	}
	return p
}

func TestRoundTripProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(0x5e1f, 0xc0ffee))
	kr := MustKeyring(t, "prop", testKey("prop", 0x42))
	longest := 0
	for i := range 20000 {
		p := randomPosition(r)
		// Any second from 1970 to 2^41 s (about the year 71,700, within
		// Sign's range), with sub-second noise that Sign drops.
		now := time.Unix(r.Int64N(1<<41), r.Int64N(1e9))
		ttl := time.Second + time.Duration(r.Int64N(int64(resume.MaxTTL-time.Second)+1))
		tok, err := kr.Sign(p, now, ttl)
		if err != nil {
			t.Fatalf("#%d Sign(%+v, %v, %v): %v", i, p, now, ttl, err)
		}
		if len(tok) > resume.MaxTokenLen {
			t.Fatalf("#%d token is %d bytes, over MaxTokenLen", i, len(tok))
		}
		longest = max(longest, len(tok))
		checkTokenChars(t, tok)

		issued := time.Unix(now.Unix(), 0).UTC()
		expires := issued.Add(ttl.Truncate(time.Second))
		verifyAt := issued.Add(time.Duration(r.Int64N(int64(expires.Sub(issued)))))
		got, err := kr.Verify(tok, verifyAt, expectFor(p))
		if err != nil {
			t.Fatalf("#%d Verify(%q) at %v: %v", i, tok, verifyAt, err)
		}
		wantP := p
		wantP.IssuedAt, wantP.ExpiresAt = issued, expires
		if got != wantP {
			t.Fatalf("#%d round trip:\n got %+v\nwant %+v", i, got, wantP)
		}
		if _, err := kr.Verify(tok, expires, expectFor(p)); resume.ReasonOf(err) != resume.ReasonExpired {
			t.Fatalf("#%d Verify at expiry: %v, want expired", i, err)
		}
	}
	t.Logf("longest token: %d bytes (MaxTokenLen %d)", longest, resume.MaxTokenLen)
}

func TestTokenLength(t *testing.T) {
	// The worst case: longest key id, stream id and integers, latest issue
	// time, longest TTL.
	kid := strings.Repeat("k", resume.MaxKeyIDLen)
	kr := MustKeyring(t, kid, testKey(kid, 0x33))
	worst := resume.Position{
		Stream:     strings.Repeat("\xff", resume.MaxStreamLen),
		Generation: math.MaxUint64, Seq: math.MaxUint64, Snapshot: math.MaxUint64,
	}
	tok := MustSign(t, kr, worst, time.Unix(1<<42-1, 0), resume.MaxTTL)
	if len(tok) > resume.MaxTokenLen {
		t.Fatalf("worst-case token is %d bytes, over MaxTokenLen %d", len(tok), resume.MaxTokenLen)
	}
	if _, err := kr.Verify(tok, time.Unix(1<<42-1, 0), expectFor(worst)); err != nil {
		t.Fatalf("worst-case token does not verify: %v", err)
	}

	typical := MustSign(t, MustKeyring(t, "k1", testKey("k1", 1)), samplePosition(), t0, 10*time.Minute)
	t.Logf("worst-case token: %d bytes; typical (UUID job id, kid %q): %d bytes: %s",
		len(tok), "k1", len(typical), typical)
}

func TestSignRejects(t *testing.T) {
	kr := MustKeyring(t, "a", testKey("a", 1))
	p := samplePosition()
	long := p
	long.Stream = strings.Repeat("x", resume.MaxStreamLen+1)
	empty := p
	empty.Stream = ""
	tests := []struct {
		name string
		p    resume.Position
		now  time.Time
		ttl  time.Duration
	}{
		{"empty stream", empty, t0, time.Minute},
		{"stream too long", long, t0, time.Minute},
		{"zero ttl", p, t0, 0},
		{"negative ttl", p, t0, -time.Minute},
		{"sub-second ttl", p, t0, 999 * time.Millisecond},
		{"ttl over MaxTTL", p, t0, resume.MaxTTL + time.Second},
		{"before 1970", p, time.Unix(-1, 0), time.Minute},
		{"far future", p, time.Unix(1<<42, 0), time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tok, err := kr.Sign(tt.p, tt.now, tt.ttl)
			if !errors.Is(err, resume.ErrUnsignable) || tok != "" {
				t.Fatalf("Sign = (%q, %v), want ErrUnsignable", tok, err)
			}
			if errors.Is(err, resume.ErrInvalidToken) {
				t.Fatalf("Sign error %v matches ErrInvalidToken", err)
			}
		})
	}
}

// TestGoldenToken pins the wire format: nodes of different versions verify
// each other's tokens, so an accidental change to the encoding must fail
// here.
func TestGoldenToken(t *testing.T) {
	key := testKey("k1", 1)
	kr := MustKeyring(t, "k1", key)
	p := samplePosition()
	tok := MustSign(t, kr, p, t0, 10*time.Minute)
	const golden = "k1.AQOSCAeA98TVBtgEmvTc7X3uSBbazNCaQ9o8193kq_5kSFNX-IkXm523374kNmYxYzJhNWUtM2I3ZC00ZThmLTlhMGItMWMyZDNlNGY1YTZi.rnOfIeMtXsVY87Stz5VQdCf3wwdgeJtZs4jfA7Qw4U4"
	if tok != golden {
		t.Fatalf("token = %s\nwant     %s", tok, golden)
	}
	// The MAC is exactly the documented construction.
	_, payload, _ := segments(t, tok)
	raw, err := base64.RawURLEncoding.DecodeString(payload)
	if err != nil {
		t.Fatal(err)
	}
	if forged := forge(key, raw); forged != tok {
		t.Fatalf("independent MAC gives %s, want %s", forged, tok)
	}
}

func TestErrorShape(t *testing.T) {
	kr := MustKeyring(t, "a", testKey("a", 1))
	_, err := kr.Verify("a.b.c", t0, resume.Expect{})
	var ie *resume.InvalidError
	if !errors.As(err, &ie) || ie.Reason != resume.ReasonMACLength {
		t.Fatalf("err = %#v, want *InvalidError{mac_length}", err)
	}
	if !errors.Is(err, resume.ErrInvalidToken) {
		t.Fatal("InvalidError does not match ErrInvalidToken")
	}
	if got := resume.ReasonOf(errors.New("other")); got != "" {
		t.Fatalf("ReasonOf(other) = %q, want empty", got)
	}
	if got := resume.ReasonOf(nil); got != "" {
		t.Fatalf("ReasonOf(nil) = %q, want empty", got)
	}
	seen := map[resume.Reason]bool{}
	for _, r := range resume.Reasons() {
		if r == "" || seen[r] {
			t.Fatalf("reason %q empty or duplicated", r)
		}
		seen[r] = true
	}
}

func TestFingerprint(t *testing.T) {
	distinct := [][]string{
		nil,
		{""},
		{"", ""},
		{"a"},
		{"a", ""},
		{"", "a"},
		{"ab", "c"},
		{"a", "bc"},
		{"abc"},
		{"a\x00", "bc"},
	}
	seen := map[[16]byte][]string{}
	for _, parts := range distinct {
		fp := resume.Fingerprint(parts...)
		if prev, dup := seen[fp]; dup {
			t.Fatalf("Fingerprint(%q) == Fingerprint(%q)", parts, prev)
		}
		seen[fp] = parts
		if resume.Fingerprint(parts...) != fp {
			t.Fatalf("Fingerprint(%q) is not deterministic", parts)
		}
	}
}

func TestConcurrentUse(t *testing.T) {
	kr := MustKeyring(t, "a", testKey("a", 1), testKey("b", 2))
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for range 200 {
				p := randomPosition(r)
				tok, err := kr.Sign(p, t0, time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				if _, err := kr.Verify(tok, t0, expectFor(p)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}
