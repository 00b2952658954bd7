package catalog_test

import (
	"context"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/catalog"
	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/internal/tcptest"
)

// A node started alone, on ports chosen at start, grows as
// docs/membership.md ("Growing a node that started alone") says: its
// member list shows the ports it serves at, not port 0; adding a member is
// refused (member_address_unusable, changing nothing); restarted on its
// data with explicit addresses and --initial-cluster naming itself, it
// moves its own member entry there and then takes a learner, which joins
// and promotes itself.
func TestSingleMemberGrows(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cfg := embeddedConfig(t, "s1")
	cfg.Logger = testLogger(t).With("node", "s1")
	cfg.LeaseTTL = 6 * time.Second // see clusterConfigs
	a := openPlain(t, cfg)
	got := members(t, a, "alone on port 0")
	if len(got) != 1 || !slices.Equal(got[0].PeerURLs, []string{"https://" + a.PeerAddr()}) || !slices.Equal(got[0].ClientURLs, []string{"https://" + a.ClientAddr()}) {
		t.Errorf("want s1 at its bound ports https://%s (peer), https://%s (client), got %s %v", a.PeerAddr(), a.ClientAddr(), memberLine(got), got[0].ClientURLs)
	}
	_, _, err := a.AddMember(ctx, "s2", "https://127.0.0.1:1")
	wantCode(t, "add beside a port chosen at start", err, core.CodeMemberAddressUnusable)
	if after := members(t, a, "after the refusal"); memberLine(after) != memberLine(got) {
		t.Errorf("the refusal changed the members")
	}
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}

	// The steps: explicit addresses, --initial-cluster naming itself.
	addrs := tcptest.FreeAddrs(t, 4)
	cfg.ClientAddr, cfg.PeerAddr = addrs[0], addrs[1]
	cfg.InitialCluster = "s1=https://" + addrs[1]
	a = openPlain(t, cfg)
	t.Cleanup(func() { _ = a.Close(context.Background()) })
	got = members(t, a, "restarted at explicit addresses")
	if len(got) != 1 || !slices.Equal(got[0].PeerURLs, []string{"https://" + addrs[1]}) || !slices.Equal(got[0].ClientURLs, []string{"https://" + addrs[0]}) {
		t.Fatalf("want s1 at https://%s (peer), https://%s (client), got %s %v", addrs[1], addrs[0], memberLine(got), got[0].ClientURLs)
	}
	// A loopback member cannot take a member on another host.
	_, _, err = a.AddMember(ctx, "s2", "https://192.0.2.1:2380")
	wantCode(t, "add a non-loopback member beside a loopback one", err, core.CodeMemberAddressUnusable)

	added, _, err := a.AddMember(ctx, "s2", "https://"+addrs[3])
	if err != nil {
		t.Fatalf("add s2: %v", err)
	}
	if !added.Learner {
		t.Errorf("want s2 added as a learner, got %+v", added)
	}
	bcfg := embeddedConfig(t, "s2")
	bcfg.Logger = testLogger(t).With("node", "s2")
	bcfg.LeaseTTL = cfg.LeaseTTL
	bcfg.ClientAddr, bcfg.PeerAddr = addrs[2], addrs[3]
	bcfg.InitialCluster = cfg.InitialCluster + ",s2=https://" + addrs[3]
	bcfg.ClusterState = catalog.ClusterStateExisting
	b := openPlain(t, bcfg)
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	got = members(t, a, "s2 joined")
	if len(got) != 2 || healthyVoters(got) != 2 {
		t.Errorf("want s1, s2 two healthy voters, got %s", memberLine(got))
	}
	if err := b.PublishNode(ctx, core.NodeInfo{ID: "s2", State: core.StateOnline}); err != nil {
		t.Errorf("write through the new member: %v", err)
	}
	for _, m := range got {
		for _, u := range append(slices.Clone(m.PeerURLs), m.ClientURLs...) {
			if _, port, _ := net.SplitHostPort(strings.TrimPrefix(u, "https://")); port == "0" {
				t.Errorf("member %s lists port 0: %s", m.Name, u)
			}
		}
	}
}
