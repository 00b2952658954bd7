package peer

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/core"
)

// Metrics are the peer transport's counters, shared by a node's
// Transport and Tracker.
type Metrics struct {
	authFailures    prometheus.Counter
	versionRefusals prometheus.Counter
	messages        *prometheus.CounterVec
	dropped         *prometheus.CounterVec
	sendFailures    prometheus.Counter
	invalid         prometheus.Counter
	queue           *prometheus.GaugeVec
	state           *prometheus.GaugeVec
	pinged          prometheus.Gauge

	// activity is the traffic with each peer that the transport marks and
	// the tracker reads (Activity): one record per node, shared as the
	// metrics are.
	activity *Activity

	// Deliver streams (delivery_send.go): a silent downgrade from streaming
	// to unary reads as "works, just slower", so every step of it is
	// counted.
	streamsOpen     *prometheus.GaugeVec
	streamsOpened   *prometheus.CounterVec
	streamed        prometheus.Counter
	fallbacks       prometheus.Counter
	idleCloses      prometheus.Counter
	replyStreamIdle prometheus.Counter
	ackExpiries     prometheus.Counter
	zoneCloses      prometheus.Counter
	undeliverable   *prometheus.CounterVec
	stale           *prometheus.CounterVec

	// Response legs and reply streams (leg_send.go, reply_send.go,
	// reply_recv.go).
	legSilences *prometheus.CounterVec
	legsEnded   *prometheus.CounterVec
	legsOpen    prometheus.Gauge
	replyFrames prometheus.Counter

	// sentReply and sentRelease are messages' children for the kinds a
	// response leg sends once per output (sent).
	sentReply, sentRelease prometheus.Counter
}

// sent is the switchyard_peer_messages_total child of kind, without a
// label lookup for the kinds sent per output.
func (m *Metrics) sent(kind string) prometheus.Counter {
	switch kind {
	case string(core.MsgReply):
		return m.sentReply
	case string(core.MsgRelease):
		return m.sentRelease
	}
	return m.messages.WithLabelValues(kind)
}

// kindDeliver is the switchyard_peer_streams_open kind of a delivery
// stream's Deliver stream.
const kindDeliver = "deliver"

// kindPing is the switchyard_peer_messages_total kind of a ping, and
// kindFigures of a Figures call: liveness and the cluster view, not
// routing.
const (
	kindPing    = "ping"
	kindFigures = "figures"
)

// Activity is the traffic record the transport marks and the tracker
// reads.
func (m *Metrics) Activity() *Activity { return m.activity }

