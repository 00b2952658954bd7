package peer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
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
	// SuspectAfter is how many pings in a row a node may miss before it is
	// suspected in this node's view (at most Threshold; 0: 1). A suspected
	// node is offered nothing new and its queues are taken over (see
	// Tracker); only spare has the consequences of silence.
	SuspectAfter int
	View         View
	Client       *Client
	Metrics      *Metrics
	Logger       *slog.Logger
	// OnChange, if set, is called (holding none of the tracker's locks)
	// after a round in which a node turned suspected or spare or answered
	// again, and after Suspect suspected a node: a node acts on a peer's
	// silence at once, not at its next tick. It must not block.
	OnChange func()
	// Related, if set, returns the peers this node depends on through the
	// catalog: the dispatchers of the queues it hosts consumers of, and
	// the nodes hosting consumers of the queues it dispatches. They are
	// pinged every round with or without traffic, so that a silent
	// dispatcher is taken over and a silent consumer host offered nothing
	// within a heartbeat, as before any job arrives. Nil: none.
	Related func() map[string]bool
}

// activeRounds is how many intervals after its last routing message
// (Activity) a peer is still pinged every round.
const activeRounds = 10

// Tracker pings, each interval, the other nodes this node has business
// with, and keeps this node's verdict on them, at two levels:
//   - suspected: the node missed SuspectAfter pings in a row (one, by
//     default: a ping that took a whole interval), or the transport saw it
//     go (Suspect). Routing offers it nothing new and treats a dispatch
//     record naming it as void, so its queues are taken over within a
//     heartbeat or two. The next answered ping clears it.
//   - spare: the node missed Threshold pings in a row. This is silence,
//     with its consequences (core.Engine.PeersSilent).
//
// Both are one node's opinion, never written to the catalog: a node's
// record is written only by that node, and its lease is the cluster's
// proof of death. Neither moves anything at-most-once depends on.
//
// A round pings a peer when (see targets):
//   - its current address has never answered this node (a new node, one
//     that moved, one with another cluster secret: spare until it does);
//   - it is in doubt: it missed the last ping, or the transport suspects
//     it (pinged until it answers, so a suspicion is never kept by
//     silence on this side);
//   - this node exchanged a routing message with it in the last
//     activeRounds intervals (Activity: jobs, delivery streams and reply
//     legs between the two, whose silence ends or moves work);
//   - the catalog ties the two (Related).
//
// Every other node is left to its lease: nothing here waits on it, and a
// job sent to it first marks traffic, so the next round pings it, and the
// transport's own failure suspects it at once. A cluster of N nodes then
// pings O(N × the peers each node works with) per interval, not N × (N-1)
// (docs/scale.md).
type Tracker struct {
	cfg TrackerConfig

	mu     sync.Mutex
	misses map[string]miss // by node id
	shown  map[string]bool // nodes with a state in the metrics
	// evidence holds the nodes the transport reported gone (Suspect), by
	// id, with when: a ping that started after that and was answered
	// clears it.
	evidence map[string]time.Time
}

