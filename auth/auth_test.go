package auth_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/auth"
	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/resume"
)

const (
	aliceKey = "alice-key-0123456789"
	bobKey   = "bob-key-0123456789ab"
)

// MustStore opens a store over a key file holding doc.
func MustStore(tb testing.TB, doc string) (*auth.Store, string) {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "keys.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		tb.Fatal(err)
	}
	s, err := auth.Open(auth.Source{File: path}, nil)
	if err != nil {
		tb.Fatalf("open: %v", err)
	}
	return s, path
}

func codeOf(err error) core.Code {
	c, _ := core.CodeOf(err)
	return c
}

const twoKeys = `
keys:
  - subject: alice
    key: ` + aliceKey + `
    roles: [submit]
    queues: [demo, "team-a.*"]
  - subject: bob
    sha256: ` + "%BOB%" + `
    roles: [work, admin]
    queues: ["*"]
`

func twoKeysDoc() string { return strings.Replace(twoKeys, "%BOB%", auth.HashKey(bobKey), 1) }

func TestAuthenticate(t *testing.T) {
	s, _ := MustStore(t, twoKeysDoc())
	for _, tc := range []struct {
		name, credential string
		subject          string
		code             core.Code
	}{
		{"no credential", "", "", core.CodeUnauthenticated},
		{"not bearer", "Basic " + aliceKey, "", core.CodeUnauthenticated},
		{"bearer without key", "Bearer ", "", core.CodeUnauthenticated},
		{"unknown key", "Bearer nobody-key-0123456789", "", core.CodeUnauthenticated},
		{"a prefix of a key", "Bearer " + aliceKey[:10], "", core.CodeUnauthenticated},
		{"plain key", "Bearer " + aliceKey, "alice", ""},
		{"scheme in any case", "bearer " + aliceKey, "alice", ""},
		{"hashed key", "Bearer " + bobKey, "bob", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, err := s.Authenticate(tc.credential)
			if got := codeOf(err); got != tc.code {
				t.Fatalf("code %q, want %q (%v)", got, tc.code, err)
			}
			if err == nil && id.Subject() != tc.subject {
				t.Errorf("subject %q, want %q", id.Subject(), tc.subject)
			}
		})
	}
}

func TestRolesAndQueues(t *testing.T) {
	s, _ := MustStore(t, twoKeysDoc())
	alice, _ := s.Authenticate("Bearer " + aliceKey)
	bob, _ := s.Authenticate("Bearer " + bobKey)
	for _, tc := range []struct {
		name  string
		id    *auth.Identity
		role  auth.Role
		queue string
		ok    bool
	}{
		{"alice submits to demo", alice, auth.Submit, "demo", true},
		{"alice submits under team-a", alice, auth.Submit, "team-a.jobs", true},
		{"alice, a queue that only starts alike", alice, auth.Submit, "team-ab", false},
		{"alice, another queue", alice, auth.Submit, "other", false},
		{"alice cannot work", alice, auth.Work, "demo", false},
		{"alice is no admin", alice, auth.Admin, "", false},
		{"bob works anywhere", bob, auth.Work, "anything.at.all", true},
		{"bob cannot submit", bob, auth.Submit, "demo", false},
		{"bob is admin", bob, auth.Admin, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.id.Allow(tc.role, tc.queue)
			if (err == nil) != tc.ok {
				t.Fatalf("Allow = %v, want ok %v", err, tc.ok)
			}
			if err != nil && codeOf(err) != core.CodePermissionDenied {
				t.Errorf("code %q", codeOf(err))
			}
		})
	}
	if !alice.Sees("alice") || alice.Sees("bob") || alice.Sees("") {
		t.Error("alice sees her own jobs and no other")
	}
	if !bob.Sees("alice") {
		t.Error("an admin sees every job")
	}
	if alice.Caller() != auth.CallerFingerprint("alice") || alice.Caller() == bob.Caller() {
		t.Error("a subject's resume fingerprint")
	}
}

