// Package core is Switchyard's domain: the envelope a requester posts, the
// job it becomes, the queue that holds it, the binding of a job to exactly
// one consumer, and the single terminal outcome every job ends in.
//
// It imports no transport and no etcd (imports_test.go at the module root
// holds every package to its rules). Around it: httpapi (HTTP/SSE) and
// grpcapi (WorkerService, JobService) validate, call an Engine and map its
// errors; peer carries messages between nodes; catalog keeps the cluster's
// records in etcd.
//
// # Roles
//
// A job passes through three roles, which in a cluster may sit on three
// nodes and on a single node are one Engine:
//
//   - ingress (ingress.go, ingress_reads.go, ingress_replies.go): owns the
//     requester's stream, the job record, its event History and its one
//     terminal outcome. It alone decides whether a job has produced output.
//   - dispatcher (dispatch.go): holds the only copy of a queue's pending jobs,
//     decrements their TTL at dequeue and binds each to one consumer.
//   - consumer host (host.go): holds worker sessions and their credits, offers
//     jobs, relays accept, reject, output and end back to the ingress.
//
// Between the ingress and the consumer host runs each job's output credit
// (credit.go): the job's reader paces its worker, by a window.
//
// The calls between roles carry (job id, generation); the generation is the
// fencing token that makes a stale accept, output or end harmless. Across
// nodes the roles meet at the seam in transport.go: the engine calls a
// Transport to reach another node, and the transport hands what arrives to
// the engine as its Receiver (receive.go).
//
// # Locking
//
// One mutex, Engine.mu, guards every role's state. Calls out of the engine
// made under it (WorkerConn methods, History appends, Cluster's decisions,
// Transport's Send and Expect) never block: they answer from memory
// or queue for a writer of their own. Lock order: Engine.mu → History.mu;
// the node's whole order, the transport's locks included, is in
// docs/ARCHITECTURE.md ("Lock order").
package core
