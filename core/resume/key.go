package resume

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"hash"
	"slices"
	"strings"
	"sync"
)

// Key limits.
const (
	// MaxKeyIDLen is the longest key id accepted.
	MaxKeyIDLen = 16
	// MinSecretLen is the shortest secret accepted: 32 bytes, the output size
	// of SHA-256, below which HMAC-SHA256 is weaker than it need be.
	MinSecretLen = 32
)

// Key is a named HMAC secret. ID appears in clear in every token the key
// signs; Secret never leaves the node.
//
// Key's String and GoString methods redact the secret, so a Key that ends up
// in a log line or a %v does not leak it.
type Key struct {
	// ID names the key: 1 to MaxKeyIDLen characters of [A-Za-z0-9_-].
	ID string
	// Secret is at least MinSecretLen bytes, ideally from GenerateKey.
	Secret []byte
}

// GenerateKey returns a key named id with a fresh 32-byte secret from
// crypto/rand. The id is not checked here; NewKeyring checks it.
func GenerateKey(id string) Key {
	secret := make([]byte, MinSecretLen)
	// crypto/rand.Read never returns an error (it crashes the program
	// instead when the system's randomness is unavailable).
	_, _ = rand.Read(secret)
	return Key{ID: id, Secret: secret}
}

// ParseKey parses a key from its configuration form "kid:base64secret", as
// produced by FormatKey. The secret may use the standard or the URL-safe
// base64 alphabet, with or without padding; surrounding whitespace is
// ignored. Errors match ErrInvalidKey and never include the secret.
func ParseKey(s string) (Key, error) {
	s = strings.TrimSpace(s)
	id, enc, ok := strings.Cut(s, ":")
	if !ok {
		return Key{}, fmt.Errorf("%w: want \"kid:base64secret\"", ErrInvalidKey)
	}
	if err := checkKeyID(id); err != nil {
		return Key{}, err
	}
	secret, err := decodeSecret(enc)
	if err != nil {
		return Key{}, fmt.Errorf("%w: key %q: secret is not base64", ErrInvalidKey, id)
	}
	k := Key{ID: id, Secret: secret}
	if err := k.validate(); err != nil {
		return Key{}, err
	}
	return k, nil
}

// FormatKey returns k in the configuration form ParseKey reads:
// "kid:base64secret" (standard alphabet, padded). The result contains the
// secret: treat it as one.
func FormatKey(k Key) string {
	return k.ID + ":" + base64.StdEncoding.EncodeToString(k.Secret)
}

// String returns the key id with the secret redacted.
func (k Key) String() string { return k.ID + ":<redacted>" }

// GoString returns the key id with the secret redacted, for %#v.
func (k Key) GoString() string { return fmt.Sprintf("resume.Key{ID:%q, Secret:<redacted>}", k.ID) }

// validate checks the key id and the secret length.
func (k Key) validate() error {
	if err := checkKeyID(k.ID); err != nil {
		return err
	}
	if len(k.Secret) < MinSecretLen {
		return fmt.Errorf("%w: key %q: secret is %d bytes, need at least %d",
			ErrInvalidKey, k.ID, len(k.Secret), MinSecretLen)
	}
	return nil
}

// Keyring holds the keys a node signs and verifies resume tokens with: one
// signing key, and any number of further keys accepted for verification
// only. A Keyring is immutable and safe for concurrent use; to rotate or
// retire keys, build a new one and swap it in. Build it with NewKeyring: the
// zero Keyring has no keys and cannot sign.
type Keyring struct {
	signing string
	keys    map[string]*macKey
}

// macState is an HMAC state keyed with a macKey's secret, with room for
// what it hashes and its sum: the bytes handed to the hash.Hash interface
// would otherwise escape to the heap on every token.
type macState struct {
	h      hash.Hash
	signed [MaxTokenLen]byte
	sum    [sha256.Size]byte
}

// macKey is one key's secret and a pool of HMAC states keyed with it.
// Reusing a state saves rehashing the padded key on every token (hmac
// caches it on Reset) and about half a kilobyte of allocation.
type macKey struct {
	secret []byte
	pool   sync.Pool // of *macState
}

// newMACKey returns a macKey for a copy of secret.
func newMACKey(secret []byte) *macKey {
	mk := &macKey{secret: slices.Clone(secret)}
	mk.pool.New = func() any { return &macState{h: hmac.New(sha256.New, mk.secret)} }
	return mk
}

// NewKeyring returns a keyring that signs with the key named signing and
// verifies with every key in keys (which must include the signing key). Key
// ids must be 1 to MaxKeyIDLen characters of [A-Za-z0-9_-] and unique;
// secrets must be at least MinSecretLen bytes. Secrets are copied. Errors
// match ErrInvalidKey.
func NewKeyring(signing string, keys ...Key) (*Keyring, error) {
	kr := &Keyring{signing: signing, keys: make(map[string]*macKey, len(keys))}
	for _, k := range keys {
		if err := k.validate(); err != nil {
			return nil, err
		}
		if _, dup := kr.keys[k.ID]; dup {
			return nil, fmt.Errorf("%w: duplicate key id %q", ErrInvalidKey, k.ID)
		}
		kr.keys[k.ID] = newMACKey(k.Secret)
	}
	if _, ok := kr.keys[signing]; !ok {
		return nil, fmt.Errorf("%w: signing key %q is not among the keys", ErrInvalidKey, signing)
	}
	return kr, nil
}

// SigningKeyID returns the id of the key new tokens are signed with.
func (k *Keyring) SigningKeyID() string { return k.signing }

// KeyIDs returns the ids of every key tokens are verified with, sorted.
func (k *Keyring) KeyIDs() []string {
	ids := make([]string, 0, len(k.keys))
	for id := range k.keys {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// String describes the keyring by key ids only, never secrets.
func (k *Keyring) String() string {
	return fmt.Sprintf("resume.Keyring{signing:%q, keys:%q}", k.signing, k.KeyIDs())
}

// GoString is String, so %#v does not print secrets either.
func (k *Keyring) GoString() string { return k.String() }

// checkKeyID reports whether id is a valid key id. An invalid id is not
// echoed in the error: a config line with its halves swapped would otherwise
// put the secret in the log.
func checkKeyID(id string) error {
	if len(id) == 0 || len(id) > MaxKeyIDLen {
		return fmt.Errorf("%w: key id is %d characters, must be 1 to %d", ErrInvalidKey, len(id), MaxKeyIDLen)
	}
	for i := 0; i < len(id); i++ {
		if !isKeyIDChar(id[i]) {
			return fmt.Errorf("%w: key id may only contain [A-Za-z0-9_-]", ErrInvalidKey)
		}
	}
	return nil
}

// isKeyIDChar reports whether c may appear in a key id. The set is a subset
// of the base64url alphabet, so a whole token stays within it plus '.'.
func isKeyIDChar(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-'
}

// decodeSecret decodes a secret in any of the four common base64 forms.
func decodeSecret(s string) ([]byte, error) {
	var err error
	for _, enc := range []*base64.Encoding{
		base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding,
	} {
		var b []byte
		if b, err = enc.DecodeString(s); err == nil {
			return b, nil
		}
	}
	return nil, err
}
