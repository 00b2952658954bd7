package peer

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/core"
)

// Metrics are the peer transport's counters, shared by a node's Server,
// Client, Router and Tracker.
type Metrics struct {
	authFailures prometheus.Counter
	messages     *prometheus.CounterVec
	dropped      *prometheus.CounterVec
	sendFailures prometheus.Counter
	invalid      prometheus.Counter
	queue        *prometheus.GaugeVec
	state        *prometheus.GaugeVec
}

// kindPing is the switchyard_peer_messages_total kind of a ping.
const kindPing = "ping"

// NewMetrics registers the peer metrics on reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		authFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_peer_auth_failures_total",
			Help: "Peer calls refused because their cluster credentials were missing or wrong.",
		}),
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_peer_messages_total",
			Help: "Peer messages by kind. Routing kinds (forward, deliver, reply, release, unbind, cancel) count the messages this node sent, " +
				"each once, when the call carrying it succeeded (a resent batch is not counted twice); kind=ping counts the authenticated pings this node answered.",
		}, []string{"kind"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_peer_messages_dropped_total",
			Help: "Routing messages this node gave up sending, by kind: their node left the catalog (its lease is gone), the peer refused them for good, or this node shut down with them queued.",
		}, []string{"kind"}),
		sendFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_peer_send_failures_total",
			Help: "Forward and Post calls to peers that failed; each failed attempt of a retried call counts.",
		}),
		invalid: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_peer_messages_invalid_total",
			Help: "Routing messages received from peers and skipped because no handler could act on them (unknown kind, no job id, no job to forward or deliver).",
		}),
		queue: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "switchyard_peer_queue_messages",
			Help: "Routing messages waiting to be sent to each node, the batch in flight included.",
		}, []string{"node"}),
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "switchyard_peer_state",
			Help: "1 for each node's current peer state in this node's view, 0 for the other states.",
		}, []string{"node", "state"}),
	}
	if reg != nil {
		reg.MustRegister(m.authFailures, m.messages, m.dropped, m.sendFailures, m.invalid, m.queue, m.state)
	}
	return m
}

var allStates = []core.PeerState{core.StateInProgress, core.StateOnline, core.StateSpare}

func (m *Metrics) setStates(states map[string]core.PeerState, gone []string) {
	for _, id := range gone {
		m.state.DeletePartialMatch(prometheus.Labels{"node": id})
	}
	for id, st := range states {
		for _, s := range allStates {
			v := 0.0
			if s == st {
				v = 1
			}
			m.state.WithLabelValues(id, string(s)).Set(v)
		}
	}
}
