package catalog_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/catalog"
	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/internal/tcptest"
)

func TestFenceDeadline(t *testing.T) {
	sent := time.Now()
	for _, tc := range []struct {
		name        string
		ttl, margin time.Duration
		want        time.Duration // after sent
	}{
		{"default margin", 5 * time.Second, 5 * time.Second / 3, 5*time.Second - 5*time.Second/3},
		{"one second margin", 5 * time.Second, time.Second, 4 * time.Second},
		{"zero margin fences at the earliest expiry", 2 * time.Second, 0, 2 * time.Second},
		{"negative margin is treated as zero", 2 * time.Second, -time.Second, 2 * time.Second},
		{"margin equal to ttl fences at once", 2 * time.Second, 2 * time.Second, 0},
		{"margin above ttl fences at once", 2 * time.Second, 3 * time.Second, 0},
	} {
		got := catalog.FenceDeadline(sent, tc.ttl, tc.margin)
		if d := got.Sub(sent); d != tc.want {
			t.Errorf("%s: FenceDeadline(sent, %v, %v) = sent+%v, want sent+%v", tc.name, tc.ttl, tc.margin, d, tc.want)
		}
		// Never later than the earliest instant the lease can expire.
		if got.After(sent.Add(tc.ttl)) {
			t.Errorf("%s: deadline after sent+ttl", tc.name)
		}
	}
}

// TestLeaseLostOnOutsideRevoke: a lease revoked behind the node's back (as
// etcd has done to live holders) fences it at its next renewal.
func TestLeaseLostOnOutsideRevoke(t *testing.T) {
	cfg := embeddedConfig(t, "node-a")
	cfg.LeaseTTL = 3 * time.Second // renewals every 1s
	c := open(t, cfg)
	ctx := context.Background()
	if err := c.PublishConsumer(ctx, core.ConsumerInfo{ID: "w1", Queue: "jobs"}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := c.Client().Revoke(ctx, c.LeaseID()); err != nil {
		t.Fatalf("Revoke: %v", err)
	}
	select {
	case <-c.LeaseLost():
		t.Logf("LeaseLost closed %v after an outside revoke (renewal interval 1s)", time.Since(start).Round(time.Millisecond))
	case <-time.After(2 * time.Second):
		t.Fatal("LeaseLost not closed within 2s of an outside revoke")
	}
	eventually(t, time.Second, "revoked records gone", func() bool { return c.Consumers("jobs") == nil })
	if err := c.PublishConsumer(ctx, core.ConsumerInfo{ID: "w1", Queue: "jobs"}); !errors.Is(err, catalog.ErrLeaseLost) {
		t.Fatalf("PublishConsumer after LeaseLost = %v, want ErrLeaseLost", err)
	}
}

// TestFenceBeforeExpiry cuts a node off from etcd without stopping etcd: the
// node must fence itself before its records vanish from everyone else's view,
// which is what makes their vanishing proof that it stopped.
func TestFenceBeforeExpiry(t *testing.T) {
	a := open(t, embeddedConfig(t, "node-a"))
	p := tcptest.NewRelay(t, a.ClientAddr())
	b := open(t, catalog.Config{
		Name:           "node-b",
		Endpoints:      []string{"https://" + p.Addr},
		LeaseTTL:       2 * time.Second,
		RequestTimeout: 500 * time.Millisecond,
	})
	ctx := context.Background()
	if err := b.PublishNode(ctx, core.NodeInfo{State: core.StateOnline}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "a sees node-b", func() bool { _, ok := a.Node("node-b"); return ok })

	cut := time.Now()
	p.Close()
	var fenced, expired time.Duration
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-b.LeaseLost()
		fenced = time.Since(cut)
	}()
	expired = eventually(t, 10*time.Second, "node-b's record expires in a's view", func() bool { _, ok := a.Node("node-b"); return !ok })
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("node-b never fenced")
	}
	t.Logf("after the cut: node-b fenced at %v, its record left a's view at %v (TTL 2s, margin %v, so fence ≤ %v after the last renewal)",
		fenced.Round(time.Millisecond), expired.Round(time.Millisecond), 2*time.Second/3, 2*time.Second-2*time.Second/3)
	if fenced >= expired {
		t.Fatalf("node-b fenced %v after the cut, but its lease had expired for others by %v", fenced, expired)
	}
	if limit := 2*time.Second - 2*time.Second/3 + 200*time.Millisecond; fenced > limit {
		t.Errorf("fenced %v after the cut, want within TTL-margin (+slack) = %v", fenced, limit)
	}
}

