package catalog

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"os"
	"testing"
	"time"
)

// Every node derives the same CA from one secret, to the byte, and
// another secret gives another CA; a certificate it issues chains to its
// CA only.
func TestDerivedCA(t *testing.T) {
	a, _, err := derivedCA([]byte("one-cluster-secret-0001"))
	if err != nil {
		t.Fatal(err)
	}
	again, key, err := derivedCA([]byte("one-cluster-secret-0001"))
	if err != nil {
		t.Fatal(err)
	}
	other, _, err := derivedCA([]byte("another-cluster-secret"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Raw, again.Raw) {
		t.Fatal("one secret derived two different CA certificates")
	}
	if bytes.Equal(a.Raw, other.Raw) || bytes.Equal(a.SubjectKeyId, other.SubjectKeyId) {
		t.Fatal("two secrets derived the same CA")
	}
	certPEM, keyPEM, err := issue(again, key, "n1", []string{"127.0.0.1", "node-1"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ca   *x509.Certificate
		want bool
	}{{a, true}, {other, false}} {
		pool := x509.NewCertPool()
		pool.AddCert(tc.ca)
		if err := VerifyChain(pool, pair.Certificate, x509.ExtKeyUsageClientAuth); (err == nil) != tc.want {
			t.Errorf("verify against %s: %v, want ok %v", tc.ca.Subject, err, tc.want)
		}
	}
}

// Open writes the member's derived files readable by the node alone.
func TestDerivedFilesArePrivate(t *testing.T) {
	dir := t.TempDir()
	files, err := writeDerivedTLS(dir, []byte("one-cluster-secret-0001"), "n1", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{files.Cert, files.Key, files.CA} {
		if mode := fileMode(t, f); mode != 0o600 {
			t.Errorf("%s: mode %o, want 600", f, mode)
		}
	}
	if mode := fileMode(t, dir+"/tls"); mode != 0o700 {
		t.Errorf("tls dir: mode %o, want 700", mode)
	}
	// A second start replaces them.
	if _, err := writeDerivedTLS(dir, []byte("one-cluster-secret-0001"), "n1", nil); err != nil {
		t.Fatal(err)
	}
}

func fileMode(t *testing.T, path string) os.FileMode {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Mode().Perm()
}
