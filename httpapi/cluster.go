package httpapi

import (
	"net/http"
)

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

// handleNodes is GET /v1/cluster/nodes: ClusterService.ListNodes through
// the gateway.
func (s *Server) handleNodes(w http.ResponseWriter, r *http.Request) { s.gateway.ServeHTTP(w, r) }

// handleQueues is GET /v1/queues: ClusterService.ListQueues through the
// gateway.
func (s *Server) handleQueues(w http.ResponseWriter, r *http.Request) { s.gateway.ServeHTTP(w, r) }

// handleQueue is GET /v1/queues/{queue}: ClusterService.GetQueue through the
// gateway.
func (s *Server) handleQueue(w http.ResponseWriter, r *http.Request) { s.gateway.ServeHTTP(w, r) }
