package switchyard

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/catalog"
	"github.com/switchyard/switchyard/core"
)

// Backoff between recovery rounds.
const (
	recoverMin = 100 * time.Millisecond
	recoverMax = time.Second
)

// fenceMetrics count fences and recoveries.
type fenceMetrics struct {
	fences, recoveries prometheus.Counter
	fenced             prometheus.Gauge
}

func newFenceMetrics(reg prometheus.Registerer) *fenceMetrics {
	m := &fenceMetrics{
		fences: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "switchyard", Subsystem: "catalog", Name: "fences_total",
			Help: "Times this node treated its catalog lease as lost and stopped its work.",
		}),
		recoveries: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "switchyard", Subsystem: "catalog", Name: "recoveries_total",
			Help: "Times this node came back from a fence under a new lease and incarnation.",
		}),
		fenced: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "switchyard", Subsystem: "catalog", Name: "fenced",
			Help: "1 while this node is fenced (its catalog lease lost, not yet recovered), else 0.",
		}),
	}
	reg.MustRegister(m.fences, m.recoveries, m.fenced)
	return m
}

// watchFence fences the node each time the catalog declares its lease
// lost, then brings it back, until ctx ends (docs/cluster.md, "A fenced
// node comes back"):
//
//  1. Fence: the engine stops every job here (core.Engine.Fence); /readyz
//     answers 503; Submit and worker registrations are refused draining.
//  2. Retry, every recoverMin doubling to recoverMax, until the catalog
//     answers: catalog.Recover revokes the lost lease (the previous
//     incarnation's records go with it) and grants a new one, a new
//     incarnation.
//  3. The node record goes out in_progress under the new incarnation:
//     peers release what the previous incarnation held (proven death),
//     and route nothing here yet.
//  4. core.Engine.Unfence republishes the consumers of the worker sessions
//     that stayed connected, and takes jobs again.
//  5. The record says online; /readyz answers 200.
//
// A step that fails starts the round again after the backoff (Recover is
// a no-op while the new lease holds). A node told to stop (Close) stops
// trying.
func (n *Node) watchFence(ctx context.Context) {
	for {
		select {
		case <-n.cat.LeaseLost():
		case <-ctx.Done():
			return
		}
		if ctx.Err() != nil || n.closing.Load() {
			// Close revokes the lease and closes LeaseLost with it.
			return
		}
		since := time.Now()
		n.fenced.Store(true)
		n.fm.fences.Inc()
		n.fm.fenced.Set(1)
		n.log.Error("catalog lease lost; fencing: stopping every job on this node")
		n.engine.Fence()
		if !n.recover(ctx, since) {
			return
		}
	}
}

// recover retries rejoin until it succeeds (true) or the node stops.
func (n *Node) recover(ctx context.Context, since time.Time) bool {
	backoff := recoverMin
	t := time.NewTimer(backoff)
	defer t.Stop()
	for attempt := 1; ; attempt++ {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
		if n.closing.Load() {
			return false
		}
		err := n.rejoin(ctx)
		if err == nil {
			n.fenced.Store(false)
			n.fm.recoveries.Inc()
			n.fm.fenced.Set(0)
			n.log.Info("recovered from the fence: online under a new incarnation", "incarnation", n.cat.Incarnation(),
				"fenced_for", time.Since(since).Round(time.Millisecond), "attempts", attempt)
			return true
		}
		if errors.Is(err, catalog.ErrClosed) || errors.Is(err, core.ErrNotFenced) || ctx.Err() != nil {
			return false
		}
		// One line per second of trying at most, not one per attempt.
		if attempt == 1 || attempt%10 == 0 {
			n.log.Warn("fenced; the catalog does not take this node back yet, retrying", "attempt", attempt, "err", err,
				"fenced_for", time.Since(since).Round(time.Millisecond))
		}
		backoff = min(2*backoff, recoverMax)
		t.Reset(backoff)
	}
}

// rejoin is one round of the recovery: a new lease, the record in_progress
// under the new incarnation, the engine's consumers republished, online.
func (n *Node) rejoin(ctx context.Context) error {
	if !n.cat.LeaseValid() {
		// Lost again during an earlier round, perhaps after the engine
		// took jobs under the lease it lost: fence again (Fence is
		// idempotent), so that Unfence republishes under the new one.
		n.engine.Fence()
	}
	if err := n.cat.Recover(ctx); err != nil {
		return err
	}
	rec := n.record
	rec.State = core.StateInProgress
	if err := n.cat.PublishNode(ctx, rec); err != nil {
		return err
	}
	if n.engine.Fenced() {
		if err := n.engine.Unfence(ctx); err != nil {
			return err
		}
	}
	if n.closing.Load() {
		// Close began: its drain publishes the record draining, which an
		// online one must not overwrite.
		return catalog.ErrClosed
	}
	rec.State = core.StateOnline
	return n.cat.PublishNode(ctx, rec)
}
