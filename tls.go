package switchyard

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/switchyard/switchyard/catalog"
	"github.com/switchyard/switchyard/core"
)

// TLS of a node, three perimeters:
//
//   - the public ports (HTTP, HTTP/2 included, and gRPC) with
//     --tls-cert/--tls-key: a server certificate, reloaded when its files
//     change (certFile), so a renewed certificate needs no restart;
//   - the peer port with --peer-tls-cert/--peer-tls-key/--peer-tls-ca:
//     mutual TLS, every node presenting a certificate of the cluster CA,
//     beside the cluster secret; a node whose certificate the CA did not
//     sign is refused at the handshake, and the refusal logged;
//   - the catalog: the embedded etcd member serves its client and peer
//     ports with the same cluster certificate, client certificates required
//     (catalog.TLS), or, with no cluster CA, with certificates derived
//     from the cluster secret (catalog/derive.go): never without TLS; a
//     node reaching an external etcd over https uses --etcd-tls-* (or the
//     cluster certificate) and --etcd-username.

// certReloadEvery bounds how often a certificate's files are looked at: a
// handshake stats them at most this often, and reloads them when their
// size or modification time changed.
const certReloadEvery = time.Second

// certFile is a certificate and key pair read from files, reloaded when
// they change. A reload that fails (a half-written file, a key that does
// not match) keeps the certificate in use and logs why; the next
// handshake after the files change again tries again.
type certFile struct {
	certPath, keyPath string
	log               *slog.Logger

	mu      sync.Mutex
	cur     *tls.Certificate
	stamp   [2]fileStamp
	checked time.Time
}

type fileStamp struct {
	size int64
	mod  time.Time
}

func stampOf(path string) (fileStamp, error) {
	st, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, err
	}
	return fileStamp{st.Size(), st.ModTime()}, nil
}

// loadCertFile reads a pair, or says which flag's files do not load.
func loadCertFile(flag, certPath, keyPath string, log *slog.Logger) (*certFile, error) {
	c := &certFile{certPath: certPath, keyPath: keyPath, log: log}
	if err := c.reload(); err != nil {
		return nil, &core.ConfigError{Field: flag, Value: certPath, Err: err}
	}
	return c, nil
}

func (c *certFile) reload() error {
	var stamp [2]fileStamp
	for i, p := range []string{c.certPath, c.keyPath} {
		s, err := stampOf(p)
		if err != nil {
			return err
		}
		stamp[i] = s
	}
	pair, err := tls.LoadX509KeyPair(c.certPath, c.keyPath)
	if err != nil {
		return err
	}
	c.cur, c.stamp = &pair, stamp
	return nil
}

// get is the certificate to present now, reloaded first if its files
// changed since they were last looked at.
func (c *certFile) get() *tls.Certificate {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := time.Now(); now.Sub(c.checked) >= certReloadEvery {
		c.checked = now
		s0, err0 := stampOf(c.certPath)
		s1, err1 := stampOf(c.keyPath)
		if err0 == nil && err1 == nil && (s0 != c.stamp[0] || s1 != c.stamp[1]) {
			if err := c.reload(); err != nil {
				c.log.Error("certificate not reloaded; the one in use stays", "cert", c.certPath, "err", err)
			} else {
				c.log.Info("certificate reloaded", "cert", c.certPath)
			}
		}
	}
	return c.cur
}

func (c *certFile) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return c.get(), nil
}

func (c *certFile) GetClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return c.get(), nil
}

// loadPool reads a PEM file of CA certificates.
func loadPool(flag, path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, &core.ConfigError{Field: flag, Value: path, Err: err}
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, &core.ConfigError{Field: flag, Value: path, Err: errors.New("holds no PEM certificate")}
	}
	return pool, nil
}

// publicTLS is the server TLS of the HTTP and gRPC ports; nil without
// --tls-cert. HTTP/2 is offered by ALPN (the HTTP server adds "h2").
func (n *Node) publicTLS() (*tls.Config, error) {
	if n.cfg.TLSCert == "" {
		return nil, nil
	}
	cf, err := loadCertFile("tls-cert", n.cfg.TLSCert, n.cfg.TLSKey, n.log.With("system", "tls"))
	if err != nil {
		return nil, err
	}
	return &tls.Config{GetCertificate: cf.GetCertificate, MinVersion: tls.VersionTLS12}, nil
}

