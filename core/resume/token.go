package resume

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strings"
	"time"
)

// Token limits and tolerances.
const (
	// MaxTokenLen is the longest token Verify looks at; anything longer is
	// rejected before any decoding. Sign never produces a longer one.
	MaxTokenLen = 256
	// MaxStreamLen is the longest stream id a token can carry, chosen so that
	// the worst-case token fits MaxTokenLen.
	MaxStreamLen = 64
	// MaxTTL is the longest lifetime Sign gives a token.
	MaxTTL = 24 * time.Hour
	// ClockSkew is how far in the future a token's issue time may be before
	// Verify calls it not yet valid: nodes' clocks differ a little, and a
	// token signed by one node is often verified by another.
	ClockSkew = 30 * time.Second
)

// macDomain prefixes every MACed message: it separates resume-token MACs from
// other uses of the same secret and from future formats.
const macDomain = "swy-resume-v1"

// macDomainBytes is macDomain, converted once.
var macDomainBytes = []byte(macDomain)

// b64 is the token's segment encoding. Strict rejects encodings whose unused
// trailing bits are set, so each MAC has exactly one accepted spelling.
var b64 = base64.RawURLEncoding.Strict()

// macSegmentLen is the length of the encoded MAC segment.
var macSegmentLen = b64.EncodedLen(sha256.Size)

// Sign returns the token for p, issued at now and expiring ttl later,
// signed with the keyring's signing key. p.IssuedAt and p.ExpiresAt are
// ignored; times are kept to the second, so ttl is truncated to whole
// seconds.
//
// Sign fails, with an error matching ErrUnsignable, only on inputs the
// caller controls: a stream id that is empty or longer than MaxStreamLen, a
// ttl under a second or over MaxTTL, or a now before 1970 or absurdly far
// ahead. Every token it returns is at most MaxTokenLen bytes of base64url
// characters and '.'.
func (k *Keyring) Sign(p Position, now time.Time, ttl time.Duration) (string, error) {
	var buf [MaxTokenLen]byte
	tok, err := k.AppendSign(buf[:0], p, now, ttl)
	if err != nil {
		return "", err
	}
	return string(tok), nil
}

// AppendSign appends the token Sign returns for p to dst: a transport that
// writes the token out at once (an SSE id: line) signs it straight into
// its buffer, with no allocation. On error dst is returned as it was.
func (k *Keyring) AppendSign(dst []byte, p Position, now time.Time, ttl time.Duration) ([]byte, error) {
	s, err := k.Signer(p.Stream, p.Snapshot, p.Caller, p.Filter, ttl)
	if err != nil {
		return dst, err
	}
	return s.AppendSign(dst, p.Generation, p.Seq, now)
}

// Signer signs the positions of one stream, for one caller and filter, at
// one snapshot version and with one ttl: what a stream's writer signs for
// every event, checked and looked up once (Keyring.Signer) rather than per
// token. Its tokens are exactly Sign's. The zero Signer cannot sign; a
// Signer is safe for concurrent use.
type Signer struct {
	mk       *macKey
	kid      string
	stream   string
	snapshot uint64
	caller   [16]byte
	filter   [16]byte
	lifetime uint64
}

// Signer returns a Signer for the stream's positions at snapshot, issued to
// caller for filter, living ttl. It fails as Sign does, with an error
// matching ErrUnsignable, on a stream id that is empty or longer than
// MaxStreamLen or a ttl under a second or over MaxTTL.
func (k *Keyring) Signer(stream string, snapshot uint64, caller, filter [16]byte, ttl time.Duration) (Signer, error) {
	if len(stream) == 0 || len(stream) > MaxStreamLen {
		return Signer{}, fmt.Errorf("%w: stream id is %d bytes, must be 1 to %d",
			ErrUnsignable, len(stream), MaxStreamLen)
	}
	if ttl < time.Second || ttl > MaxTTL {
		return Signer{}, fmt.Errorf("%w: ttl %v out of range [1s, %v]", ErrUnsignable, ttl, MaxTTL)
	}
	return Signer{
		mk: k.keys[k.signing], kid: k.signing, stream: stream, snapshot: snapshot,
		caller: caller, filter: filter, lifetime: uint64(ttl / time.Second),
	}, nil
}

// AppendSign appends the token for the event seq of the stream's
// generation, issued at now, to dst. It fails, with an error matching
// ErrUnsignable, only on a now before 1970 or absurdly far ahead, and on
// the zero Signer; dst is then returned as it was.
func (s *Signer) AppendSign(dst []byte, generation, seq uint64, now time.Time) ([]byte, error) {
	if s.mk == nil {
		return dst, fmt.Errorf("%w: the zero Signer has no key", ErrUnsignable)
	}
	issued := now.Unix()
	if issued < 0 || issued > maxIssued {
		return dst, fmt.Errorf("%w: issue time %v out of range", ErrUnsignable, now)
	}
	p := Position{Stream: s.stream, Generation: generation, Seq: seq, Snapshot: s.snapshot, Caller: s.caller, Filter: s.filter}
	var raw [maxPayloadLen]byte
	payload := appendPayload(raw[:0], &p, uint64(issued), s.lifetime)

	start := len(dst)
	tok := append(dst, s.kid...)
	tok = append(tok, '.')
	tok = b64.AppendEncode(tok, payload)
	mac := s.mk.mac(tok[start:])
	tok = append(tok, '.')
	return b64.AppendEncode(tok, mac[:]), nil
}

