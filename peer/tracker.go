package peer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/switchyard/switchyard/core"
)

// View is the catalog as the tracker reads it: the watched node records.
type View interface {
	Nodes() []core.NodeInfo
}

// TrackerConfig is what a Tracker needs.
type TrackerConfig struct {
	// Self is this node's id: it is never pinged.
	Self string
	// Interval is how often every other node is pinged; each ping may take
	// at most this long.
	Interval time.Duration
	// Threshold is how many pings in a row a node may miss before it is
	// spare in this node's view.
	Threshold int
	View      View
	Client    *Client
	Metrics   *Metrics
	Logger    *slog.Logger
	// OnChange, if set, is called (on the tracker's goroutine, holding
	// none of its locks) after a round in which a node turned spare or
	// answered again: a node acts on a peer's silence at once, not at its
	// next tick.
	OnChange func()
}

// Tracker pings every other node in the catalog view each interval and
// keeps this node's verdict on them: a node whose record says online (or
// in_progress) but that missed Threshold pings in a row is spare here. It
// is one node's opinion, never written to the catalog: a node's record is
// written only by that node, and its lease is the cluster's proof of death.
type Tracker struct {
	cfg TrackerConfig

	mu     sync.Mutex
	misses map[string]miss // by node id
	shown  map[string]bool // nodes with a state in the metrics
}

// miss counts consecutive failed pings to a node at one address: a node
// that moved starts afresh.
type miss struct {
	addr string
	n    int
}

// NewTracker returns a tracker; Run starts it.
func NewTracker(cfg TrackerConfig) (*Tracker, error) {
	switch {
	case cfg.Interval <= 0:
		return nil, &core.ConfigError{Field: "peer-heartbeat-interval", Value: cfg.Interval, Err: errors.New("must be positive")}
	case cfg.Threshold < 1:
		return nil, &core.ConfigError{Field: "peer-failure-threshold", Value: cfg.Threshold, Err: errors.New("must be at least 1")}
	case cfg.View == nil || cfg.Client == nil:
		return nil, errors.New("peer tracker: View and Client are required")
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Tracker{cfg: cfg, misses: map[string]miss{}, shown: map[string]bool{}}, nil
}

// Run pings at once, then every interval, until ctx ends.
func (t *Tracker) Run(ctx context.Context) {
	tick := time.NewTicker(t.cfg.Interval)
	defer tick.Stop()
	for {
		t.round(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// round pings every other node once, in parallel, and records the results.
func (t *Tracker) round(ctx context.Context) {
	nodes := t.cfg.View.Nodes()
	results, addrs := t.pingAll(ctx, nodes)
	if ctx.Err() != nil {
		return // shutting down: a cancelled ping says nothing about the peer
	}
	changed := t.record(nodes, results)
	t.cfg.Client.Retain(addrs)
	if changed && t.cfg.OnChange != nil {
		t.cfg.OnChange()
	}
}

// pingResult is one ping of a round.
type pingResult struct {
	id, addr string
	err      error
}

// pingAll pings every node but this one that has a peer address, each at
// most one interval, and returns the results and the addresses pinged.
func (t *Tracker) pingAll(ctx context.Context, nodes []core.NodeInfo) ([]pingResult, map[string]bool) {
	results := make([]pingResult, len(nodes))
	addrs := map[string]bool{}
	var wg sync.WaitGroup
	for i, n := range nodes {
		if n.ID == t.cfg.Self || n.PeerAddr == "" {
			continue
		}
		addrs[n.PeerAddr] = true
		wg.Go(func() {
			pctx, cancel := context.WithTimeout(ctx, t.cfg.Interval)
			defer cancel()
			got, err := t.cfg.Client.Ping(pctx, n.ID, n.PeerAddr)
			if err == nil && got != n.ID {
				err = fmt.Errorf("%s answered as node %q", n.PeerAddr, got)
			}
			results[i] = pingResult{n.ID, n.PeerAddr, err}
		})
	}
	wg.Wait()
	return slices.DeleteFunc(results, func(r pingResult) bool { return r.id == "" }), addrs
}

// record counts each node's misses, logs the nodes that turned spare or
// answer again, forgets the nodes gone from the view, and sets the state
// gauges. It reports whether a node turned spare or answers again.
func (t *Tracker) record(nodes []core.NodeInfo, results []pingResult) (changed bool) {
	present := map[string]bool{}
	for _, n := range nodes {
		present[n.ID] = true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, r := range results {
		m := t.misses[r.id]
		if m.addr != r.addr {
			m = miss{addr: r.addr}
		}
		was := m.n >= t.cfg.Threshold
		if r.err == nil {
			m.n = 0
		} else {
			m.n++
		}
		t.misses[r.id] = m
		switch now := m.n >= t.cfg.Threshold; {
		case now && !was:
			changed = true
			t.cfg.Logger.Warn("peer missed its pings: spare in this node's view", "peer", r.id, "addr", r.addr, "missed", m.n, "err", r.err)
		case was && !now:
			changed = true
			t.cfg.Logger.Info("peer answers again", "peer", r.id, "addr", r.addr)
		}
	}
	for id := range t.misses {
		if !present[id] {
			delete(t.misses, id)
		}
	}
	var gone []string
	for id := range t.shown {
		if !present[id] {
			gone = append(gone, id)
			delete(t.shown, id)
		}
	}
	states := t.statesLocked(nodes)
	for id := range states {
		t.shown[id] = true
	}
	t.cfg.Metrics.setStates(states, gone)
	return changed
}

// Spare reports whether this node holds node spare: it missed Threshold
// pings in a row at the address its record names.
func (t *Tracker) Spare(node NodeAddr) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	m, ok := t.misses[node.ID]
	return ok && node.ID != t.cfg.Self && m.addr == node.PeerAddr && m.n >= t.cfg.Threshold
}

// SpareNodes returns the nodes this node holds spare now.
func (t *Tracker) SpareNodes() []string {
	var out []string
	for id, st := range t.States() {
		if st == core.StateSpare {
			out = append(out, id)
		}
	}
	return out
}

// NodeAddr names a node at an address, as its catalog record does.
type NodeAddr struct{ ID, PeerAddr string }

// States returns every node in the catalog view with its state as this
// node sees it: the state its record states, except spare for a node that
// missed Threshold pings in a row. A node whose record is gone is absent.
func (t *Tracker) States() map[string]core.PeerState {
	nodes := t.cfg.View.Nodes()
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.statesLocked(nodes)
}

func (t *Tracker) statesLocked(nodes []core.NodeInfo) map[string]core.PeerState {
	out := make(map[string]core.PeerState, len(nodes))
	for _, n := range nodes {
		st := n.State
		if m, ok := t.misses[n.ID]; ok && n.ID != t.cfg.Self && m.addr == n.PeerAddr && m.n >= t.cfg.Threshold {
			st = core.StateSpare
		}
		out[n.ID] = st
	}
	return out
}
