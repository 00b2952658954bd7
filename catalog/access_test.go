package catalog_test

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/catalog"
	"github.com/switchyard/switchyard/core"
)

// An embedded member answers no one who does not hold the cluster secret,
// on either of its ports, loopback included: a client without TLS, one
// with TLS but no certificate, one with a certificate of another secret's
// CA, and plain HTTP to the client port's etcd endpoints or to the peer
// port's raft and membership endpoints all get nothing; a client that
// presents a certificate derived from the secret reads and writes.
func TestEmbeddedMemberRefusesAnonymous(t *testing.T) {
	cfgs := clusterConfigs(t, "m1") // explicit ports, as a member of a cluster has
	a := open(t, cfgs[0])
	client, peer := a.ClientAddr(), a.PeerAddr()

	refused := func(name string, cfg clientv3.Config) {
		t.Helper()
		cfg.DialTimeout, cfg.Logger = time.Second, zap.NewNop()
		c, err := clientv3.New(cfg)
		if err != nil {
			t.Logf("%s: refused at connect: %v", name, err)
			return
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if _, err := c.Put(ctx, "/nodes/evil", `{"v":1,"peer_addr":"127.0.0.1:1","state":"online"}`); err == nil {
			t.Errorf("%s: an anonymous put was taken", name)
		} else {
			t.Logf("%s: put refused: %v", name, err)
		}
		ctx2, cancel2 := context.WithTimeout(context.Background(), time.Second)
		defer cancel2()
		if _, err := c.Get(ctx2, "/nodes/", clientv3.WithPrefix()); err == nil {
			t.Errorf("%s: an anonymous get was answered", name)
		}
	}
	otherTLS, err := catalog.DerivedClientTLS([]byte("another-cluster-secret!"), "intruder")
	if err != nil {
		t.Fatal(err)
	}
	refused("no TLS", clientv3.Config{Endpoints: []string{"http://" + client}})
	refused("TLS, no certificate", clientv3.Config{Endpoints: []string{"https://" + client}, TLS: &tls.Config{InsecureSkipVerify: true}})
	refused("another secret's certificate", clientv3.Config{Endpoints: []string{"https://" + client}, TLS: otherTLS})
	refused("the peer port, no TLS", clientv3.Config{Endpoints: []string{"http://" + peer}})

	for _, url := range []string{"http://" + client + "/health", "http://" + client + "/version", "http://" + peer + "/members", "http://" + peer + "/raft", "https://" + peer + "/members"} {
		hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
		res, err := hc.Get(url)
		if err == nil {
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			t.Errorf("GET %s: %d %q, want no answer", url, res.StatusCode, b)
		}
	}
	// What the refusal is, seen at the TLS layer: a certificate required.
	for _, addr := range []string{client, peer} {
		c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
		if err == nil {
			_ = c.SetReadDeadline(time.Now().Add(time.Second))
			_, err = c.Read(make([]byte, 1)) // TLS 1.3: the server's verdict comes after the client's Finished
			c.Close()
		}
		if err == nil || !strings.Contains(err.Error(), "certificate required") {
			t.Errorf("TLS without a certificate to %s: %v, want the server to require one", addr, err)
		} else {
			t.Logf("TLS without a certificate to %s: %v", addr, err)
		}
	}
	// Raft on the peer port, by hand: the TLS handshake ends it.
	conn, err := net.DialTimeout("tcp", peer, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = conn.Write([]byte("POST /raft HTTP/1.1\r\nHost: m\r\nContent-Length: 0\r\n\r\n"))
	_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	got, _ := io.ReadAll(conn)
	conn.Close()
	if strings.HasPrefix(string(got), "HTTP/1.1 2") {
		t.Errorf("a raft post in plaintext was answered %q", got)
	}

	// The secret's certificate gets in.
	b := open(t, catalog.Config{Name: "node-b", Endpoints: []string{"https://" + client}})
	if err := b.PublishNode(context.Background(), core.NodeInfo{State: core.StateOnline}); err != nil {
		t.Fatalf("a client with the secret: %v", err)
	}
}
