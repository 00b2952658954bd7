package peer

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// awaitAcksPoll is how often AwaitAcks looks again: it runs once, at shutdown.
const awaitAcksPoll = 10 * time.Millisecond

// AwaitAcks waits until nothing this node's transport queued is waiting to
// be acknowledged — no delivery stream item, response-leg message or Post —
// or until ctx is done. A message for a node that left the catalog counts
// as acknowledged: it is dropped with its node. A node calls it after its
// drain and before Close, which drops what is still queued: so the last
// outputs and ends of the jobs its workers ran for other nodes' requesters,
// and the jobs it handed back, reach their nodes.
//
// What it counts is switchyard_peer_queue_messages, summed over nodes: the
// gauge the paths keep of exactly that.
func (t *Transport) AwaitAcks(ctx context.Context) error {
	tick := time.NewTicker(awaitAcksPoll)
	defer tick.Stop()
	for {
		n := gaugeSum(t.rt.m.queue)
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("peer: %v messages still unacknowledged: %w", n, ctx.Err())
		case <-tick.C:
		}
	}
}

// gaugeSum is the sum of every series of a gauge vector.
func gaugeSum(g *prometheus.GaugeVec) float64 {
	ch := make(chan prometheus.Metric)
	go func() {
		g.Collect(ch)
		close(ch)
	}()
	sum := 0.0
	for m := range ch {
		var d dto.Metric
		if m.Write(&d) == nil {
			sum += d.GetGauge().GetValue()
		}
	}
	return sum
}