// NewMetrics registers the peer metrics on reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	var s metricSet
	m := &Metrics{
		activity: NewActivity(),
		pinged: s.gauge("switchyard_peer_pinged_nodes",
			"Nodes this node pinged in its last heartbeat round: those it has business with (routing traffic in the last few heartbeats, a queue it dispatches with a consumer there or a consumer here of a queue dispatched there), those in doubt, and those whose address never answered it; every other node's lease is the proof it lives."),
		authFailures: s.counter("switchyard_peer_auth_failures_total",
			"Peer calls refused because their cluster credentials were missing or wrong."),
		versionRefusals: s.counter("switchyard_peer_version_refusals_total",
			"Authenticated peer calls refused because the caller speaks a peer protocol version this node does not serve, or names none; the log names both versions."),
		messages: s.counterVec("switchyard_peer_messages_total",
			"Peer messages by kind. Routing kinds (forward, deliver, reply, release, unbind, cancel) count the messages this node sent, "+
				"each once, when the stream ack or the call carrying it came back, or (a cancel on a response leg) when it was written (a resent message is not counted twice, whichever path carried it); kind=ping counts the authenticated pings this node answered.", "kind"),
		dropped: s.counterVec("switchyard_peer_messages_dropped_total",
			"Routing messages this node gave up sending, by kind: their node left the catalog (its lease is gone), the peer refused them for good, this node shut down with them queued, or (replies) their job was cancelled or its TTL passed before they were acked.", "kind"),
		sendFailures: s.counter("switchyard_peer_send_failures_total",
			"Forward and Post calls to peers that failed, forwards a stream ack answered without a verdict, and reply streams (which carry the response legs to one ingress) that failed or could not be opened; each failed attempt of a retried call counts."),
		invalid: s.counter("switchyard_peer_messages_invalid_total",
			"Routing messages received from peers and skipped because no handler could act on them (unknown kind, no job id, no job to forward or deliver)."),
		queue: s.gaugeVec("switchyard_peer_queue_messages",
			"Routing messages queued for each node and not yet handed over: waiting, in a Post in flight, or sent on a stream and not yet acked.", "node"),
		state: s.gaugeVec("switchyard_peer_state",
			"1 for each node's current peer state in this node's view, 0 for the other states.", "node", "state"),
		streamsOpen: s.gaugeVec("switchyard_peer_streams_open",
			"Peer streams this node has open to other nodes, by kind (deliver: one per (node, queue) delivery stream with recent traffic; respond: one reply stream per ingress node this node sends replies to, carrying every job's response leg to it).", "kind"),
		streamsOpened: s.counterVec("switchyard_peer_streams_opened_total",
			"Peer streams this node opened, by kind. For deliver, rising fast against a steady switchyard_peer_streams_open means delivery streams churn: raise the stream idle interval. For respond, one per reply stream: once per ingress node with traffic, plus one per re-open after a failure or an idle close.", "kind"),
		streamed: s.counter("switchyard_peer_deliveries_streamed_total",
			"Routing messages (forwards included) whose Deliver stream ack came back; the rest of switchyard_peer_messages_total went by unary Post or Forward."),
		fallbacks: s.counter("switchyard_peer_unary_fallbacks_total",
			"Deliver streams dropped for a stall (an ack deadline missed), a failure, or a silent peer (no frame for three heartbeat intervals), or that could not be opened; their unacked messages were resent by unary calls."),
		idleCloses: s.counter("switchyard_peer_stream_idle_closes_total",
			"Deliver streams closed because their delivery stream sent nothing for the stream idle interval with nothing unacked."),
		replyStreamIdle: s.counter("switchyard_peer_reply_trunk_idle_closes_total",
			"Reply streams (the Respond stream to one ingress node, carrying every response leg to it) closed because no leg used them for the stream idle interval."),
		ackExpiries: s.counter("switchyard_peer_ack_deadline_expiries_total",
			"Deliver stream messages whose ack did not arrive within the timeout derived from their job's remaining TTL; each dropped its stream (a fallback)."),
		zoneCloses: s.counter("switchyard_peer_stream_zone_closes_total",
			"Deliver streams closed because their node's zone label changed in the catalog since they opened; unacked deliveries of jobs scoped to another zone went back to the engine to be routed again, the rest were resent by unary calls."),
		undeliverable: s.counterVec("switchyard_peer_messages_undeliverable_total",
			"Routing messages this node refused to send on any transport, by kind and reason (too_large: over the peer message limit; encoding: no valid wire form; zone: a zone-scoped delivery to a node outside the job's zone). Never retried on that path: the engine fails their job, or for zone routes it again.", "kind", "reason"),
		stale: s.counterVec("switchyard_peer_stale_incarnation_total",
			"Jobs (kind forward or deliver) meant for an incarnation of their node other than the one there now, dropped, by kind and side: sender (its catalog view names the node under a new incarnation since the job was queued for it) or receiver (this node, under a new incarnation, got a job meant for its previous one). The incarnation they were meant for is dead; its peers release what it held.", "kind", "side"),
		legSilences: s.counterVec("switchyard_peer_reply_leg_silences_total",
			"Nothing arrived on a reply stream for three heartbeat intervals, by the side that noticed: host (counted once per reply stream: it is opened again and its legs' unacked messages resent) or ingress (counted per leg the reply stream held: the stream is ended and each leg's job fails worker_lost).", "side"),
		legsEnded: s.counterVec("switchyard_peer_reply_legs_ended_total",
			"Response legs this node (as consumer host) ended, by reason: end (its last message was acked), cancel, ttl (the job's TTL passed), gone (the ingress left the catalog), refused (the ingress refused the reply stream for good: its credentials, its protocol version), closed (shutdown).", "reason"),
		legsOpen: s.gauge("switchyard_peer_reply_legs_open",
			"Response legs this node (as consumer host) has open: jobs of remote ingress nodes whose replies it carries, on its reply streams (switchyard_peer_streams_open{kind=\"respond\"})."),
		replyFrames: s.counter("switchyard_peer_reply_frames_total",
			"Frames carrying response-leg messages this node sent on its reply streams (sends, resends included): the messages one leg queued while it was sending share a frame, so this against switchyard_peer_messages_total{kind=~\"reply|release\"} is how well they were batched."),
	}
	if reg != nil {
		reg.MustRegister(s...)
	}
	m.sentReply = m.messages.WithLabelValues(string(core.MsgReply))
	m.sentRelease = m.messages.WithLabelValues(string(core.MsgRelease))
	return m
}

// metricSet makes the metrics NewMetrics declares and keeps each, so that
// every one of them is registered and none twice.
type metricSet []prometheus.Collector

func (s *metricSet) counter(name, help string) prometheus.Counter {
	return add(s, prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help}))
}

func (s *metricSet) counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return add(s, prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels))
}

func (s *metricSet) gauge(name, help string) prometheus.Gauge {
	return add(s, prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help}))
}

func (s *metricSet) gaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return add(s, prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels))
}

func add[C prometheus.Collector](s *metricSet, c C) C {
	*s = append(*s, c)
	return c
}

var allStates = []core.PeerState{core.StateInProgress, core.StateOnline, core.StateDraining, core.StateSpare}

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
