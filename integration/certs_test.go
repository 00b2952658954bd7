package integration_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Certificates for the TLS tests, made at run time (crypto/x509): a CA per
// test, and certificates it signs for loopback, each valid for serving and
// for client authentication. Nothing is committed.

// testCA is a certificate authority of one test.
type testCA struct {
	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	dir    string
	CAFile string
	serial int64
}

func mustCA(tb testing.TB, name string) *testCA {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	ca := &testCA{cert: cert, key: key, dir: tb.TempDir(), serial: 1}
	ca.CAFile = filepath.Join(ca.dir, name+"-ca.pem")
	writePEM(tb, ca.CAFile, "CERTIFICATE", der)
	return ca
}

// issue signs a certificate for 127.0.0.1 and localhost and writes it and
// its key; it returns their paths. Issued again under the same name, it
// replaces the files (a renewed certificate).
func (ca *testCA) issue(tb testing.TB, name string) (certFile, keyFile string) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	ca.serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		tb.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	certFile, keyFile = filepath.Join(ca.dir, name+".pem"), filepath.Join(ca.dir, name+"-key.pem")
	// The key first, then the certificate: a reader that sees the new
	// certificate finds its key already there.
	writePEM(tb, keyFile, "EC PRIVATE KEY", kder)
	writePEM(tb, certFile, "CERTIFICATE", der)
	return certFile, keyFile
}

// pool trusts only the CA.
func (ca *testCA) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// clientTLS trusts only the CA; with name, it presents that certificate.
func (ca *testCA) clientTLS(tb testing.TB, name string) *tls.Config {
	tb.Helper()
	c := &tls.Config{RootCAs: ca.pool(), MinVersion: tls.VersionTLS12}
	if name != "" {
		cert, key := ca.issue(tb, name)
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			tb.Fatal(err)
		}
		c.Certificates = []tls.Certificate{pair}
	}
	return c
}

func writePEM(tb testing.TB, path, kind string, der []byte) {
	tb.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		tb.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		tb.Fatal(err)
	}
}
