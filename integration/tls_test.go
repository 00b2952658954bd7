package integration_test

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/internal/grpctest"
	"github.com/switchyard/switchyard/internal/syncbuf"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
	"github.com/switchyard/switchyard/worker"
)

// The public ports over TLS: a client that trusts the test CA streams a job
// over HTTP/2, and a worker connects over gRPC with TLS; a plaintext client
// is refused on both ports, and so is one that does not trust the CA; a
// renewed certificate is served without a restart.
func TestTLSPublicPorts(t *testing.T) {
	ca := mustCA(t, "public")
	cert, key := ca.issue(t, "node")
	n := MustStartNode(t, func(c *switchyard.Config) { c.TLSCert, c.TLSKey = cert, key })
	MustStartWorker(t, n, worker.Config{Queue: "demo", DialOptions: []grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(ca.clientTLS(t, "")))}}, worker.Tokens(0))
	url := "https://" + n.HTTPAddr() + "/v1/queues/demo/jobs"

	tr := &http.Transport{TLSClientConfig: ca.clientTLS(t, ""), ForceAttemptHTTP2: true}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr}
	req, _ := http.NewRequestWithContext(t.Context(), "POST", url, strings.NewReader(`{"input":"over tls","ttl_ms":10000}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	res, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	evs := readAll(t, res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || res.Proto != "HTTP/2.0" || evs[len(evs)-1].Type != "done" {
		t.Fatalf("a job over TLS: %d %s %v", res.StatusCode, res.Proto, types(evs))
	}

	// Plaintext HTTP to the TLS port: the server answers 400 and runs
	// nothing. A client that does not trust the CA gives up on the
	// handshake.
	plain, err := http.Post("http://"+n.HTTPAddr()+"/v1/queues/demo/jobs", "application/json", strings.NewReader(`{"input":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, plain); plain.StatusCode != 400 || !strings.Contains(string(body), "HTTPS") {
		t.Errorf("plaintext HTTP: %d %s", plain.StatusCode, body)
	}
	if _, err := http.Post(url, "application/json", strings.NewReader(`{"input":"x"}`)); err == nil {
		t.Error("a client without the CA completed a handshake")
	}
	// Plaintext gRPC to the TLS port.
	conn := grpctest.Dial(t, n.GRPCAddr())
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	if _, err := pb.NewJobServiceClient(conn).Get(ctx, &pb.GetJobRequest{JobId: "j_x"}); err == nil || grpcAnswer(err).code != "" {
		t.Errorf("plaintext gRPC reached the service: %v", err)
	}

	// Renewed in place: new connections get the new certificate.
	serial := func() int64 {
		c, err := tls.Dial("tcp", n.HTTPAddr(), ca.clientTLS(t, ""))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
	}
	before := serial()
	ca.issue(t, "node")
	waitFor(t, 5*time.Second, "the renewed certificate served", func() bool { return serial() != before })
}

// Peer mutual TLS from a cluster CA, and the embedded etcd member behind
// the same CA: two nodes with certificates of the cluster CA route a job
// between them (the second reaches the first's etcd member over https with
// its certificate); a client without a certificate is refused by the
// member; a node whose certificate another CA signed is refused on the
// peer port, the refusal logged, and stays spare.
func TestPeerMutualTLS(t *testing.T) {
	t.Parallel()
	ca := mustCA(t, "cluster")
	var logs syncbuf.Buffer
	n1 := MustStartNode(t, func(c *switchyard.Config) {
		c.Name, c.ClusterSecret = "n1", testSecret
		c.PeerTLSCert, c.PeerTLSKey = ca.issue(t, "n1")
		c.PeerTLSCA = ca.CAFile
		c.PeerHeartbeatInterval, c.PeerFailureThreshold = 100*time.Millisecond, 3
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	etcd := "https://" + n1.Catalog().ClientAddr()
	n2 := MustStartNode(t, func(c *switchyard.Config) {
		c.Name, c.ClusterSecret = "n2", testSecret
		c.PeerTLSCert, c.PeerTLSKey = ca.issue(t, "n2")
		c.PeerTLSCA = ca.CAFile
		c.EtcdEndpoints = []string{etcd}
		c.PeerHeartbeatInterval, c.PeerFailureThreshold = 100*time.Millisecond, 3
	})
	for _, n := range []*switchyard.Node{n1, n2} {
		waitFor(t, 10*time.Second, "both nodes online", func() bool {
			v := clusterNodes(t, n)
			return v["n1"].State == "online" && v["n2"].State == "online"
		})
	}
	MustStartWorker(t, n2, worker.Config{Name: "w2", Queue: "mtls"}, named("w2"))
	waitFor(t, 10*time.Second, "n1 sees n2 dispatching", func() bool { return dispatcherOf(n1, "mtls") == "n2" })
	if code, who := resultOf(t, n1, "mtls", `{"ttl_ms":10000,"input":"x"}`); code != 200 || who != "w2" {
		t.Fatalf("a job across mutual TLS: %d %q", code, who)
	}

	// The etcd member: the cluster CA's certificate in, no certificate out.
	etcdGet := func(tc *tls.Config) error {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd}, TLS: tc, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return err
		}
		defer cli.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		_, err = cli.Get(ctx, "/nodes/", clientv3.WithPrefix())
		return err
	}
	if err := etcdGet(ca.clientTLS(t, "etcd-client")); err != nil {
		t.Fatalf("etcd with the cluster's certificate: %v", err)
	}
	if err := etcdGet(ca.clientTLS(t, "")); err == nil {
		t.Fatal("etcd answered a client without a certificate")
	}
	if err := etcdGet(mustCA(t, "stranger").clientTLS(t, "stranger")); err == nil {
		t.Fatal("etcd answered a client whose certificate another CA signed")
	}
	// The peer port to a plaintext client: no handshake, no answer.
	pconn := grpctest.Dial(t, n1.PeerAddr())
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	if _, err := pb.NewPeerServiceClient(pconn).Ping(ctx, &pb.PingRequest{}); err == nil {
		t.Error("the peer port answered a plaintext client")
	}

	// A node whose certificate another CA signed. It trusts the cluster's
	// CA besides its own (so it gets past n1's server certificate and
	// presents its own), and its catalog access is right: it is n1's peer
	// port that refuses it.
	other := mustCA(t, "other")
	etcdCert, etcdKey := ca.issue(t, "n3-etcd")
	both := filepath.Join(t.TempDir(), "both-ca.pem")
	if err := os.WriteFile(both, append(mustRead(t, other.CAFile), mustRead(t, ca.CAFile)...), 0o600); err != nil {
		t.Fatal(err)
	}
	n3 := MustStartNode(t, func(c *switchyard.Config) {
		c.Name, c.ClusterSecret = "n3", testSecret
		c.PeerTLSCert, c.PeerTLSKey = other.issue(t, "n3")
		c.PeerTLSCA = both
		c.EtcdEndpoints = []string{etcd}
		c.EtcdTLSCert, c.EtcdTLSKey, c.EtcdTLSCA = etcdCert, etcdKey, ca.CAFile
		c.PeerHeartbeatInterval, c.PeerFailureThreshold = 100*time.Millisecond, 3
	})
	waitFor(t, 10*time.Second, "n1 refusing n3's certificate, in its log", func() bool {
		return strings.Contains(logs.String(), "peer TLS: a client certificate was refused")
	})
	waitFor(t, 10*time.Second, "n3 spare in n1's view", func() bool { return clusterNodes(t, n1)["n3"].State == "spare" })
	// n3 finds n1 refusing it by its own pings, on its own clock.
	waitFor(t, 10*time.Second, "n1 spare in n3's view", func() bool { return clusterNodes(t, n3)["n1"].State == "spare" })
	if line := refusalLine(logs.String()); !strings.Contains(line, "CN=n3, issued by CN=other") {
		t.Errorf("the refusal does not say whose certificate: %s", line)
	}
}

func refusalLine(logs string) string {
	for l := range strings.Lines(logs) {
		if strings.Contains(l, "client certificate was refused") {
			return l
		}
	}
	return ""
}

func mustRead(tb testing.TB, path string) []byte {
	tb.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}