func TestConfigValidate(t *testing.T) {
	ok := catalog.Config{Name: "n1", Dir: "/tmp/x", Secret: testSecret}
	ext := catalog.Config{Name: "n1", Endpoints: []string{"http://127.0.0.1:2379"}}
	for _, tc := range []struct {
		name      string
		mod       func(c *catalog.Config)
		base      catalog.Config
		wantField string // "" = valid
	}{
		{name: "embedded defaults", base: ok},
		{name: "external defaults", base: ext},
		{name: "everything set", base: ok, mod: func(c *catalog.Config) {
			c.ClientAddr, c.PeerAddr = "127.0.0.1:2379", "127.0.0.1:2380"
			c.LeaseTTL, c.FenceMargin = 10*time.Second, 2*time.Second
			c.UnsafeNoFsync, c.FastElection = true, true
		}},
		{name: "no name", base: ok, mod: func(c *catalog.Config) { c.Name = "" }, wantField: "Name"},
		{name: "name with slash", base: ok, mod: func(c *catalog.Config) { c.Name = "a/b" }, wantField: "Name"},
		{name: "no dir", base: ok, mod: func(c *catalog.Config) { c.Dir = "" }, wantField: "Dir"},
		{name: "embedded, neither TLS nor a secret", base: ok, mod: func(c *catalog.Config) { c.Secret = nil }, wantField: "Secret"},
		{name: "bad client addr", base: ok, mod: func(c *catalog.Config) { c.ClientAddr = "localhost" }, wantField: "ClientAddr"},
		{name: "bad peer addr", base: ok, mod: func(c *catalog.Config) { c.PeerAddr = "::1" }, wantField: "PeerAddr"},
		{name: "empty endpoint", base: ext, mod: func(c *catalog.Config) { c.Endpoints = append(c.Endpoints, "") }, wantField: "Endpoints"},
		{name: "embedded-only fields are ignored with endpoints", base: ext, mod: func(c *catalog.Config) {
			c.Dir, c.ClientAddr, c.PeerAddr = "/tmp/x", "not an address", "127.0.0.1:0"
			c.UnsafeNoFsync, c.FastElection = true, true
		}},
		{name: "ttl below a second", base: ok, mod: func(c *catalog.Config) { c.LeaseTTL = 500 * time.Millisecond }, wantField: "LeaseTTL"},
		{name: "ttl not whole seconds", base: ok, mod: func(c *catalog.Config) { c.LeaseTTL = 2500 * time.Millisecond }, wantField: "LeaseTTL"},
		{name: "negative ttl", base: ok, mod: func(c *catalog.Config) { c.LeaseTTL = -time.Second }, wantField: "LeaseTTL"},
		{name: "negative margin", base: ok, mod: func(c *catalog.Config) { c.FenceMargin = -time.Second }, wantField: "FenceMargin"},
		{name: "margin equal to ttl", base: ok, mod: func(c *catalog.Config) { c.FenceMargin = catalog.DefaultLeaseTTL }, wantField: "FenceMargin"},
		{name: "negative dial timeout", base: ext, mod: func(c *catalog.Config) { c.DialTimeout = -1 }, wantField: "DialTimeout"},
		{name: "negative request timeout", base: ok, mod: func(c *catalog.Config) { c.RequestTimeout = -1 }, wantField: "RequestTimeout"},
	} {
		cfg := tc.base
		cfg.Endpoints = append([]string(nil), tc.base.Endpoints...)
		if tc.mod != nil {
			tc.mod(&cfg)
		}
		before := cfg.LeaseTTL
		err := cfg.Validate()
		if cfg.LeaseTTL != before {
			t.Errorf("%s: Validate modified the config", tc.name)
		}
		wantValidate(t, tc.name, err, tc.wantField)
	}
}

// wantValidate checks err, what Validate said of the case name: nil when
// wantField is "", else an error naming wantField (logged).
func wantValidate(t *testing.T, name string, err error, wantField string) {
	t.Helper()
	switch {
	case wantField == "" && err != nil:
		t.Errorf("%s: Validate() = %v, want nil", name, err)
	case wantField != "" && err == nil:
		t.Errorf("%s: Validate() = nil, want an error naming %s", name, wantField)
	case wantField != "" && !containsField(err.Error(), wantField):
		t.Errorf("%s: Validate() = %q, want it to name %s", name, err, wantField)
	case err != nil:
		t.Logf("%s: %v", name, err)
	}
}

func containsField(msg, field string) bool {
	return strings.Contains(msg, ": "+field+": ")
}
