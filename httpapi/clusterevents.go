package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"time"

	dto "github.com/prometheus/client_model/go"
	sse "github.com/tmaxmax/go-sse"
	"google.golang.org/protobuf/proto"

	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// ClusterSnapshot is one message of GET /v1/cluster/events: the cluster as
// this node sees it, in the shapes of GET /v1/cluster/nodes and GET
// /v1/queues, with a few of this node's own counters and the load of every
// node.
type ClusterSnapshot struct {
	// Node is the node answering: queues' local figures and the counters
	// are its own.
	Node     string          `json:"node"`
	Nodes    []NodeResponse  `json:"nodes"`
	Queues   []QueueResponse `json:"queues"`
	Counters ClusterCounters `json:"counters"`
	// Load is the cluster's throughput, latency and load over the last
	// interval, every node's figures together, for the live view's charts.
	Load *ClusterLoad `json:"load,omitempty"`
	// OpenAIQueue is the queue this node's OpenAI-compatible front door
	// posts chat completions to: its jobs' input is a chat request.
	OpenAIQueue string `json:"openai_queue"`
} // @name ClusterSnapshot

// ClusterEventStream documents GET /v1/cluster/events: each field is one
// SSE event type, its schema the event's data.
type ClusterEventStream struct {
	Snapshot ClusterSnapshot `json:"snapshot"`
} // @name ClusterEventStream

// ClusterCounters are the counters the live view shows, read from the
// node's own metrics registry (the figures /metrics serves). A series not
// yet created (no job has ended, no peer message was sent) is absent.
type ClusterCounters struct {
	// Jobs is switchyard_jobs_total: jobs ended on this node as their
	// ingress, by outcome.
	Jobs map[string]float64 `json:"jobs"`
	// PeerMessages is switchyard_peer_messages_total by kind.
	PeerMessages map[string]float64 `json:"peer_messages"`
	// StreamsOpen is switchyard_stream_open: client job streams open now,
	// by transport (sse, grpc).
	StreamsOpen map[string]float64 `json:"streams_open"`
	// UnaryFallbacks is switchyard_peer_unary_fallbacks_total.
	UnaryFallbacks float64 `json:"unary_fallbacks"`
	// WorkersConnected is switchyard_workers_connected.
	WorkersConnected float64 `json:"workers_connected"`
} // @name ClusterCounters

// DefaultClusterEventsInterval is how often a cluster events stream looks
// for a change: the most snapshots it sends a second.
const DefaultClusterEventsInterval = time.Second

// handleClusterEvents is GET /v1/cluster/events: the live cluster view as
// one event stream, so a web page watches everything through one
// connection (browsers allow only a few per origin over HTTP/1.1).
//
// The stream opens with a snapshot event and sends another whenever the
// snapshot changed: at once when the catalog view changed (ClusterChanges:
// a node draining for less than an interval is still seen), and otherwise
// looking every ClusterEventsInterval, at most one a tick, however busy the
// node. The load (the charts' figures) is read at the ticks only, from the
// server's one loadSampler. Polling rather than subscribing to the jobs
// keeps the stream off every hot path: the views are in memory, and the
// counters change on every job anyway. Nothing changed for the heartbeat
// interval: a comment line. The stream ends when the client leaves, when the node
// shuts down (the request's context ends), after the stream max duration
// (an EventSource reconnects and gets a fresh snapshot: there is nothing
// to resume, so the events carry no id), or on a write that does not
// complete within the write timeout. The handler is the stream's only
// goroutine.
//
//	@Summary		Watch the cluster
//	@Description	The live cluster view: a snapshot event on connect, then another whenever it changed. See docs/api.md#the-live-cluster-view.
//	@Tags			cluster
//	@ID				clusterEvents
//	@Produce		text/event-stream
//	@Success		200	{object}	ClusterEventStream	"snapshot events"
//	@Security		BearerKey
//	@Security		ReadTokenQuery
//	@Router			/v1/cluster/events [get]
func (s *Server) handleClusterEvents(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)

	pol := s.cfg.Stream
	rc := http.NewResponseController(w)
	start := time.Now()
	end := time.NewTimer(pol.MaxDuration)
	defer end.Stop()
	tick := time.NewTicker(s.cfg.ClusterEventsInterval)
	defer tick.Stop()

	var changed <-chan struct{}
	if s.cfg.ClusterChanges != nil {
		ch, unsubscribe := s.cfg.ClusterChanges()
		defer unsubscribe()
		changed = ch
	}

	var last []byte
	var load *ClusterLoad
	readLoad := true
	lastWrite := start
	write := func(m *sse.Message) bool {
		// The first write (headers and the first snapshot) gets the setup
		// time, as job streams do; each later one the write timeout.
		deadline := time.Now().Add(pol.WriteTimeout)
		if last == nil {
			deadline = start.Add(pol.Setup)
		}
		_ = rc.SetWriteDeadline(deadline)
		if _, err := m.WriteTo(w); err != nil {
			return false
		}
		lastWrite = time.Now()
		return rc.Flush() == nil
	}
	for {
		if readLoad {
			// Rates over a catalog change's instant would be noise: the
			// load moves with the ticks only.
			load = s.load.Load(r.Context())
		}
		snap, err := json.Marshal(s.clusterSnapshot(r.Context(), load))
		if err != nil {
			// Strings and numbers only: never. Said once and the stream
			// ends, rather than a loop of failures.
			s.log.Warn("encode cluster snapshot", "err", err)
			return
		}
		switch {
		case !bytes.Equal(snap, last):
			m := &sse.Message{Type: sse.Type("snapshot")}
			if last == nil {
				m.Retry = s.cfg.RetryHint
			}
			m.AppendData(string(snap))
			if !write(m) {
				return
			}
			last = snap
		case time.Since(lastWrite) >= pol.Heartbeat:
			m := &sse.Message{}
			m.AppendComment("heartbeat")
			if !write(m) {
				return
			}
		}
		select {
		case <-r.Context().Done():
			return
		case <-end.C:
			return
		case <-tick.C:
			readLoad = true
		case <-changed:
			readLoad = false
		}
	}
}