func TestNoKeysIsAnonymous(t *testing.T) {
	s, err := auth.Open(auth.Source{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := s.Authenticate("Bearer whatever")
	if err != nil || !id.IsAnonymous() || id.Allow(auth.Submit, "any") != nil || id.Allow(auth.Work, "any") != nil || !id.Sees("") {
		t.Fatalf("anonymous: %v %+v", err, id)
	}
	// Resume tokens stay bound to the credential presented, as before keys.
	other, _ := s.Authenticate("Bearer someone-else")
	if id.Caller() == other.Caller() {
		t.Error("two credentials share a resume fingerprint")
	}
	// CallerOf: the identity's in a call a transport authenticated, else
	// the anonymous caller's of the credential the call presents.
	if auth.CallerOf(auth.NewContext(context.Background(), id), "Bearer someone-else") != id.Caller() {
		t.Error("CallerOf ignores the call's identity")
	}
	if auth.CallerOf(context.Background(), "Bearer whatever") != id.Caller() {
		t.Error("CallerOf without an identity is not the anonymous caller's")
	}
}

func TestBadFiles(t *testing.T) {
	for _, tc := range []struct{ name, doc, want string }{
		{"not yaml", "keys: [", "keys.yaml"},
		{"unknown field", "keys:\n- subject: a\n  key: " + aliceKey + "\n  roles: [admin]\n  rates: 3\n", "unknown field"},
		{"no keys", "keys: []\n", "no keys"},
		{"bad subject", "keys:\n- subject: 'a b'\n  key: " + aliceKey + "\n  roles: [admin]\n", "subject"},
		{"short key", "keys:\n- subject: a\n  key: short\n  roles: [admin]\n", "at least 16"},
		{"key and hash", "keys:\n- subject: a\n  key: " + aliceKey + "\n  sha256: " + auth.HashKey(aliceKey) + "\n  roles: [admin]\n", "not both"},
		{"bad hash", "keys:\n- subject: a\n  sha256: abc\n  roles: [admin]\n", "64 hex"},
		{"no role", "keys:\n- subject: a\n  key: " + aliceKey + "\n", "roles"},
		{"unknown role", "keys:\n- subject: a\n  key: " + aliceKey + "\n  roles: [root]\n", "root"},
		{"submit without queues", "keys:\n- subject: a\n  key: " + aliceKey + "\n  roles: [submit]\n", "queues is required"},
		{"bad pattern", "keys:\n- subject: a\n  key: " + aliceKey + "\n  roles: [submit]\n  queues: ['a/b']\n", "queue pattern"},
		{"unclosed class", "keys:\n- subject: a\n  key: " + aliceKey + "\n  roles: [submit]\n  queues: ['[a']\n", "queue pattern"},
		{"negative rate", "keys:\n- subject: a\n  key: " + aliceKey + "\n  roles: [admin]\n  rate: -1\n", "rate"},
		{"burst without rate", "keys:\n- subject: a\n  key: " + aliceKey + "\n  roles: [admin]\n  burst: 3\n", "burst needs a rate"},
		{"one key, two subjects", "keys:\n- subject: a\n  key: " + aliceKey + "\n  roles: [admin]\n- subject: b\n  sha256: " + auth.HashKey(aliceKey) + "\n  roles: [admin]\n", "same key"},
		{"negative weight", "keys:\n- subject: a\n  key: " + aliceKey + "\n  roles: [admin]\n  weight: -1\n", "weight"},
		{"weight too large", "keys:\n- subject: a\n  key: " + aliceKey + "\n  roles: [admin]\n  weight: 1001\n", "weight"},
		{"max_priority out of range", "keys:\n- subject: a\n  key: " + aliceKey + "\n  roles: [admin]\n  max_priority: 6\n", "max_priority"},
		{"one subject, two weights", "keys:\n- subject: a\n  key: " + aliceKey + "\n  roles: [admin]\n  weight: 2\n- subject: a\n  key: " + bobKey + "\n  roles: [admin]\n", "weights 2 and 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "keys.yaml")
			if err := os.WriteFile(path, []byte(tc.doc), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := auth.Open(auth.Source{File: path}, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
			if strings.Contains(err.Error(), aliceKey) {
				t.Errorf("the error shows the key: %v", err)
			}
		})
	}
}

// JSON is YAML: the same document in either form; and keys from the file
// and the environment add up.
func TestJSONAndInline(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.json")
	doc := `{"keys": [{"subject": "alice", "key": "` + aliceKey + `", "roles": ["submit"], "queues": ["demo"]}]}`
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := auth.Open(auth.Source{File: path, Inline: "keys:\n- subject: bob\n  key: " + bobKey + "\n  roles: [admin]\n"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for key, subject := range map[string]string{aliceKey: "alice", bobKey: "bob"} {
		if id, err := s.Authenticate("Bearer " + key); err != nil || id.Subject() != subject {
			t.Errorf("%s: %v", subject, err)
		}
	}
	if s.Keys() != 2 {
		t.Errorf("%d keys", s.Keys())
	}
}

// Reload swaps the keys at once; a file that does not parse keeps the keys
// in use; an identity taken before a reload keeps working for its call.
func TestReload(t *testing.T) {
	var logs bytes.Buffer
	path := filepath.Join(t.TempDir(), "keys.yaml")
	write := func(doc string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("keys:\n- subject: alice\n  key: " + aliceKey + "\n  roles: [submit]\n  queues: [demo]\n")
	s, err := auth.Open(auth.Source{File: path}, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	before, _ := s.Authenticate("Bearer " + aliceKey)

	write("keys:\n- subject: alice\n  key: " + bobKey + "\n  roles: [submit]\n  queues: [demo]\n")
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate("Bearer " + aliceKey); codeOf(err) != core.CodeUnauthenticated {
		t.Errorf("the old key after rotation: %v", err)
	}
	if id, err := s.Authenticate("Bearer " + bobKey); err != nil || id.Subject() != "alice" {
		t.Errorf("the new key: %v", err)
	}
	if before.Allow(auth.Submit, "demo") != nil {
		t.Error("an identity taken before the reload changed")
	}

	write("keys: [")
	if err := s.Reload(); err == nil {
		t.Fatal("a broken file reloaded")
	}
	if id, err := s.Authenticate("Bearer " + bobKey); err != nil || id.Subject() != "alice" {
		t.Errorf("after a broken file, the keys in use: %v", err)
	}
	if strings.Contains(logs.String(), aliceKey) || strings.Contains(logs.String(), bobKey) {
		t.Errorf("a key in the log: %s", logs.String())
	}
}

func TestAdmitRate(t *testing.T) {
	s, _ := MustStore(t, "keys:\n- subject: a\n  key: "+aliceKey+"\n  roles: [submit]\n  queues: ['*']\n  rate: 2\n  burst: 3\n")
	id, _ := s.Authenticate("Bearer " + aliceKey)
	now := time.Unix(1_000_000, 0)
	for i := range 3 {
		if _, err := id.Admit(now); err != nil {
			t.Fatalf("job %d of the burst: %v", i+1, err)
		}
	}
	_, err := id.Admit(now)
	var ce *core.Error
	if codeOf(err) != core.CodeRateLimited {
		t.Fatalf("over the burst: %v", err)
	}
	ce = err.(*core.Error)
	if ce.RetryAfter != time.Second {
		t.Errorf("Retry-After %v, want 1s (a token every 0.5s, rounded up)", ce.RetryAfter)
	}
	// A refusal takes nothing: half a second later one token is back.
	if _, err := id.Admit(now.Add(500 * time.Millisecond)); err != nil {
		t.Errorf("after the refill: %v", err)
	}
}

func TestAdmitInFlight(t *testing.T) {
	s, path := MustStore(t, "keys:\n- subject: a\n  key: "+aliceKey+"\n  roles: [submit]\n  queues: ['*']\n  max_in_flight: 2\n")
	id, _ := s.Authenticate("Bearer " + aliceKey)
	now := time.Now()
	r1, err1 := id.Admit(now)
	_, err2 := id.Admit(now)
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	if _, err := id.Admit(now); codeOf(err) != core.CodeRateLimited {
		t.Fatalf("third in flight: %v", err)
	}
	r1()
	r1() // release is idempotent
	if _, err := id.Admit(now); err != nil {
		t.Fatalf("after one ended: %v", err)
	}
	if _, err := id.Admit(now); codeOf(err) != core.CodeRateLimited {
		t.Fatal("a second release freed a second slot")
	}
	// The counts survive a reload that keeps the key.
	if err := os.WriteFile(path, []byte("keys:\n- subject: a\n  key: "+aliceKey+"\n  roles: [submit]\n  queues: ['*']\n  max_in_flight: 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	id, _ = s.Authenticate("Bearer " + aliceKey)
	if _, err := id.Admit(now); err != nil {
		t.Fatalf("one more under the raised ceiling: %v", err)
	}
	if _, err := id.Admit(now); codeOf(err) != core.CodeRateLimited {
		t.Fatal("the reload reset the count")
	}
}

// Revoked: a reload that removes a subject's key or changes what one
// grants revokes the tokens the subject got until then, to the second
// they carry; its limits changing, or another subject's keys, do not.
func TestRevokedAtReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.yaml")
	write := func(doc string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	alice := "- subject: alice\n  key: " + aliceKey + "\n  roles: [submit]\n  queues: [demo]\n"
	bob := "- subject: bob\n  key: " + bobKey + "\n  roles: [submit]\n  queues: [demo]\n"
	write("keys:\n" + alice + bob)
	s, err := auth.Open(auth.Source{File: path}, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, b := auth.CallerFingerprint("alice"), auth.CallerFingerprint("bob")
	issued := time.Now().Add(-time.Minute).Truncate(time.Second)
	reload := func(doc string) {
		t.Helper()
		write(doc)
		if err := s.Reload(); err != nil {
			t.Fatal(err)
		}
	}
	if s.Revoked(a, issued) || s.Revoked(b, issued) {
		t.Fatal("revoked before any reload")
	}
	reload("keys:\n" + alice + strings.Replace(bob, "queues: [demo]\n", "queues: [demo]\n  rate: 5\n", 1))
	if s.Revoked(a, issued) || s.Revoked(b, issued) {
		t.Fatal("a reload that changed only a limit revoked tokens")
	}
	reload("keys:\n" + strings.Replace(alice, "queues: [demo]", "queues: [demo, other]", 1) + bob)
	if !s.Revoked(a, issued) || s.Revoked(b, issued) {
		t.Errorf("alice's grants changed: revoked alice %v (want true), bob %v (want false)", s.Revoked(a, issued), s.Revoked(b, issued))
	}
	if later := time.Now().Add(2 * time.Second).Truncate(time.Second); s.Revoked(a, later) {
		t.Error("a token issued after the reload is revoked")
	}
	reload("keys:\n" + bob)
	if !s.Revoked(a, issued) {
		t.Error("alice's key left, her token is not revoked")
	}
	reload("keys:\n" + bob)
	if !s.Revoked(a, issued) || s.Revoked(b, issued) {
		t.Error("a reload that changed nothing forgot a revocation, or made one")
	}
}

// A key's share: its subject's weight (default 1, the same on each of its
// keys) and its priority cap (none by default); the anonymous caller's is
// weight 1, no cap.
func TestShare(t *testing.T) {
	s, _ := MustStore(t, `
keys:
  - subject: batch
    key: `+aliceKey+`
    roles: [submit]
    queues: ["*"]
    weight: 3
    max_priority: -1
  - subject: batch
    key: `+bobKey+`
    roles: [submit]
    queues: ["*"]
    weight: 3
  - subject: plain
    key: plain-key-0123456789
    roles: [submit]
    queues: ["*"]
`)
	for _, tc := range []struct {
		key    string
		weight int
		cap    *int
	}{{aliceKey, 3, ptr(-1)}, {bobKey, 3, nil}, {"plain-key-0123456789", 1, nil}} {
		id, err := s.Authenticate("Bearer " + tc.key)
		if err != nil {
			t.Fatal(err)
		}
		sh := id.Share()
		if sh.Weight != tc.weight || (sh.MaxPriority == nil) != (tc.cap == nil) || tc.cap != nil && *sh.MaxPriority != *tc.cap {
			t.Errorf("%s: share %+v, want weight %d cap %v", id.Subject(), sh, tc.weight, tc.cap)
		}
	}
	if sh := auth.Anonymous("").Share(); sh.Weight != 1 || sh.MaxPriority != nil {
		t.Errorf("anonymous share %+v, want weight 1 and no cap", sh)
	}
}

func ptr[T any](v T) *T { return &v }

// The anonymous identity of a call without a credential is made once: the
// same roles, queues and caller as for any other credential, bound to "".
func TestAnonymousWithoutCredential(t *testing.T) {
	none, other := auth.Anonymous(""), auth.Anonymous("Bearer x")
	if !none.IsAnonymous() || none.Roles() != other.Roles() || none.Allow(auth.Submit, "any") != nil {
		t.Fatalf("Anonymous(\"\") is not the anonymous identity: %+v", none)
	}
	if none.Caller() != resume.Fingerprint("authorization", "") || none.Caller() == other.Caller() {
		t.Fatal("Anonymous(\"\") is not bound to the empty credential")
	}
	if a := testing.AllocsPerRun(100, func() { auth.Anonymous("") }); a != 0 {
		t.Fatalf("Anonymous(\"\") allocates %v times", a)
	}
}
