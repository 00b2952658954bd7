package switchyard

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A node given no secret makes one at its first start, keeps it (0600) and
// reads it back at the next; one that others can read is refused; a secret
// given wins.
func TestClusterSecretKeptInTheDataDir(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	cfg := Config{DataDir: filepath.Join(t.TempDir(), "node")}
	first, err := cfg.clusterSecret(log)
	if err != nil || len(first) < 32 {
		t.Fatalf("first start: %q, %v", first, err)
	}
	path := filepath.Join(cfg.DataDir, secretFile)
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("%s: %v, mode %o; want 600", path, err, st.Mode().Perm())
	}
	again, err := cfg.clusterSecret(log)
	if err != nil || string(again) != string(first) {
		t.Fatalf("second start: %q, %v; want the kept secret", again, err)
	}
	given := Config{DataDir: cfg.DataDir, ClusterSecret: "a-given-secret-of-16+"}
	if s, err := given.clusterSecret(log); err != nil || string(s) != given.ClusterSecret {
		t.Fatalf("a given secret: %q, %v", s, err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := cfg.clusterSecret(log); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("a secret others can read: %v, want refused", err)
	}
}
