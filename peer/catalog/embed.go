package catalog

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// startEmbedded starts the single-member etcd in cfg.Dir/etcd and waits,
// bounded by ctx, until it serves. On any failure the member is closed.
func startEmbedded(ctx context.Context, cfg Config) (*embed.Etcd, error) {
	ec := embed.NewConfig()
	ec.Name = cfg.Name
	ec.Dir = filepath.Join(cfg.Dir, "etcd")
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	ec.LogLevel = "error"
	ec.UnsafeNoFsync = cfg.UnsafeNoFsync
	if cfg.FastElection {
		ec.TickMs, ec.ElectionMs = 10, 100
	}
	curl := url.URL{Scheme: "http", Host: cfg.ClientAddr}
	purl := url.URL{Scheme: "http", Host: cfg.PeerAddr}
	ec.ListenClientUrls = []url.URL{curl}
	ec.AdvertiseClientUrls = []url.URL{curl}
	ec.ListenPeerUrls = []url.URL{purl}
	ec.AdvertisePeerUrls = []url.URL{purl}
	ec.InitialCluster = ec.InitialClusterFromName(ec.Name)
	ec.InitialClusterToken = "switchyard"
	// Every put of a leased record adds a revision; without compaction the
	// member's database grows for as long as the node runs. An hour of
	// history is far more than a watcher ever needs to catch up (one that
	// falls further behind reloads, see watchLoop).
	ec.AutoCompactionMode = embed.CompactorModePeriodic
	ec.AutoCompactionRetention = "1h"

	e, err := embed.StartEtcd(ec)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd in %s: %w", ec.Dir, err)
	}
	select {
	case <-e.Server.ReadyNotify():
		return e, nil
	case <-e.Server.StopNotify():
		e.Close()
		return nil, fmt.Errorf("start embedded etcd in %s: server stopped before it was ready", ec.Dir)
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("start embedded etcd in %s: %w", ec.Dir, err)
	case <-ctx.Done():
		e.Close()
		return nil, fmt.Errorf("start embedded etcd in %s: %w", ec.Dir, ctx.Err())
	}
}