// miss counts consecutive failed pings to a node at one address: a node
// that moved starts afresh. answered: the address answered a ping once.
type miss struct {
	addr     string
	n        int
	answered bool
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
	if cfg.SuspectAfter < 1 {
		cfg.SuspectAfter = 1
	}
	if cfg.SuspectAfter > cfg.Threshold {
		return nil, &core.ConfigError{Field: "peer-suspect-after", Value: cfg.SuspectAfter, Err: errors.New("must be at most --peer-failure-threshold")}
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Tracker{cfg: cfg, misses: map[string]miss{}, shown: map[string]bool{}, evidence: map[string]time.Time{}}, nil
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

// round pings this round's targets once, in parallel, and records the
// results.
func (t *Tracker) round(ctx context.Context) {
	nodes := t.cfg.View.Nodes()
	addrs := map[string]bool{}
	for _, n := range nodes {
		if n.ID != t.cfg.Self && n.PeerAddr != "" {
			addrs[n.PeerAddr] = true
		}
	}
	targets := t.targets(nodes)
	t.cfg.Metrics.pinged.Set(float64(len(targets)))
	results := t.pingAll(ctx, targets)
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
	start    time.Time
	err      error
}

// targets are the nodes of the view this round pings (see Tracker).
func (t *Tracker) targets(nodes []core.NodeInfo) []core.NodeInfo {
	var related map[string]bool
	if t.cfg.Related != nil {
		related = t.cfg.Related()
	}
	activeSince := time.Now().Add(-activeRounds * t.cfg.Interval)
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []core.NodeInfo
	for _, n := range nodes {
		if n.ID == t.cfg.Self || n.PeerAddr == "" {
			continue
		}
		m, seen := t.misses[n.ID]
		_, evidence := t.evidence[n.ID]
		switch {
		case !seen || m.addr != n.PeerAddr || !m.answered, m.n > 0, evidence,
			related[n.ID], t.cfg.Metrics.activity.Last(n.ID).After(activeSince):
			out = append(out, n)
		}
	}
	return out
}

// pingAll pings each of nodes, each at most one interval, and returns the
// results.
func (t *Tracker) pingAll(ctx context.Context, nodes []core.NodeInfo) []pingResult {
	results := make([]pingResult, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() {
			pctx, cancel := context.WithTimeout(ctx, t.cfg.Interval)
			defer cancel()
			start := time.Now()
			got, err := t.cfg.Client.Ping(pctx, n.ID, n.PeerAddr)
			if err == nil && got != n.ID {
				err = fmt.Errorf("%s answered as node %q", n.PeerAddr, got)
			}
			results[i] = pingResult{n.ID, n.PeerAddr, start, err}
		})
	}
	wg.Wait()
	return results
}

// record counts each node's misses, clears the transport's evidence
// against the nodes that answered a ping sent after it, logs the nodes
// that turned suspected or spare or answer again, forgets the nodes gone
// from the view, and sets the state gauges. It reports whether a node's
// level changed.
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
		wasSuspected, wasSpare := t.suspectedLocked(r.id, m), m.n >= t.cfg.Threshold
		if r.err == nil {
			m.n, m.answered = 0, true
			if at, ok := t.evidence[r.id]; ok && r.start.After(at) {
				delete(t.evidence, r.id)
			}
		} else {
			m.n++
		}
		t.misses[r.id] = m
		suspected, spare := t.suspectedLocked(r.id, m), m.n >= t.cfg.Threshold
		switch {
		case spare && !wasSpare:
			changed = true
			t.cfg.Logger.Warn("peer missed its pings: spare in this node's view", "peer", r.id, "addr", r.addr, "missed", m.n, "err", r.err)
		case suspected && !wasSuspected:
			changed = true
			t.cfg.Logger.Warn("peer missed a ping: suspected in this node's view", "peer", r.id, "addr", r.addr, "missed", m.n, "err", r.err)
		case wasSuspected && !suspected:
			changed = true
			t.cfg.Logger.Info("peer answers again", "peer", r.id, "addr", r.addr)
		case wasSpare != spare:
			changed = true
		}
	}
	for id := range t.misses {
		if !present[id] {
			delete(t.misses, id)
			t.cfg.Metrics.activity.Forget(id)
		}
	}
	for id := range t.evidence {
		if !present[id] {
			delete(t.evidence, id)
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

// Suspected reports whether this node suspects node: it missed
// SuspectAfter pings in a row at the address its record names, or the
// transport reported it gone and it has answered no ping since. Spare
// implies suspected.
func (t *Tracker) Suspected(node NodeAddr) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if node.ID == t.cfg.Self {
		return false
	}
	m, ok := t.misses[node.ID]
	if ok && m.addr != node.PeerAddr {
		m = miss{addr: node.PeerAddr}
	}
	return t.suspectedLocked(node.ID, m)
}

func (t *Tracker) suspectedLocked(id string, m miss) bool {
	_, ev := t.evidence[id]
	return ev || m.n >= t.cfg.SuspectAfter
}

// Suspect is the transport's evidence that node is gone: a stream from it
// broke and no new one took its place, or its response legs went silent. The
// node is suspected until it answers a ping sent after this call. It
// calls OnChange when node was not suspected before.
func (t *Tracker) Suspect(node string) {
	if node == t.cfg.Self {
		return
	}
	t.mu.Lock()
	was := t.suspectedLocked(node, t.misses[node])
	t.evidence[node] = time.Now()
	t.mu.Unlock()
	if !was {
		t.cfg.Logger.Warn("peer's transport broke: suspected in this node's view", "peer", node)
		if t.cfg.OnChange != nil {
			t.cfg.OnChange()
		}
	}
}

// SuspectedNodes returns the nodes of the catalog view this node suspects
// now (see Suspected).
func (t *Tracker) SuspectedNodes() map[string]bool {
	nodes := t.cfg.View.Nodes()
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[string]bool{}
	for _, n := range nodes {
		if n.ID == t.cfg.Self {
			continue
		}
		m, ok := t.misses[n.ID]
		if ok && m.addr != n.PeerAddr {
			m = miss{addr: n.PeerAddr}
		}
		if t.suspectedLocked(n.ID, m) {
			out[n.ID] = true
		}
	}
	return out
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
