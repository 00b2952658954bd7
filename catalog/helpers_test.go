package catalog_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/switchyard/switchyard/catalog"
	"github.com/switchyard/switchyard/internal/ticktest"
)

// testLogger writes the catalog's logs, debug included, to the test's
// output, where they show with -v or when the test fails.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// testSecret is the cluster secret of the tests' catalogs: an embedded
// member derives its TLS from it, a client of one its certificate.
var testSecret = []byte("catalog-test-cluster-secret")

// open opens a catalog (with testSecret unless cfg has a secret) and
// closes it when the test ends.
func open(t *testing.T, cfg catalog.Config) *catalog.Catalog {
	t.Helper()
	if cfg.Secret == nil {
		cfg.Secret = testSecret
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t).With("node", cfg.Name)
	}
	c := openPlain(t, cfg)
	t.Cleanup(func() {
		if err := c.Close(context.Background()); err != nil {
			t.Errorf("Close(%s): %v", cfg.Name, err)
		}
	})
	return c
}

// openPlain opens a catalog on cfg as given, within 30s, and logs how long
// Open took; the caller closes it (a cluster's member: the cluster's
// cleanup). A member's restart on its data directory opens it so.
func openPlain(t *testing.T, cfg catalog.Config) *catalog.Catalog {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	c, err := catalog.Open(ctx, cfg)
	if err != nil {
		t.Fatalf("Open(%s): %v", cfg.Name, err)
	}
	t.Logf("Open(%s) took %v", cfg.Name, time.Since(start).Round(time.Millisecond))
	return c
}

// embeddedConfig is a fast, test-only embedded configuration.
func embeddedConfig(t *testing.T, name string) catalog.Config {
	return catalog.Config{
		Name:          name,
		Dir:           t.TempDir(),
		FastElection:  true,
		UnsafeNoFsync: true,
		LeaseTTL:      2 * time.Second,
		Secret:        testSecret,
	}
}

// eventually polls cond until it holds, failing the test after within,
// and returns how long it took.
var eventually = ticktest.WaitFor
