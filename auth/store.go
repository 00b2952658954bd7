package auth

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/resume"
)

// Source is where a node's keys come from: a file (--auth-file), re-read on
// Reload, and a document given inline (SWITCHYARD_AUTH_KEYS), read once.
// Both are File documents; their keys add up. With neither, the node has
// no keys and every call is anonymous.
type Source struct {
	File   string
	Inline string
}

// Enabled reports whether the node checks keys.
func (s Source) Enabled() bool { return s.File != "" || s.Inline != "" }

// Store holds a node's keys and answers who a credential is. Its keys are
// replaced whole by Reload; a call in progress keeps the identity it was
// given, so a job in flight is not affected by a rotation.
type Store struct {
	src Source
	log *slog.Logger
	cur atomic.Pointer[keyset]

	// mu serializes reloads; admissions (guarded by it) outlive them.
	mu         sync.Mutex
	admissions map[[sha256.Size]byte]*admission
}

// keyset is one generation of keys.
type keyset struct {
	hashes [][sha256.Size]byte
	ids    []*Identity
	// grants is, per subject, a digest of its keys and what they grant:
	// a reload that changes it revokes the subject's read tokens.
	grants map[string][sha256.Size]byte
	// revoked is, per caller fingerprint, when a reload last changed that
	// subject's keys (removed one, or what one grants): its read tokens
	// issued until then no longer verify (Revoked). Entries older than the
	// longest token life are dropped.
	revoked map[[16]byte]time.Time
}

// Open loads src. A source that is set must parse and hold at least one
// key: a node told to check keys that has none would refuse every call.
func Open(src Source, log *slog.Logger) (*Store, error) {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s := &Store{src: src, log: log, admissions: map[[sha256.Size]byte]*admission{}}
	if !src.Enabled() {
		return s, nil
	}
	if err := s.Reload(); err != nil {
		return nil, err
	}
	return s, nil
}

// Enabled reports whether the node checks keys (see Source.Enabled).
func (s *Store) Enabled() bool { return s.src.Enabled() }

// Keys is how many keys the store holds now.
func (s *Store) Keys() int {
	if ks := s.cur.Load(); ks != nil {
		return len(ks.hashes)
	}
	return 0
}

