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
	// Incarnation is new at every start and every recovery from a fence.
	Incarnation string `json:"incarnation,omitempty"`
	// Suspected is true when this node's peer tracker suspects the node
	// while its record still stands: it missed a ping, or its transport
	// broke. This node offers it nothing new and takes its queues over;
	// once it misses --peer-failure-threshold pings, state says spare too.
	// One node's suspicion, not proof of death. Absent otherwise.
	Suspected bool `json:"suspected,omitempty"`
} // @name Node

// NodeList is GET /v1/cluster/nodes.
type NodeList struct {
	Nodes []NodeResponse `json:"nodes"`
} // @name NodeList

// QueueList is GET /v1/queues.
type QueueList struct {
	Queues []QueueResponse `json:"queues"`
} // @name QueueList

// ConsumerResponse is one consumer of a queue.
type ConsumerResponse struct {
	ID           string   `json:"id"`
	Node         string   `json:"node"`
	Name         string   `json:"name,omitempty"`
	Capabilities []string `json:"capabilities"`
	Concurrency  int      `json:"concurrency"`
	Zone         string   `json:"zone,omitempty"`
} // @name Consumer

// QueueResponse is one queue in GET /v1/queues. Depth, bytes and bound are
// this node's figures, present when this node holds the queue.
type QueueResponse struct {
	Name       string             `json:"name"`
	Dispatcher string             `json:"dispatcher,omitempty"`
	ReplyTo    string             `json:"reply_to,omitempty"`
	Zone       string             `json:"zone,omitempty"`
	Local      *LocalQueue        `json:"local,omitempty"`
	Consumers  []ConsumerResponse `json:"consumers"`
} // @name Queue

// LocalQueue is a queue as this node's dispatcher holds it.
type LocalQueue struct {
	Depth   int   `json:"depth"`
	Bytes   int64 `json:"bytes"`
	Bound   int   `json:"bound"`
	Workers int   `json:"workers"`
	// Subjects are the subjects with a job waiting or bound here, by
	// subject: the queue's fair share (docs/scheduling.md).
	Subjects []SubjectShare `json:"subjects"`
} // @name LocalQueue

// SubjectShare is one subject's part of a queue on its dispatcher.
type SubjectShare struct {
	// Subject is the API key's subject; empty for the anonymous caller.
	Subject string `json:"subject"`
	// Weight is its fair-share weight (its key's weight, default 1).
	Weight int `json:"weight"`
	// Depth is how many of its jobs wait, Bound how many of the queue's
	// slots its jobs hold.
	Depth int `json:"depth"`
	Bound int `json:"bound"`
	// Share is its part of the queue's bound jobs, FairShare what its
	// weight entitles it to among the subjects with a job here (0 to 1).
	Share     float64 `json:"share"`
	FairShare float64 `json:"fair_share"`
} // @name SubjectShare

// handleNodes is GET /v1/cluster/nodes: ClusterService.ListNodes through
// the gateway.
//
//	@Summary		List nodes
//	@Description	Every node of the catalog with its zone, addresses and state (in_progress, online, draining, spare) as this node sees it. See docs/api.md#nodes-and-queues.
//	@Tags			cluster
//	@ID				listNodes
//	@Produce		json
//	@Success		200	{object}	NodeList	"the nodes"
//	@Security		BearerKey
//	@Router			/v1/cluster/nodes [get]
func (s *Server) handleNodes(w http.ResponseWriter, r *http.Request) { s.gateway.ServeHTTP(w, r) }

// handleQueues is GET /v1/queues: ClusterService.ListQueues through the
// gateway.
//
//	@Summary		List queues
//	@Description	Every queue the catalog or this node knows, by name: its dispatcher, its consumers, and its depth where this node holds it. See docs/api.md#nodes-and-queues.
//	@Tags			cluster
//	@ID				listQueues
//	@Produce		json
//	@Success		200	{object}	QueueList	"the queues"
//	@Security		BearerKey
//	@Router			/v1/queues [get]
func (s *Server) handleQueues(w http.ResponseWriter, r *http.Request) { s.gateway.ServeHTTP(w, r) }

// handleQueue is GET /v1/queues/{queue}: ClusterService.GetQueue through the
// gateway.
//
//	@Summary		Get a queue
//	@Description	One queue, as in the list; a queue exists while it has jobs or consumers. See docs/api.md#nodes-and-queues.
//	@Tags			cluster
//	@ID				getQueue
//	@Produce		json
//	@Param			queue	path		string			true	"queue name"
//	@Success		200		{object}	QueueResponse	"the queue"
//	@Failure		400		{object}	apierr.Problem	"invalid_queue_name"
//	@Failure		404		{object}	apierr.Problem	"not_found"
//	@Security		BearerKey
//	@Router			/v1/queues/{queue} [get]
func (s *Server) handleQueue(w http.ResponseWriter, r *http.Request) { s.gateway.ServeHTTP(w, r) }
