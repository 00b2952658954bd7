//go:build compose

package compose_test

import (
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/integration/catalogprobe"
)

// checkCatalogClosed tries, from the cluster's network (this host is on
// the compose network's bridge, as any container on it is), what a
// process that holds no secret would: an anonymous etcd put and get on
// every node's etcd ports (2380, the peer port, and 2379, the client
// port, both on the node's address and both mutual TLS only), a
// plaintext raft post and a plaintext membership read on the peer port,
// and a TLS handshake without a certificate. Each must get nothing; it
// returns what each got, for the log.
func checkCatalogClosed(t *testing.T, c *cluster) []string {
	t.Helper()
	var out []string
	for i := range nodeServices {
		ip := fmt.Sprintf("%s.%d", c.subnet, 11+i)
		for _, port := range []string{"2380", "2379"} {
			addr := net.JoinHostPort(ip, port)
			for _, try := range catalogprobe.Anonymous(addr, "10.0.0.1:1") {
				if try.ConnectErr != nil {
					out = append(out, fmt.Sprintf("%s %s: refused at connect: %v", addr, try.Name, try.ConnectErr))
					continue
				}
				if try.PutErr == nil || try.GetErr == nil {
					t.Errorf("%s %s: anonymous put %v, get %v: want both refused", addr, try.Name, try.PutErr, try.GetErr)
				}
				out = append(out, fmt.Sprintf("%s %s: put refused (%v), get refused (%v)", addr, try.Name, try.PutErr, try.GetErr))
			}
		}
		peer := net.JoinHostPort(ip, "2380")
		for _, req := range []string{
			"GET /members HTTP/1.1\r\nHost: etcd\r\n\r\n",
			"POST /raft HTTP/1.1\r\nHost: etcd\r\nContent-Length: 0\r\n\r\n",
		} {
			got := rawHTTP(t, peer, req)
			if strings.HasPrefix(got, "HTTP/") {
				t.Errorf("%s: %q answered in plaintext: %.120q", peer, strings.Fields(req)[:2], got)
			}
			out = append(out, fmt.Sprintf("%s %s in plaintext: %q", peer, strings.Join(strings.Fields(req)[:2], " "), got))
		}
		required, err := catalogprobe.TLSWithoutCertificate(peer)
		if !required {
			t.Errorf("%s: TLS without a certificate: %v, want the certificate required", peer, err)
		}
		out = append(out, fmt.Sprintf("%s TLS handshake without a certificate: %v", peer, err))
	}
	return out
}

// rawHTTP sends req on a new connection to addr and returns what came back
// within two seconds.
func rawHTTP(t *testing.T, addr, req string) string {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return "connect: " + err.Error()
	}
	defer conn.Close()
	_, _ = conn.Write([]byte(req))
	_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	got, _ := io.ReadAll(conn)
	return string(got)
}
