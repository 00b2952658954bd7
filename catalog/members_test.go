package catalog_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/catalog"
	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/internal/tcptest"
)

// memberLine is a member list as one log line: name(id,state).
func memberLine(ms []core.Member) string {
	var parts []string
	for _, m := range ms {
		st := "voter"
		if m.Learner {
			st = "learner"
		}
		if m.Leader {
			st += ",leader"
		}
		if !m.Healthy {
			st += ",down"
		}
		parts = append(parts, m.Name+"("+m.ID+","+strings.Join(m.PeerURLs, " ")+","+st+")")
	}
	return strings.Join(parts, " ")
}

func members(t *testing.T, c *catalog.Catalog, step string) []core.Member {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ms, err := c.Members(ctx)
	if err != nil {
		t.Fatalf("%s: Members: %v", step, err)
	}
	t.Logf("members %s: %s", step, memberLine(ms))
	return ms
}

func wantCode(t *testing.T, what string, err error, code core.Code) {
	t.Helper()
	var ce *core.Error
	if !errors.As(err, &ce) || ce.Code != code {
		t.Errorf("%s: got %v, want %s", what, err, code)
	}
}

func healthyVoters(ms []core.Member) int {
	n := 0
	for _, m := range ms {
		if m.Healthy && !m.Learner {
			n++
		}
	}
	return n
}

// A member whose data directory was lost replaces its member entry when it
// starts again; one started on another peer address moves its entry; and
// the admin calls refuse what they must. (Adding a member that its node
// promotes, and removing a stopped one, run on the real binary:
// integration TestMembership.)
func TestMembership(t *testing.T) {
	ms := startCluster(t, nil, "m1", "m2", "m3")
	a := ms[0].cat
	before := members(t, a, "started")
	if len(before) != 3 || healthyVoters(before) != 3 {
		t.Fatalf("want 3 healthy voters, got %s", memberLine(before))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// Refusals, each changing nothing.
	_, err := a.RemoveMember(ctx, "m2")
	wantCode(t, "remove a running member", err, core.CodeMemberRunning)
	_, err = a.RemoveMember(ctx, "nobody")
	wantCode(t, "remove an unknown member", err, core.CodeMemberNotFound)
	_, _, err = a.AddMember(ctx, "bad name", "https://127.0.0.1:1")
	wantCode(t, "add a bad name", err, core.CodeInvalidMember)
	_, _, err = a.AddMember(ctx, "m4", "http://127.0.0.1:1")
	wantCode(t, "add a plaintext peer URL", err, core.CodeInvalidMember)
	_, _, err = a.AddMember(ctx, "m2", "https://127.0.0.1:1")
	wantCode(t, "add a name taken", err, core.CodeMemberExists)
	_, _, err = a.AddMember(ctx, "m4", "https://"+ms[1].cfg.PeerAddr)
	wantCode(t, "add a peer URL taken", err, core.CodeMemberExists)
	if got := members(t, a, "after refusals"); memberLine(got) != memberLine(before) {
		t.Errorf("refusals changed the members")
	}

	// Replace: m3 loses its data directory.
	c := ms[2]
	oldID := before[slices.IndexFunc(before, func(m core.Member) bool { return m.Name == "m3" })].ID
	if err := c.cat.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(c.cfg.Dir, "etcd")); err != nil {
		t.Fatal(err)
	}
	c.cat = openPlain(t, c.cfg)
	got := members(t, a, "m3 replaced")
	i := slices.IndexFunc(got, func(m core.Member) bool { return m.Name == "m3" })
	if len(got) != 3 || i < 0 || got[i].ID == oldID || got[i].Learner || healthyVoters(got) != 3 {
		t.Errorf("after the replacement want m3 a new healthy voter beside m1, m2, got %s (old id %s)", memberLine(got), oldID)
	}
	if err := c.cat.PublishNode(ctx, core.NodeInfo{ID: "m3", State: core.StateOnline}); err != nil {
		t.Errorf("write through the replaced member: %v", err)
	}

	// Move: m3 restarts on its data at another peer address.
	if err := c.cat.Close(ctx); err != nil {
		t.Fatal(err)
	}
	newPeer := tcptest.FreeAddrs(t, 1)[0]
	c.cfg.InitialCluster = strings.Replace(c.cfg.InitialCluster, "m3=https://"+c.cfg.PeerAddr, "m3=https://"+newPeer, 1)
	c.cfg.PeerAddr = newPeer
	c.cat = openPlain(t, c.cfg)
	got = members(t, a, "m3 moved")
	i = slices.IndexFunc(got, func(m core.Member) bool { return m.Name == "m3" })
	if i < 0 || !slices.Equal(got[i].PeerURLs, []string{"https://" + newPeer}) || healthyVoters(got) != 3 {
		t.Errorf("after the move want m3 healthy at https://%s, got %s", newPeer, memberLine(got))
	}
	if err := c.cat.PublishNode(ctx, core.NodeInfo{ID: "m3", State: core.StateOnline}); err != nil {
		t.Errorf("write through the moved member: %v", err)
	}

	// Quorum: with m2 and m3 stopped, removing m3 would leave m1 alone
	// of m1, m2.
	for _, m := range ms[1:] {
		if err := m.cat.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	_, err = a.RemoveMember(ctx, "m3")
	wantCode(t, "remove with a quorum down", err, core.CodeQuorumAtRisk)
}
