package peer

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/core"
)

// Metrics are the peer transport's counters, shared by a node's Server,
// Client and Tracker.
type Metrics struct {
	authFailures prometheus.Counter
	messages     *prometheus.CounterVec
	state        *prometheus.GaugeVec
}

// NewMetrics registers the peer metrics on reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		authFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_peer_auth_failures_total",
			Help: "Peer calls refused because their cluster credentials were missing or wrong.",
		}),
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_peer_messages_total",
			Help: "Authenticated peer messages this node received, by kind (ping; routing adds its kinds).",
		}, []string{"kind"}),
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "switchyard_peer_state",
			Help: "1 for each node's current peer state in this node's view, 0 for the other states.",
		}, []string{"node", "state"}),
	}
	if reg != nil {
		reg.MustRegister(m.authFailures, m.messages, m.state)
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