// relayTLS is how this node reaches another node's public ports, to relay
// a keyed submission whose job lives there; nil for nodes without
// --tls-cert (the cluster's nodes share their TLS settings). It trusts the
// system's roots, --tls-ca and the cluster CA.
func (n *Node) relayTLS() (*tls.Config, error) {
	if n.cfg.TLSCert == "" {
		return nil, nil
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	for _, f := range []struct{ flag, path string }{{"tls-ca", n.cfg.TLSCA}, {"peer-tls-ca", n.cfg.PeerTLSCA}} {
		if f.path == "" {
			continue
		}
		pem, err := os.ReadFile(f.path)
		if err != nil || !pool.AppendCertsFromPEM(pem) {
			return nil, &core.ConfigError{Field: f.flag, Value: f.path, Err: errors.New("does not read as PEM certificates")}
		}
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// peerTLS is the peer port's mutual TLS, server and client side; nil
// without --peer-tls-cert. The server checks a client's certificate itself
// (catalog.VerifyChain) so that it can log who was refused: the standard
// check fails the handshake before any of our code sees it.
func (n *Node) peerTLS() (server, client *tls.Config, err error) {
	if n.cfg.PeerTLSCert == "" {
		return nil, nil, nil
	}
	log := n.log.With("system", "peer")
	cf, err := loadCertFile("peer-tls-cert", n.cfg.PeerTLSCert, n.cfg.PeerTLSKey, log)
	if err != nil {
		return nil, nil, err
	}
	pool, err := loadPool("peer-tls-ca", n.cfg.PeerTLSCA)
	if err != nil {
		return nil, nil, err
	}
	base := &tls.Config{GetCertificate: cf.GetCertificate, ClientAuth: tls.RequireAnyClientCert, MinVersion: tls.VersionTLS13}
	server = base.Clone()
	server.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		c := base.Clone()
		c.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
			err := catalog.VerifyChain(pool, raw, x509.ExtKeyUsageClientAuth)
			if err != nil {
				log.Warn("peer TLS: a client certificate was refused", "remote", remoteOf(hello), "err", err)
			}
			return err
		}
		return c, nil
	}
	client = &tls.Config{GetClientCertificate: cf.GetClientCertificate, RootCAs: pool, MinVersion: tls.VersionTLS13}
	return server, client, nil
}

func remoteOf(hello *tls.ClientHelloInfo) string {
	if hello.Conn == nil {
		return ""
	}
	return hello.Conn.RemoteAddr().String()
}

// validateTLS checks the TLS flags come in their sets.
func (c *Config) validateTLS() error {
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return &core.ConfigError{Field: "tls-cert", Value: c.TLSCert, Err: errors.New("--tls-cert and --tls-key go together")}
	}
	if (c.PeerTLSCert == "") != (c.PeerTLSKey == "") || (c.PeerTLSCert == "") != (c.PeerTLSCA == "") {
		return &core.ConfigError{Field: "peer-tls-cert", Value: c.PeerTLSCert, Err: errors.New("--peer-tls-cert, --peer-tls-key and --peer-tls-ca go together")}
	}
	if (c.EtcdTLSCert == "") != (c.EtcdTLSKey == "") {
		return &core.ConfigError{Field: "etcd-tls-cert", Value: c.EtcdTLSCert, Err: errors.New("--etcd-tls-cert and --etcd-tls-key go together")}
	}
	return nil
}

// catalogTLS is the catalog's TLS files: for an embedded member, the
// cluster's (peer) certificate; for external endpoints, --etcd-tls-* when
// given, else the cluster's for https endpoints (a node joining the
// members of an embedded cluster as a client). Nil: the catalog derives
// its certificates from the cluster secret (an embedded member; a client
// of https endpoints), or uses none (http endpoints).
func (c *Config) catalogTLS() *catalog.TLSFiles {
	peerFiles := &catalog.TLSFiles{Cert: c.PeerTLSCert, Key: c.PeerTLSKey, CA: c.PeerTLSCA}
	if len(c.EtcdEndpoints) == 0 {
		if c.PeerTLSCert == "" {
			return nil
		}
		return peerFiles
	}
	if c.EtcdTLSCA != "" || c.EtcdTLSCert != "" {
		return &catalog.TLSFiles{Cert: c.EtcdTLSCert, Key: c.EtcdTLSKey, CA: c.EtcdTLSCA}
	}
	for _, ep := range c.EtcdEndpoints {
		if strings.HasPrefix(ep, "https://") && c.PeerTLSCert != "" {
			return peerFiles
		}
	}
	return nil
}