// clusterSnapshot reads the views and the counters now, with load.
func (s *Server) clusterSnapshot(ctx context.Context, load *ClusterLoad) ClusterSnapshot {
	snap := ClusterSnapshot{
		Node: s.e.Config().Node, Nodes: []NodeResponse{}, Queues: []QueueResponse{}, Counters: s.counters(),
		Load: load, OpenAIQueue: s.cfg.OpenAIQueue,
	}
	var nodes NodeList
	if s.viewJSON(func() (proto.Message, error) { return s.cluster.ListNodes(ctx, &pb.ListNodesRequest{}) }, &nodes) {
		snap.Nodes = nodes.Nodes
	}
	var queues QueueList
	if s.viewJSON(func() (proto.Message, error) { return s.cluster.ListQueues(ctx, &pb.ListQueuesRequest{}) }, &queues) {
		snap.Queues = queues.Queues
	}
	return snap
}

// viewJSON reads one of the cluster views through the ClusterService and
// the gateway's JSON, exactly as GET /v1/cluster/nodes and /v1/queues do,
// so the live view's shapes cannot drift from theirs.
func (s *Server) viewJSON(call func() (proto.Message, error), into any) bool {
	msg, err := call()
	if err == nil {
		var b []byte
		if b, err = (gatewayJSON{}).Marshal(msg); err == nil {
			err = json.Unmarshal(b, into)
		}
	}
	if err != nil {
		s.log.Debug("read a cluster view for the live view", "err", err)
		return false
	}
	return true
}

// counters reads the live view's counters from the node's registry. A
// registry that fails to gather some collector still returns the rest,
// which is what a live view wants.
func (s *Server) counters() ClusterCounters {
	c := ClusterCounters{Jobs: map[string]float64{}, PeerMessages: map[string]float64{}, StreamsOpen: map[string]float64{}}
	if s.cfg.Gatherer == nil {
		return c
	}
	mfs, err := s.cfg.Gatherer.Gather()
	if err != nil {
		s.log.Debug("gather metrics for the cluster view", "err", err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "switchyard_jobs_total":
				c.Jobs[label(m, "outcome")] += value(m)
			case "switchyard_peer_messages_total":
				c.PeerMessages[label(m, "kind")] += value(m)
			case "switchyard_stream_open":
				c.StreamsOpen[label(m, "transport")] += value(m)
			case "switchyard_peer_unary_fallbacks_total":
				c.UnaryFallbacks += value(m)
			case "switchyard_workers_connected":
				c.WorkersConnected += value(m)
			}
		}
	}
	return c
}

func label(m *dto.Metric, name string) string {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue()
		}
	}
	return ""
}

// value is a counter's or a gauge's value; the live view reads no other
// kind.
func value(m *dto.Metric) float64 {
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}