// Reload reads the source again and replaces the keys at once. A source
// that does not read, does not parse or holds no key changes nothing: the
// keys in use stay, and the error says why (the node logs it).
func (s *Store) Reload() error {
	if !s.src.Enabled() {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var entries []entry
	if s.src.File != "" {
		doc, err := os.ReadFile(s.src.File)
		if err != nil {
			return fmt.Errorf("auth: %w", err)
		}
		es, err := parse(doc, "--auth-file "+s.src.File)
		if err != nil {
			return fmt.Errorf("auth: %w", err)
		}
		entries = append(entries, es...)
	}
	if s.src.Inline != "" {
		es, err := parse([]byte(s.src.Inline), "SWITCHYARD_AUTH_KEYS")
		if err != nil {
			return fmt.Errorf("auth: %w", err)
		}
		entries = append(entries, es...)
	}
	if len(entries) == 0 {
		return errors.New("auth: no keys: a node that checks keys and has none refuses every call")
	}
	if err := sameWeights(entries); err != nil {
		return err
	}
	ks := &keyset{grants: map[string][sha256.Size]byte{}}
	seen := map[[sha256.Size]byte]string{}
	keep := map[[sha256.Size]byte]*admission{}
	for _, e := range entries {
		if other, dup := seen[e.hash]; dup {
			return fmt.Errorf("auth: subjects %q and %q have the same key: a key names one subject", other, e.subject)
		}
		seen[e.hash] = e.subject
		a := s.admissions[e.hash]
		if a == nil {
			a = newAdmission(e.limits)
		} else {
			a.set(e.limits)
		}
		keep[e.hash] = a
		ks.hashes = append(ks.hashes, e.hash)
		ks.ids = append(ks.ids, &Identity{
			subject: e.subject, roles: e.roles, queues: e.queues, caller: CallerFingerprint(e.subject), admission: a,
			share: e.share,
		})
	}
	ks.grants = grantDigests(entries)
	ks.revoked = revocations(s.cur.Load(), ks.grants, time.Now())
	// A key that left the file takes its counts with it; jobs in flight
	// under it release into an admission nobody checks any more.
	s.admissions = keep
	s.cur.Store(ks)
	s.log.Info("api keys loaded", "keys", len(ks.hashes), "subjects", len(subjects(ks)))
	return nil
}

// sameWeights refuses keys of one subject that give it different weights:
// a weight is the subject's share, which one key cannot have alone.
func sameWeights(entries []entry) error {
	weights := map[string]int{}
	for _, e := range entries {
		if w, ok := weights[e.subject]; ok && w != e.share.Weight {
			return fmt.Errorf("auth: subject %q has keys with weights %d and %d: a weight is the subject's, give its keys the same", e.subject, w, e.share.Weight)
		}
		weights[e.subject] = e.share.Weight
	}
	return nil
}

// Revoked reports whether a read token issued to caller at issuedAt (to
// the second, as tokens carry it) was issued before a reload that removed
// one of its subject's keys, or changed what one grants: such a token no
// longer verifies, so a key taken out of the file takes the streams it
// opened to EventSources with it (a stream already open keeps going, as a
// call in progress keeps its identity). Tokens the subject's remaining
// keys got in the second of the reload are refused too: the page asks
// again with its key.
func (s *Store) Revoked(caller [16]byte, issuedAt time.Time) bool {
	ks := s.cur.Load()
	if ks == nil {
		return false
	}
	at, ok := ks.revoked[caller]
	return ok && !issuedAt.After(at)
}

// grantDigests is, per subject, a digest of every key of it and what the
// key grants, in a canonical order.
func grantDigests(entries []entry) map[string][sha256.Size]byte {
	lines := map[string][]string{}
	for _, e := range entries {
		lines[e.subject] = append(lines[e.subject], fmt.Sprintf("%x %d %q", e.hash, e.roles, e.queues))
	}
	out := make(map[string][sha256.Size]byte, len(lines))
	for subject, ls := range lines {
		slices.Sort(ls)
		out[subject] = sha256.Sum256([]byte(strings.Join(ls, "\n")))
	}
	return out
}

// revocations is the revocation table after a reload from old to grants at
// now: old's entries younger than the longest life of a token, and now
// for every subject of old whose keys or grants changed or are gone.
func revocations(old *keyset, grants map[string][sha256.Size]byte, now time.Time) map[[16]byte]time.Time {
	out := map[[16]byte]time.Time{}
	if old == nil {
		return out
	}
	for caller, at := range old.revoked {
		if now.Sub(at) <= resume.MaxTTL {
			out[caller] = at
		}
	}
	for subject, digest := range old.grants {
		if g, ok := grants[subject]; !ok || g != digest {
			out[CallerFingerprint(subject)] = now
		}
	}
	return out
}

func subjects(ks *keyset) map[string]bool {
	m := map[string]bool{}
	for _, id := range ks.ids {
		m[id.subject] = true
	}
	return m
}

// Authenticate returns who presents credential, the value of an
// Authorization header or "authorization" metadata ("Bearer <key>"). With
// no keys, everyone is anonymous. Otherwise no credential, one that is not
// a bearer key, or a key the store does not hold is refused with
// unauthenticated. The key is compared with every stored hash, each in
// constant time, with no early exit: neither the answer's timing nor its
// content says how close a guess was. The key is never logged.
func (s *Store) Authenticate(credential string) (*Identity, error) {
	if !s.Enabled() {
		return Anonymous(credential), nil
	}
	if credential == "" {
		return nil, &core.Error{Code: core.CodeUnauthenticated, Detail: "an API key is required: send Authorization: Bearer <key>"}
	}
	scheme, key, ok := strings.Cut(credential, " ")
	key = strings.TrimSpace(key)
	if !ok || !strings.EqualFold(scheme, "Bearer") || key == "" {
		return nil, &core.Error{Code: core.CodeUnauthenticated, Detail: "the credential must be Bearer <key>"}
	}
	sum := sha256.Sum256([]byte(key))
	ks := s.cur.Load()
	match := -1
	for i, h := range ks.hashes {
		if subtle.ConstantTimeCompare(sum[:], h[:]) == 1 {
			match = i
		}
	}
	if match < 0 {
		return nil, &core.Error{Code: core.CodeUnauthenticated, Detail: "the API key is not valid"}
	}
	return ks.ids[match], nil
}
