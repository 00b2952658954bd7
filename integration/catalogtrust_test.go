package integration_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/catalog"
	"github.com/switchyard/switchyard/integration/catalogprobe"
)

// anonymousCatalogAccess tries, as a process on the machine that holds no
// secret would, to write a node record into the catalog behind addr and to
// read the node records: with no TLS, and with TLS but no certificate. It
// returns what happened to each try; a try that got through fails tb.
func anonymousCatalogAccess(tb testing.TB, addr string) []string {
	tb.Helper()
	var out []string
	for _, try := range catalogprobe.Anonymous(addr, "127.0.0.1:1") {
		if try.ConnectErr != nil {
			out = append(out, fmt.Sprintf("%s: refused at connect (%v)", try.Name, try.ConnectErr))
			continue
		}
		if try.PutErr == nil {
			tb.Errorf("%s %s: an anonymous put of /nodes/evil was taken", addr, try.Name)
		}
		if try.GetErr == nil {
			tb.Errorf("%s %s: an anonymous get of /nodes/ was answered", addr, try.Name)
		}
		out = append(out, fmt.Sprintf("%s: put refused (%v), get refused (%v)", try.Name, try.PutErr, try.GetErr))
	}
	// Seen at the TLS layer.
	required, err := catalogprobe.TLSWithoutCertificate(addr)
	if !required {
		tb.Errorf("%s: TLS without a certificate: %v, want the certificate required", addr, err)
	}
	return append(out, fmt.Sprintf("TLS handshake without a certificate: %v", err))
}

// rawRaft posts a raft message in plaintext to an etcd peer port, as a
// forger would, and returns what came back.
func rawRaft(tb testing.TB, addr string) string {
	tb.Helper()
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close()
	_, _ = conn.Write([]byte("POST /raft HTTP/1.1\r\nHost: etcd\r\nX-Etcd-Cluster-ID: 1\r\nContent-Length: 0\r\n\r\n"))
	_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	got, _ := io.ReadAll(conn)
	if strings.HasPrefix(string(got), "HTTP/") {
		tb.Errorf("%s: a plaintext raft post was answered %q", addr, got)
	}
	return fmt.Sprintf("%q", got)
}

// The default node (`make run`'s: no flags, an embedded single member on
// loopback) keeps a cluster secret of its own in its data directory
// (0600), and its catalog answers nobody without it: an anonymous put or
// get on the client port and a raft post on the peer port get nothing. A
// client certificate derived from the node's secret gets in: the way for
// an operator's tools.
func TestDefaultNodeCatalogIsClosed(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	n := MustStartNode(t, func(c *switchyard.Config) { c.DataDir = dir })
	path := filepath.Join(dir, "cluster-secret")
	st, err := os.Stat(path)
	if err != nil {
		t.Fatalf("no secret kept in the data directory: %v", err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("%s: mode %o, want 600", path, st.Mode().Perm())
	}
	for _, line := range anonymousCatalogAccess(t, n.Catalog().ClientAddr()) {
		t.Logf("client port %s, %s", n.Catalog().ClientAddr(), line)
	}
	t.Logf("peer port %s, raft post in plaintext: %s", n.Catalog().PeerAddr(), rawRaft(t, n.Catalog().PeerAddr()))

	secret, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	files, err := catalog.WriteClientTLS(t.TempDir(), []byte(strings.TrimSpace(string(secret))), "operator")
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.LoadX509KeyPair(files.Cert, files.Key)
	if err != nil {
		t.Fatal(err)
	}
	// The member's name is not checked: its certificate proves the secret.
	tc := &tls.Config{Certificates: []tls.Certificate{pair}, InsecureSkipVerify: true}
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{"https://" + n.Catalog().ClientAddr()}, TLS: tc, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := c.Get(ctx, "/nodes/", clientv3.WithPrefix())
	if err != nil || len(res.Kvs) != 1 {
		t.Fatalf("with the secret's certificate: %v, %d node records, want 1", err, len(res.Kvs))
	}

	// A restart keeps the secret.
	_ = n.Close(context.Background())
	MustStartNode(t, func(c *switchyard.Config) { c.DataDir = dir })
	again, err := os.ReadFile(path)
	if err != nil || string(again) != string(secret) {
		t.Errorf("the secret changed across a restart: %v", err)
	}
}

// docs/running.md's local cluster (three nodes each embedding a member of one
// etcd cluster, on loopback, with a cluster secret): every member's client
// and peer ports refuse anonymous access, and a node still writes and
// routes through them.
func TestEmbeddedClusterCatalogIsClosed(t *testing.T) {
	nodes, addrs := startEmbeddedCluster(t, "a", "b", "c")
	for i, n := range nodes {
		for _, line := range anonymousCatalogAccess(t, addrs[2*i]) {
			t.Logf("%s client port %s, %s", n.Catalog().Name(), addrs[2*i], line)
		}
		t.Logf("%s peer port %s, raft post in plaintext: %s", n.Catalog().Name(), addrs[2*i+1], rawRaft(t, addrs[2*i+1]))
	}
	waitFor(t, 15*time.Second, "every node online everywhere", func() bool {
		for _, n := range nodes {
			v := clusterNodes(t, n)
			if len(v) != 3 || v["a"].State != "online" || v["b"].State != "online" || v["c"].State != "online" {
				return false
			}
		}
		return true
	})
	if _, ok := nodes[0].Catalog().Node("evil"); ok {
		t.Error("a record of node evil is in the view")
	}
}
