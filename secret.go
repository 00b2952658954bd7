package switchyard

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/peer"
)

// The cluster secret is what every node of a cluster proves to the others
// (the peer handshake) and what the catalog's TLS is derived from when the
// node has no cluster CA (catalog/derive.go). A node given none
// (--cluster-secret, --cluster-secret-file, SWITCHYARD_CLUSTER_SECRET)
// keeps one of its own in its data directory, made at its first start:
// so `make run` needs no flag, a restarted node keeps its secret, and the
// operator who adds a second node finds the secret to give it there. The
// members of an embedded cluster (--initial-cluster) must be given theirs:
// each making its own, they could not form one.

// secretFile is the name of the secret a node keeps in its data directory.
const secretFile = "cluster-secret"

// clusterSecret is the node's cluster secret: Config.ClusterSecret, else
// the one kept in DataDir (made and written there, 0600, if there is none).
func (c *Config) clusterSecret(log *slog.Logger) ([]byte, error) {
	if c.ClusterSecret != "" {
		return []byte(c.ClusterSecret), nil
	}
	if c.DataDir == "" {
		// A client of an external catalog with no data directory: alone,
		// with a secret for this start.
		log.Info("no --cluster-secret and no data directory: a secret for this start only; no other node can join this one's peer traffic")
		return []byte(hex.EncodeToString(randomBytes(32))), nil
	}
	path := filepath.Join(c.DataDir, secretFile)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		st, err := os.Stat(path)
		if err != nil {
			return nil, &core.ConfigError{Field: "cluster-secret", Value: path, Err: err}
		}
		if st.Mode().Perm()&0o077 != 0 {
			return nil, &core.ConfigError{Field: "cluster-secret", Value: path, Err: fmt.Errorf("is readable by others (mode %o): chmod 600 it", st.Mode().Perm())}
		}
		secret := strings.TrimSpace(string(b))
		if len(secret) < peer.MinSecretBytes {
			return nil, &core.ConfigError{Field: "cluster-secret", Value: path, Err: fmt.Errorf("holds fewer than %d bytes", peer.MinSecretBytes)}
		}
		log.Info("cluster secret: the one this node keeps in its data directory", "file", path)
		return []byte(secret), nil
	case errors.Is(err, fs.ErrNotExist):
		secret := hex.EncodeToString(randomBytes(32))
		if err := os.MkdirAll(c.DataDir, 0o700); err != nil {
			return nil, &core.ConfigError{Field: "data-dir", Value: c.DataDir, Err: err}
		}
		// O_EXCL: two nodes started on one data directory by mistake must
		// not each write a secret of their own.
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, &core.ConfigError{Field: "cluster-secret", Value: path, Err: err}
		}
		_, werr := f.WriteString(secret + "\n")
		if err := errors.Join(werr, f.Sync(), f.Close()); err != nil {
			return nil, &core.ConfigError{Field: "cluster-secret", Value: path, Err: err}
		}
		log.Info("no --cluster-secret: made one and keeps it in the data directory; give it to every node that joins this one (--cluster-secret-file)", "file", path)
		return []byte(secret), nil
	default:
		return nil, &core.ConfigError{Field: "cluster-secret", Value: path, Err: err}
	}
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return b
}
