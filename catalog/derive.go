package catalog

import (
	"crypto/ed25519"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// The catalog's certificates, derived from the cluster secret. An embedded
// member always serves its client and peer ports over mutual TLS: with the
// cluster CA's certificates when the node has them (Config.TLS), else with
// certificates of a CA derived from the cluster secret (Config.Secret).
// Every node computes the same CA, key and certificate, from the secret
// alone (an Ed25519 key is its seed, and its signatures are
// deterministic), and issues itself a certificate under it at each start.
// So the catalog is open to holders of the secret only, on every listener,
// loopback included, with nothing to distribute but the secret the peer
// handshake needs anyway:
//
//   - the client port (the KV, watch and lease API, and etcd's /health,
//     /metrics, /version) requires a client certificate of the CA: an
//     anonymous read or write fails at the TLS handshake;
//   - the peer port (raft, membership, lease forwarding) requires the same
//     of the other members: without it anyone who reaches the port could
//     forge raft messages, and etcd's own user auth would not stop them
//     (a raft entry carries its own user name).
//
// A certificate of the derived CA proves the secret, not an address: any
// holder of the secret could issue one for any name. So the members do not
// check the addresses in each other's client certificates
// (SkipClientSANVerify), and a client of members (Endpoints, https) checks
// the chain to the CA and not the server's name, which also lets it reach
// them through a proxy. Certificates of a real cluster CA (--peer-tls-*)
// are checked as etcd always checks them.

// derivedCAValidity is the derived CA's fixed validity: fixed, so that
// every node computes the same certificate. A node's own certificate ends
// with it.
var derivedCAValidity = [2]time.Time{
	time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC),
	time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC),
}

// derivedCA is the CA the cluster secret stands for: its key (the HKDF of
// the secret is the Ed25519 seed) and its self-signed certificate, the
// same bytes on every node.
func derivedCA(secret []byte) (*x509.Certificate, ed25519.PrivateKey, error) {
	seed, err := hkdf.Key(sha256.New, secret, []byte("switchyard catalog CA"), "v1", ed25519.SeedSize)
	if err != nil {
		return nil, nil, err
	}
	key := ed25519.NewKeyFromSeed(seed)
	pub := key.Public().(ed25519.PublicKey)
	id := sha256.Sum256(pub)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: fmt.Sprintf("switchyard catalog CA %x", id[:8])},
		NotBefore:             derivedCAValidity[0],
		NotAfter:              derivedCAValidity[1],
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
		SubjectKeyId:          id[:20],
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, key)
	if err != nil {
		return nil, nil, fmt.Errorf("derive the catalog CA: %w", err)
	}
	ca, err := x509.ParseCertificate(der)
	return ca, key, err
}

// issue returns a certificate of the derived CA for node name, server and
// client both, naming hosts (IP addresses or DNS names), and its key: a new
// key at every call.
func issue(ca *x509.Certificate, caKey ed25519.PrivateKey, name string, hosts []string, now time.Time) (certPEM, keyPEM []byte, err error) {
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     ca.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, pub, caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("issue the catalog certificate of %s: %w", name, err)
	}
	pk, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pk}), nil
}

// issueDerived issues a certificate for name, valid for hosts, under the
// CA derived from secret; it returns the CA with the certificate and its
// key (PEM).
func issueDerived(secret []byte, name string, hosts []string) (ca *x509.Certificate, certPEM, keyPEM []byte, err error) {
	ca, caKey, err := derivedCA(secret)
	if err != nil {
		return nil, nil, nil, err
	}
	certPEM, keyPEM, err = issue(ca, caKey, name, hosts, time.Now())
	if err != nil {
		return nil, nil, nil, err
	}
	return ca, certPEM, keyPEM, nil
}

// writeDerivedTLS issues this member's certificate under the CA derived
// from secret and writes it, its key and the CA to dir/tls (etcd reads its
// TLS from files), readable by the node's user alone; it returns the files.
func writeDerivedTLS(dir string, secret []byte, name string, hosts []string) (*TLSFiles, error) {
	tlsDir := filepath.Join(dir, "tls")
	if err := os.MkdirAll(tlsDir, 0o700); err != nil {
		return nil, fmt.Errorf("catalog TLS: %w", err)
	}
	files := &TLSFiles{Cert: filepath.Join(tlsDir, "member.pem"), Key: filepath.Join(tlsDir, "member-key.pem"), CA: filepath.Join(tlsDir, "ca.pem")}
	if err := writeDerived(files, secret, name, hosts); err != nil {
		return nil, err
	}
	return files, nil
}