// Verify checks token against the keyring, the time now and what the current
// request has, and returns the position it carries. Every error matches
// ErrInvalidToken and carries a Reason (see InvalidError). The checks run in
// this order, cheapest and least trusting first:
//
//  1. length: at most MaxTokenLen bytes and not empty, before anything else;
//  2. shape: exactly three non-empty '.'-separated segments;
//  3. key id: present in the keyring (a lookup; nothing is decoded);
//  4. MAC: the right length, canonical base64url, and equal (hmac.Equal) to
//     the MAC recomputed over the key id and the payload segment as sent;
//  5. payload: decoded only now that it is known to be a node's;
//  6. time: issued no more than ClockSkew after now, and not expired;
//  7. binding: filter fingerprint, stream, caller fingerprint equal want's.
//
// Generation and snapshot are the caller's to compare, with Position.Check.
func (k *Keyring) Verify(token string, now time.Time, want Expect) (Position, error) {
	p, err := k.VerifyGrant(token, now, want.Filter)
	if err != nil {
		return Position{}, err
	}
	if p.Stream != want.Stream {
		return Position{}, invalid(ReasonStreamMismatch)
	}
	if !equalFingerprint(p.Caller, want.Caller) {
		return Position{}, invalid(ReasonCallerMismatch)
	}
	return p, nil
}

// VerifyGrant checks what Verify checks, except the stream and the caller,
// which it returns for the caller to use: for a token that grants its
// bearer the stream and the identity it names (a read token, handed to a
// client that cannot present a key), rather than one checked against what
// the request already has. The filter fingerprint still must equal
// filter: it is what tells a grant from a resume token, so neither can
// stand for the other.
func (k *Keyring) VerifyGrant(token string, now time.Time, filter [16]byte) (Position, error) {
	if len(token) > MaxTokenLen {
		return Position{}, invalid(ReasonOversized)
	}
	if len(token) == 0 {
		return Position{}, invalid(ReasonEmpty)
	}
	kid, rest, _ := strings.Cut(token, ".")
	payloadSeg, macSeg, ok := strings.Cut(rest, ".")
	if !ok || kid == "" || payloadSeg == "" || macSeg == "" || strings.IndexByte(macSeg, '.') >= 0 {
		return Position{}, invalid(ReasonMalformed)
	}
	mk, ok := k.keys[kid]
	if !ok {
		return Position{}, invalid(ReasonUnknownKey)
	}
	if len(macSeg) != macSegmentLen {
		return Position{}, invalid(ReasonMACLength)
	}
	var got [sha256.Size]byte
	if n, err := b64.Decode(got[:], []byte(macSeg)); err != nil || n != len(got) {
		return Position{}, invalid(ReasonMACEncoding)
	}
	// The MAC covers the segments exactly as received, so nothing has been
	// decoded or normalized yet.
	signed := token[:len(kid)+1+len(payloadSeg)]
	wantMAC := mk.mac([]byte(signed))
	if !hmac.Equal(got[:], wantMAC[:]) {
		return Position{}, invalid(ReasonBadSignature)
	}

	var raw [MaxTokenLen]byte
	n, err := b64.Decode(raw[:], []byte(payloadSeg))
	if err != nil {
		return Position{}, invalid(ReasonBadPayload)
	}
	p, reason := decodePayload(raw[:n])
	if reason != "" {
		return Position{}, invalid(reason)
	}

	if p.IssuedAt.After(now.Add(ClockSkew)) {
		return Position{}, invalid(ReasonNotYetValid)
	}
	if !now.Before(p.ExpiresAt) {
		return Position{}, invalid(ReasonExpired)
	}
	if !equalFingerprint(p.Filter, filter) {
		return Position{}, invalid(ReasonFilterMismatch)
	}
	return p, nil
}

// mac returns HMAC-SHA256(secret, macDomain || signed), where signed is
// "<kid>.<payload segment>": the key id is bound into the MAC.
func (mk *macKey) mac(signed []byte) [sha256.Size]byte {
	st := mk.pool.Get().(*macState)
	defer mk.pool.Put(st)
	st.h.Reset()
	st.h.Write(macDomainBytes)
	for len(signed) > 0 { // signed fits at once but for tokens Verify refuses anyway
		n := copy(st.signed[:], signed)
		st.h.Write(st.signed[:n])
		signed = signed[n:]
	}
	return [sha256.Size]byte(st.h.Sum(st.sum[:0]))
}
