// Package catalogprobe tries a Switchyard catalog's etcd ports as a process
// that holds no cluster secret would: an anonymous put and get, over
// plaintext and over TLS without a client certificate, and a TLS handshake
// without one. The integration tests (a local cluster) and the compose
// tests (a cluster on a Docker network) hold every try to failing.
package catalogprobe

import (
	"context"
	"crypto/tls"
	"net"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/catalog"
)

// Try is one anonymous try at an etcd port.
type Try struct {
	Name string // "plaintext" or "TLS without a certificate"
	// ConnectErr is set when the client was refused at connect; PutErr
	// and GetErr otherwise: nil when the put or the get got through.
	ConnectErr, PutErr, GetErr error
}

// Anonymous tries, over plaintext and over TLS without a client
// certificate, to write the record of a node evil (peer address evilPeer)
// into the etcd behind addr, and to read the node records.
func Anonymous(addr, evilPeer string) []Try {
	var tries []Try
	for _, try := range []struct {
		name string
		cfg  clientv3.Config
	}{
		{"plaintext", clientv3.Config{Endpoints: []string{"http://" + addr}}},
		{"TLS without a certificate", clientv3.Config{Endpoints: []string{"https://" + addr}, TLS: &tls.Config{InsecureSkipVerify: true}}},
	} {
		try.cfg.DialTimeout, try.cfg.Logger = time.Second, zap.NewNop()
		c, err := clientv3.New(try.cfg)
		if err != nil {
			tries = append(tries, Try{Name: try.name, ConnectErr: err})
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		_, perr := c.Put(ctx, catalog.NodeKey("evil"), `{"v":1,"peer_addr":"`+evilPeer+`","state":"online"}`)
		_, gerr := c.Get(ctx, "/nodes/", clientv3.WithPrefix())
		cancel()
		_ = c.Close()
		tries = append(tries, Try{Name: try.name, PutErr: perr, GetErr: gerr})
	}
	return tries
}

// TLSWithoutCertificate makes a TLS handshake with addr offering no client
// certificate, and reads from the connection: it returns the error that
// ended that (nil: the port took the connection), and whether that error
// is the port's demand for a certificate.
func TLSWithoutCertificate(addr string) (required bool, err error) {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true})
	if err == nil {
		_ = conn.SetReadDeadline(time.Now().Add(time.Second))
		_, err = conn.Read(make([]byte, 1))
		conn.Close()
	}
	return err != nil && strings.Contains(err.Error(), "certificate required"), err
}
