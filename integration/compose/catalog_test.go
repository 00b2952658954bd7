//go:build compose

package compose_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
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
			for _, try := range []struct {
				name string
				cfg  clientv3.Config
			}{
				{"plaintext", clientv3.Config{Endpoints: []string{"http://" + addr}}},
				{"TLS without a certificate", clientv3.Config{Endpoints: []string{"https://" + addr}, TLS: &tls.Config{InsecureSkipVerify: true}}},
			} {
				try.cfg.DialTimeout, try.cfg.Logger = time.Second, zap.NewNop()
				cl, err := clientv3.New(try.cfg)
				if err != nil {
					out = append(out, fmt.Sprintf("%s %s: refused at connect: %v", addr, try.name, err))
					continue
				}
				ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
				_, perr := cl.Put(ctx, "/nodes/evil", `{"v":1,"peer_addr":"10.0.0.1:1","state":"online"}`)
				_, gerr := cl.Get(ctx, "/nodes/", clientv3.WithPrefix())
				cancel()
				_ = cl.Close()
				if perr == nil || gerr == nil {
					t.Errorf("%s %s: anonymous put %v, get %v: want both refused", addr, try.name, perr, gerr)
				}
				out = append(out, fmt.Sprintf("%s %s: put refused (%v), get refused (%v)", addr, try.name, perr, gerr))
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
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", peer, &tls.Config{InsecureSkipVerify: true})
		if err == nil {
			_ = conn.SetReadDeadline(time.Now().Add(time.Second))
			_, err = conn.Read(make([]byte, 1))
			conn.Close()
		}
		if err == nil || !strings.Contains(err.Error(), "certificate required") {
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