// WriteClientTLS writes to dir a client certificate for name under the
// CA derived from secret, its key and the CA (client.pem, client-key.pem,
// ca.pem; 0600), and returns the files: what a tool that is not a node
// (etcdctl, or a node given another cluster secret for its peers) needs to
// reach the members of a catalog whose certificates that secret derives.
// A node's own <data-dir>/tls/member.pem serves as one too.
func WriteClientTLS(dir string, secret []byte, name string) (*TLSFiles, error) {
	files := &TLSFiles{Cert: filepath.Join(dir, "client.pem"), Key: filepath.Join(dir, "client-key.pem"), CA: filepath.Join(dir, "ca.pem")}
	if err := writeDerived(files, secret, name, nil); err != nil {
		return nil, err
	}
	return files, nil
}

// writeDerived issues a certificate for name, valid for hosts, under the
// CA derived from secret, and writes it, its key and the CA to files
// (0600).
func writeDerived(files *TLSFiles, secret []byte, name string, hosts []string) error {
	ca, certPEM, keyPEM, err := issueDerived(secret, name, hosts)
	if err != nil {
		return err
	}
	for path, data := range map[string][]byte{
		files.Cert: certPEM, files.Key: keyPEM,
		files.CA: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw}),
	} {
		if err := writeFile0600(path, data); err != nil {
			return fmt.Errorf("catalog TLS: %w", err)
		}
	}
	return nil
}

// writeFile0600 replaces path with data, mode 0600, through a temporary
// file renamed over it: a reader never sees half a file.
func writeFile0600(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o600); err != nil { // an old tmp kept its mode
		return err
	}
	return os.Rename(tmp, path)
}

// derivedClientTLS is the TLS of a client of members whose certificates
// the secret's CA issued: it presents a certificate of its own from that
// CA, and takes a server's certificate if the CA signed it, whatever name
// it carries (see the file's comment).
func derivedClientTLS(secret []byte, name string) (*tls.Config, error) {
	ca, certPEM, keyPEM, err := issueDerived(secret, name, nil)
	if err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &tls.Config{
		Certificates: []tls.Certificate{pair},
		MinVersion:   tls.VersionTLS12,
		// The chain is checked below, against the derived CA alone; the
		// name is not (InsecureSkipVerify only turns off Go's own check,
		// which would also compare names).
		InsecureSkipVerify: true,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if err := VerifyChain(pool, raw, x509.ExtKeyUsageServerAuth); err != nil {
				return fmt.Errorf("catalog TLS (another cluster secret?): %w", err)
			}
			return nil
		},
	}, nil
}

// VerifyChain checks that the leaf of raw (a peer's certificate chain as
// the handshake received it, leaf first) chains to a CA in pool, the
// cluster CA, for use. The node's peer port checks its clients with it as
// the derived catalog TLS checks its members. An error names the leaf and
// its issuer.
func VerifyChain(pool *x509.CertPool, raw [][]byte, use x509.ExtKeyUsage) error {
	if len(raw) == 0 {
		return errors.New("no certificate")
	}
	certs := make([]*x509.Certificate, len(raw))
	for i, b := range raw {
		c, err := x509.ParseCertificate(b)
		if err != nil {
			return fmt.Errorf("certificate %d: %w", i, err)
		}
		certs[i] = c
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{use}}); err != nil {
		return fmt.Errorf("%s, issued by %s, is not of the cluster CA: %w", certs[0].Subject, certs[0].Issuer, err)
	}
	return nil
}

// memberHosts are the names a member's certificate carries: the hosts of
// its listen addresses (every address of the machine for one that binds
// them all), of its own InitialCluster entry, loopback, and the machine's
// host name.
func memberHosts(cfg Config, ms []clusterMember) []string {
	hosts := []string{"127.0.0.1", "::1", "localhost"}
	if h, err := os.Hostname(); err == nil {
		hosts = append(hosts, h)
	}
	for _, addr := range []string{cfg.ClientAddr, cfg.PeerAddr} {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			continue
		}
		if ip := net.ParseIP(host); ip == nil || !ip.IsUnspecified() {
			hosts = append(hosts, host)
			continue
		}
		if addrs, err := net.InterfaceAddrs(); err == nil {
			for _, a := range addrs {
				if ipn, ok := a.(*net.IPNet); ok {
					hosts = append(hosts, ipn.IP.String())
				}
			}
		}
	}
	for _, m := range ms {
		if m.name == cfg.Name {
			if host, _, err := net.SplitHostPort(m.host); err == nil {
				hosts = append(hosts, host)
			}
		}
	}
	return hosts
}
