package integration_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/worker"
)

// startAuthEtcd starts an etcd that stands for an external one: its own
// process's member, plaintext on loopback, with authentication on, a root
// user, and the role docs/cluster.md ("An external etcd") says a node
// needs, granted to user "switchyard". It returns the client URL.
func startAuthEtcd(t *testing.T) string {
	t.Helper()
	cfg := embed.NewConfig()
	cfg.Dir = t.TempDir()
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.UnsafeNoFsync = true
	// bcrypt's lowest cost: a login under the race detector at etcd's
	// default cost takes seconds, which is the test's time, not the node's.
	cfg.BcryptCost = 4
	u, _ := url.Parse("http://127.0.0.1:0")
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*u}, []url.URL{*u}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*u}, []url.URL{*u}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(20 * time.Second):
		t.Fatal("etcd not ready")
	}
	endpoint := "http://" + e.Clients[0].Addr().String()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	steps := []func() error{
		func() error { _, err := c.UserAdd(ctx, "root", "root-password"); return err },
		func() error { _, err := c.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := c.RoleAdd(ctx, "switchyard"); return err },
	}
	for _, prefix := range []string{"/nodes/", "/q/", "/idem/"} {
		steps = append(steps, func() error {
			_, err := c.RoleGrantPermission(ctx, "switchyard", prefix, clientv3.GetPrefixRangeEnd(prefix), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		})
	}
	steps = append(steps,
		func() error { _, err := c.UserAdd(ctx, "switchyard", "switchyard-password"); return err },
		func() error { _, err := c.UserGrantRole(ctx, "switchyard", "switchyard"); return err },
		func() error { _, err := c.UserAdd(ctx, "nobody", "nobody-password"); return err },
		func() error { _, err := c.AuthEnable(ctx); return err },
	)
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("etcd setup step %d: %v", i, err)
		}
	}
	return endpoint
}

// Nodes run on an external etcd with authentication on, as the user of
// the documented role and nothing more: they register, see each other and
// run a job across each other. Without credentials, or as a user without
// the role, a node does not start, and says why.
func TestExternalEtcdWithTheDocumentedRole(t *testing.T) {
	endpoint := startAuthEtcd(t)
	on := func(name string) func(*switchyard.Config) {
		return func(c *switchyard.Config) {
			c.Name, c.ClusterSecret = name, testSecret
			c.EtcdEndpoints = []string{endpoint}
			c.EtcdUsername, c.EtcdPassword = "switchyard", "switchyard-password"
			c.PeerHeartbeatInterval, c.PeerFailureThreshold = 100*time.Millisecond, 5
		}
	}
	a := MustStartNode(t, on("xa"))
	b := MustStartNode(t, on("xb"))
	for _, n := range []*switchyard.Node{a, b} {
		waitFor(t, 10*time.Second, "both nodes online in "+n.Catalog().Name()+"'s view", func() bool {
			v := clusterNodes(t, n)
			return len(v) == 2 && v["xa"].State == "online" && v["xb"].State == "online"
		})
	}
	MustStartWorker(t, b, worker.Config{Name: "wb", Queue: "ext"}, named("wb"))
	waitFor(t, 10*time.Second, "a sees b's worker", func() bool { return len(a.Catalog().Consumers("ext")) == 1 })
	if code, who := resultOf(t, a, "ext", `{"ttl_ms":20000,"input":"x"}`); code != 200 || who != "wb" {
		t.Fatalf("a job from xa: %d %q, want run by wb on xb", code, who)
	}

	for _, tc := range []struct{ name, user, password string }{
		{"no credentials", "", ""},
		{"a user without the role", "nobody", "nobody-password"},
		{"a wrong password", "switchyard", "wrong"},
	} {
		cfg := switchyard.DefaultConfig()
		on("xc")(&cfg)
		cfg.EtcdUsername, cfg.EtcdPassword = tc.user, tc.password
		cfg.HTTPAddr, cfg.GRPCAddr, cfg.DataDir = "127.0.0.1:0", "127.0.0.1:0", t.TempDir()
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		n, err := switchyard.Open(ctx, cfg)
		cancel()
		if err == nil {
			_ = n.Close(context.Background())
			t.Errorf("%s: the node started", tc.name)
			continue
		}
		t.Logf("%s: %v", tc.name, err)
	}
}
