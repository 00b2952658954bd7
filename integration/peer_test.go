package integration_test

import (
	"context"
	"encoding/json"
	"net"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/catalog"
	"github.com/switchyard/switchyard/core"
)

const testSecret = "integration-cluster-secret"

type clusterNode struct {
	ID        string `json:"id"`
	State     string `json:"state"`
	PeerAddr  string `json:"peer_addr"`
	Suspected bool   `json:"suspected"`
}

func clusterNodes(tb testing.TB, n *switchyard.Node) map[string]clusterNode {
	tb.Helper()
	var body struct{ Nodes []clusterNode }
	// An admin of the access tests' keys: ignored by a node without keys.
	res := keyed(tb, context.Background(), "GET", baseURL(n)+"/v1/cluster/nodes", keyRoot, "", "")
	if b := readBody(tb, res); res.StatusCode != 200 || json.Unmarshal(b, &body) != nil {
		tb.Fatalf("GET /v1/cluster/nodes: %d %s", res.StatusCode, b)
	}
	out := map[string]clusterNode{}
	for _, cn := range body.Nodes {
		out[cn.ID] = cn
	}
	return out
}

// joinNode starts a node that uses first's embedded etcd as its catalog.
func joinNode(tb testing.TB, first *switchyard.Node, name, secret string) *switchyard.Node {
	files := catalogClientTLS(tb, name, secret)
	return MustStartNode(tb, func(c *switchyard.Config) {
		c.Name, c.ClusterSecret = name, secret
		c.EtcdEndpoints = []string{"https://" + first.Catalog().ClientAddr()}
		c.PeerHeartbeatInterval, c.PeerFailureThreshold = 100*time.Millisecond, 3
		if files != nil {
			c.EtcdTLSCert, c.EtcdTLSKey, c.EtcdTLSCA = files.Cert, files.Key, files.CA
		}
	})
}

// catalogClientTLS is, for a node whose peer secret is not testSecret (the
// catalog's, from which its TLS derives), a client certificate of the
// catalog, so that it still reaches the catalog; nil for testSecret.
func catalogClientTLS(tb testing.TB, name, secret string) *catalog.TLSFiles {
	tb.Helper()
	if secret == testSecret {
		return nil
	}
	files, err := catalog.WriteClientTLS(tb.TempDir(), []byte(testSecret), name)
	if err != nil {
		tb.Fatal(err)
	}
	return files
}

// Three nodes sharing one catalog and one cluster secret see each other
// online with their peer addresses; a node whose peer port stops answering
// turns spare in the others' views within about threshold x interval; a
// node with the wrong secret is spare both ways and its pings are counted
// as authentication failures; a node that left is not listed at all.
func TestPeersSeeEachOther(t *testing.T) {
	n1 := MustStartNode(t, func(c *switchyard.Config) {
		c.Name, c.ClusterSecret = "n1", testSecret
		c.PeerHeartbeatInterval, c.PeerFailureThreshold = 100*time.Millisecond, 3
	})

	// n2's record as etcd sees every write of it, from before it starts.
	wctx, stopWatch := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var mu sync.Mutex
	var n2States []string
	watch := n1.Catalog().Client().Watch(wctx, catalog.NodeKey("n2"), clientv3.WithCreatedNotify())
	<-watch // created: nothing written before this is missed
	wg.Go(func() {
		for wr := range watch {
			for _, ev := range wr.Events {
				var rec struct{ State string }
				if ev.Type == clientv3.EventTypePut && json.Unmarshal(ev.Kv.Value, &rec) == nil {
					mu.Lock()
					n2States = append(n2States, rec.State)
					mu.Unlock()
				}
			}
		}
	})
	defer func() { stopWatch(); wg.Wait() }()

	n2 := joinNode(t, n1, "n2", testSecret)
	n3 := joinNode(t, n1, "n3", testSecret)
	nodes := []*switchyard.Node{n1, n2, n3}
	names := []string{"n1", "n2", "n3"}

	for _, n := range nodes {
		waitFor(t, 10*time.Second, "every node online in "+n.Catalog().Name()+"'s view", func() bool {
			view := clusterNodes(t, n)
			for i, want := range nodes {
				got, ok := view[names[i]]
				if !ok || got.State != "online" || got.PeerAddr != want.PeerAddr() {
					return false
				}
			}
			return len(view) == 3
		})
	}
	for i, n := range nodes {
		// Every other node pinged this one, authenticated.
		waitFor(t, 5*time.Second, names[i]+" pinged", func() bool {
			return metric(t, n, "switchyard_peer_messages_total", map[string]string{"kind": "ping"}) >= 2
		})
		if got := metric(t, n, "switchyard_peer_auth_failures_total", nil); got != 0 {
			t.Errorf("%s: %v auth failures among nodes sharing a secret", names[i], got)
		}
	}
	waitFor(t, 5*time.Second, "n2's writes seen", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(n2States) >= 2
	})
	mu.Lock()
	if len(n2States) != 2 || n2States[0] != "in_progress" || n2States[1] != "online" {
		t.Errorf("n2's record went %v, want [in_progress online]", n2States)
	}
	mu.Unlock()

	// n3's peer port goes dead: its record now names a port nobody serves.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	_ = ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n3.Catalog().PublishNode(ctx, core.NodeInfo{
		ID: "n3", PeerAddr: dead, HTTPAddr: n3.HTTPAddr(), GRPCAddr: n3.GRPCAddr(), State: core.StateOnline,
	}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for _, n := range []*switchyard.Node{n1, n2} {
		waitFor(t, 5*time.Second, "n3 spare", func() bool {
			v := clusterNodes(t, n)
			return v["n3"].State == "spare" && v["n3"].PeerAddr == dead
		})
		// Its record stands: spare here is this node's suspicion.
		if v := clusterNodes(t, n); v["n1"].State != "online" || v["n2"].State != "online" || !v["n3"].Suspected || v["n1"].Suspected || v["n2"].Suspected {
			t.Errorf("answering nodes not online, or the suspicion not on n3 alone: %+v", v)
		}
		if got := metric(t, n, "switchyard_peer_state", map[string]string{"node": "n3", "state": "spare"}); got != 1 {
			t.Errorf("switchyard_peer_state{node=n3,state=spare} = %v", got)
		}
	}
	t.Logf("n3 spare in both views after %s (threshold x interval = 300ms)", time.Since(start))
	if got := clusterNodes(t, n3)["n3"]; got.State != "online" || got.Suspected {
		t.Errorf("n3 in its own view: %+v, want online (its record), unsuspected", got)
	}

	// A node with another secret: nobody accepts its pings, it accepts
	// nobody's.
	before := metric(t, n1, "switchyard_peer_auth_failures_total", nil)
	n4 := joinNode(t, n1, "n4", "another-cluster-secret!")
	waitFor(t, 5*time.Second, "n4 spare in n1's view", func() bool { return clusterNodes(t, n1)["n4"].State == "spare" })
	waitFor(t, 5*time.Second, "n1 spare in n4's view", func() bool { return clusterNodes(t, n4)["n1"].State == "spare" })
	if got := metric(t, n1, "switchyard_peer_auth_failures_total", nil); got <= before {
		t.Errorf("n1 counted no auth failures for n4's pings")
	}

	// n4 leaves: its record goes with its lease, and so does its line.
	cctx, ccancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer ccancel()
	if err := n4.Close(cctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "n4 gone from n1's view", func() bool {
		_, ok := clusterNodes(t, n1)["n4"]
		return !ok
	})
}
