package resume_test

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/core/resume"
)

func TestNewKeyring(t *testing.T) {
	good := testKey("a", 1)
	tests := []struct {
		name    string
		signing string
		keys    []resume.Key
		ok      bool
	}{
		{"one key", "a", []resume.Key{good}, true},
		{"signing plus verification keys", "b", []resume.Key{good, testKey("b", 2), testKey("c", 3)}, true},
		{"longest id, every character class", "Az09_-Az09_-Az09", []resume.Key{testKey("Az09_-Az09_-Az09", 1)}, true},
		{"no keys", "a", nil, false},
		{"signing key missing", "b", []resume.Key{good}, false},
		{"empty id", "", []resume.Key{testKey("", 1)}, false},
		{"id too long", "abcdefghijklmnopq", []resume.Key{testKey("abcdefghijklmnopq", 1)}, false},
		{"id with dot", "a.b", []resume.Key{testKey("a.b", 1)}, false},
		{"id with colon", "a:b", []resume.Key{testKey("a:b", 1)}, false},
		{"id with non-ASCII", "clé", []resume.Key{testKey("clé", 1)}, false},
		{"short secret", "a", []resume.Key{{ID: "a", Secret: make([]byte, 31)}}, false},
		{"nil secret", "a", []resume.Key{{ID: "a"}}, false},
		{"short verification secret", "a", []resume.Key{good, {ID: "b", Secret: make([]byte, 8)}}, false},
		{"duplicate id", "a", []resume.Key{good, testKey("a", 2)}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kr, err := resume.NewKeyring(tt.signing, tt.keys...)
			if tt.ok {
				if err != nil {
					t.Fatalf("NewKeyring: %v", err)
				}
				if kr.SigningKeyID() != tt.signing {
					t.Fatalf("SigningKeyID = %q, want %q", kr.SigningKeyID(), tt.signing)
				}
				return
			}
			if !errors.Is(err, resume.ErrInvalidKey) || kr != nil {
				t.Fatalf("NewKeyring = (%v, %v), want ErrInvalidKey", kr, err)
			}
		})
	}
}

func TestKeyringIDs(t *testing.T) {
	kr := MustKeyring(t, "m", testKey("z", 1), testKey("m", 2), testKey("a", 3))
	if got, want := kr.KeyIDs(), []string{"a", "m", "z"}; !slices.Equal(got, want) {
		t.Fatalf("KeyIDs = %q, want %q", got, want)
	}
}

func TestKeyringCopiesSecrets(t *testing.T) {
	k := testKey("a", 1)
	kr := MustKeyring(t, "a", k)
	p := samplePosition()
	tok := MustSign(t, kr, p, t0, time.Minute)
	clear(k.Secret) // the caller reuses its buffer
	if _, err := kr.Verify(tok, t0, expectFor(p)); err != nil {
		t.Fatalf("Verify after caller changed its secret: %v", err)
	}
	if tok2 := MustSign(t, kr, p, t0, time.Minute); tok2 != tok {
		t.Fatalf("signature changed after caller changed its secret")
	}
}

func TestParseKey(t *testing.T) {
	secret := bytes.Repeat([]byte{0xfb, 0xff, 0x3e}, 11) // 33 bytes, '+', '/' in std
	tests := []struct {
		name string
		in   string
		ok   bool
	}{
		{"std padded", "k1:" + base64.StdEncoding.EncodeToString(secret), true},
		{"std raw", "k1:" + base64.RawStdEncoding.EncodeToString(secret), true},
		{"url padded", "k1:" + base64.URLEncoding.EncodeToString(secret), true},
		{"url raw", "k1:" + base64.RawURLEncoding.EncodeToString(secret), true},
		{"surrounding whitespace", "  k1:" + base64.StdEncoding.EncodeToString(secret) + "\n", true},
		{"no colon", base64.StdEncoding.EncodeToString(secret), false},
		{"empty id", ":" + base64.StdEncoding.EncodeToString(secret), false},
		{"bad id", "k 1:" + base64.StdEncoding.EncodeToString(secret), false},
		{"not base64", "k1:not*base64*at*all*not*base64*at*all*not*base64", false},
		{"short secret", "k1:" + base64.StdEncoding.EncodeToString(secret[:31]), false},
		{"empty secret", "k1:", false},
		{"empty", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, err := resume.ParseKey(tt.in)
			if !tt.ok {
				if !errors.Is(err, resume.ErrInvalidKey) {
					t.Fatalf("ParseKey(%q) = (%v, %v), want ErrInvalidKey", tt.in, k, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseKey(%q): %v", tt.in, err)
			}
			if k.ID != "k1" || !bytes.Equal(k.Secret, secret) {
				t.Fatalf("ParseKey(%q) = %q/%x, want k1/%x", tt.in, k.ID, k.Secret, secret)
			}
		})
	}
}

// TestKeySecretsStayOut checks that neither errors nor formatted keys and
// keyrings contain a secret.
func TestKeySecretsStayOut(t *testing.T) {
	k := resume.GenerateKey("k1")
	enc := base64.StdEncoding.EncodeToString(k.Secret)
	kr := MustKeyring(t, "k1", k)

	// A config line with its halves swapped must not echo the secret.
	_, swapErr := resume.ParseKey(enc + ":k1")
	_, shortErr := resume.ParseKey("k1:" + base64.StdEncoding.EncodeToString(k.Secret[:20]))
	outputs := []string{
		//lint:ignore S1025 every formatting verb is the point: none may print the secret
		fmt.Sprint(k), fmt.Sprintf("%v", k), fmt.Sprintf("%+v", k), fmt.Sprintf("%#v", k), fmt.Sprintf("%s", k),
		fmt.Sprint(kr), fmt.Sprintf("%+v", kr), fmt.Sprintf("%#v", kr),
		fmt.Sprint([]resume.Key{k}),
		swapErr.Error(), shortErr.Error(),
	}
	for _, out := range outputs {
		if strings.Contains(out, enc) || strings.Contains(out, enc[:20]) || strings.Contains(out, fmt.Sprint(k.Secret[:8])) {
			t.Fatalf("output leaks the secret: %s", out)
		}
	}
	if !strings.Contains(fmt.Sprint(kr), "k1") {
		t.Fatalf("keyring String %q does not name its key", fmt.Sprint(kr))
	}
}

func TestGenerateAndFormatKey(t *testing.T) {
	a, b := resume.GenerateKey("a"), resume.GenerateKey("b")
	if len(a.Secret) != resume.MinSecretLen || bytes.Equal(a.Secret, b.Secret) {
		t.Fatalf("GenerateKey secrets: %d bytes, equal=%v", len(a.Secret), bytes.Equal(a.Secret, b.Secret))
	}
	parsed, err := resume.ParseKey(resume.FormatKey(a))
	if err != nil {
		t.Fatalf("ParseKey(FormatKey(k)): %v", err)
	}
	if parsed.ID != a.ID || !bytes.Equal(parsed.Secret, a.Secret) {
		t.Fatal("ParseKey(FormatKey(k)) != k")
	}
	if _, err := resume.NewKeyring("a", a, b); err != nil {
		t.Fatalf("generated keys rejected: %v", err)
	}
}
