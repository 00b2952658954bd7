package catalog_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/catalog"
)

// TestEmbeddedClusterPeersOnEveryInterface: members whose peer listener
// binds every interface (0.0.0.0:port) form their cluster, each
// advertising its InitialCluster entry, never the unspecified address.
func TestEmbeddedClusterPeersOnEveryInterface(t *testing.T) {
	ms := startCluster(t, func(c *catalog.Config) {
		_, port, _ := net.SplitHostPort(c.PeerAddr)
		c.PeerAddr = "0.0.0.0:" + port
	}, "m1", "m2", "m3")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := ms[0].cat.Client().MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, entry := range strings.Split(ms[0].cfg.InitialCluster, ",") {
		name, u, _ := strings.Cut(entry, "=")
		want[name] = u
	}
	for _, m := range resp.Members {
		if len(m.PeerURLs) != 1 || m.PeerURLs[0] != want[m.Name] {
			t.Errorf("member %s advertises %v, want its entry %s", m.Name, m.PeerURLs, want[m.Name])
		}
	}
	if len(resp.Members) != 3 {
		t.Fatalf("%d members, want 3", len(resp.Members))
	}
	t.Logf("members bound on 0.0.0.0 advertise %v", want)
}
