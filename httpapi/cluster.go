package httpapi

import (
	"net/http"
	"slices"

	"github.com/go-chi/chi/v5"

	"github.com/switchyard/switchyard/core"
)

// ClusterView is the catalog as the cluster views read it: the watched,
// in-memory registries (never a read of the store per request).
type ClusterView interface {
	Nodes() []core.NodeInfo
	Queues() []string
	Consumers(queue string) []core.ConsumerInfo
	Dispatch(queue string) (core.DispatchInfo, bool)
}

// NodeResponse is one node in GET /v1/cluster/nodes.
type NodeResponse struct {
	ID       string `json:"id"`
	State    string `json:"state"`
	Zone     string `json:"zone,omitempty"`
	HTTPAddr string `json:"http_addr,omitempty"`
	GRPCAddr string `json:"grpc_addr,omitempty"`
	PeerAddr string `json:"peer_addr,omitempty"`
}

// ConsumerResponse is one consumer of a queue.
type ConsumerResponse struct {
	ID           string   `json:"id"`
	Node         string   `json:"node"`
	Name         string   `json:"name,omitempty"`
	Capabilities []string `json:"capabilities"`
	Concurrency  int      `json:"concurrency"`
	Zone         string   `json:"zone,omitempty"`
}

// QueueResponse is one queue in GET /v1/queues. Depth, bytes and bound are
// this node's figures, present when this node holds the queue.
type QueueResponse struct {
	Name       string             `json:"name"`
	Dispatcher string             `json:"dispatcher,omitempty"`
	ReplyTo    string             `json:"reply_to,omitempty"`
	Zone       string             `json:"zone,omitempty"`
	Local      *LocalQueue        `json:"local,omitempty"`
	Consumers  []ConsumerResponse `json:"consumers"`
}

// LocalQueue is a queue as this node's dispatcher holds it.
type LocalQueue struct {
	Depth   int   `json:"depth"`
	Bytes   int64 `json:"bytes"`
	Bound   int   `json:"bound"`
	Workers int   `json:"workers"`
}

// handleNodes is GET /v1/cluster/nodes: every node with its zone and state.
func (s *Server) handleNodes(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"nodes": s.nodes()})
}

// handleQueues is GET /v1/queues: every queue the catalog or this node
// knows, with its dispatcher and consumers.
func (s *Server) handleQueues(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"queues": s.queues()})
}

// nodes is the body of GET /v1/cluster/nodes, shared with the live view.
func (s *Server) nodes() []NodeResponse {
	out := []NodeResponse{}
	for _, n := range s.cfg.Cluster.Nodes() {
		out = append(out, NodeResponse{ID: n.ID, State: string(n.State), Zone: n.Zone, HTTPAddr: n.HTTPAddr, GRPCAddr: n.GRPCAddr, PeerAddr: n.PeerAddr})
	}
	return out
}

// queues is the body of GET /v1/queues, shared with the live view.
func (s *Server) queues() []QueueResponse {
	local := map[string]core.QueueStat{}
	names := s.cfg.Cluster.Queues()
	for _, q := range s.e.QueueStats() {
		local[q.Name] = q
		if !slices.Contains(names, q.Name) {
			names = append(names, q.Name)
		}
	}
	slices.Sort(names)
	out := []QueueResponse{}
	for _, name := range names {
		out = append(out, s.queueResponse(name, local))
	}
	return out
}

// handleQueue is GET /v1/queues/{queue}.
func (s *Server) handleQueue(w http.ResponseWriter, r *http.Request) {
	name := chi.URLParam(r, "queue")
	if err := core.CheckQueueName(name); err != nil {
		s.writeError(w, r, err)
		return
	}
	local := map[string]core.QueueStat{}
	for _, q := range s.e.QueueStats() {
		local[q.Name] = q
	}
	_, known := local[name]
	if !known && !slices.Contains(s.cfg.Cluster.Queues(), name) {
		s.writeError(w, r, &core.Error{Code: core.CodeNotFound, Detail: "no queue by this name: queues exist while they have jobs or consumers"})
		return
	}
	writeJSON(w, http.StatusOK, s.queueResponse(name, local))
}

func (s *Server) queueResponse(name string, local map[string]core.QueueStat) QueueResponse {
	q := QueueResponse{Name: name, Consumers: []ConsumerResponse{}}
	if d, ok := s.cfg.Cluster.Dispatch(name); ok {
		q.Dispatcher, q.ReplyTo, q.Zone = d.Dispatcher, d.ReplyTo, d.Zone
	}
	if st, ok := local[name]; ok {
		q.Local = &LocalQueue{Depth: st.Depth, Bytes: st.Bytes, Bound: st.Bound, Workers: st.Workers}
		if q.Dispatcher == "" {
			// Without a dispatch record, the node holding the queue is its
			// dispatcher: every queue a single node serves is local.
			q.Dispatcher = s.e.Config().Node
		}
	}
	for _, c := range s.cfg.Cluster.Consumers(name) {
		q.Consumers = append(q.Consumers, ConsumerResponse{
			ID: c.ID, Node: c.Node, Name: c.Name, Capabilities: c.Capabilities.Strings(), Concurrency: c.Concurrency, Zone: c.Zone,
		})
	}
	return q
}

// emptyCluster is the view of a node with no catalog (tests of the HTTP
// layer alone).
type emptyCluster struct{}

func (emptyCluster) Nodes() []core.NodeInfo                    { return nil }
func (emptyCluster) Queues() []string                          { return nil }
func (emptyCluster) Consumers(string) []core.ConsumerInfo      { return nil }
func (emptyCluster) Dispatch(string) (core.DispatchInfo, bool) { return core.DispatchInfo{}, false }
