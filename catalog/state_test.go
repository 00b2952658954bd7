package catalog

import (
	"os"
	"path/filepath"
	"testing"
)

// The state a member logs is the one it starts in: a member restarted on
// its data directory restarts on its write-ahead log, whatever
// ClusterState says.
func TestClusterStateLogged(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, ClusterState: ClusterStateNew}
	if got := clusterState(cfg); got != ClusterStateNew {
		t.Fatalf("empty data directory: %q, want new", got)
	}
	wal := filepath.Join(dir, "etcd", "member", "wal")
	if err := os.MkdirAll(wal, 0o700); err != nil {
		t.Fatal(err)
	}
	if got := clusterState(cfg); got != ClusterStateNew {
		t.Fatalf("empty wal directory: %q, want new", got)
	}
	if err := os.WriteFile(filepath.Join(wal, "0000000000000000-0000000000000000.wal"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := clusterState(cfg); got != "existing (restarted on existing data)" {
		t.Fatalf("a write-ahead log: %q, want existing", got)
	}
}
