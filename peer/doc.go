// Package peer is the node-to-node transport: the PeerService gRPC server on
// a node's --peer-addr, the client pool a node uses to call its peers, the
// cluster-secret authentication both share, the tracker that turns missed
// pings into peer states, and routing: the Router (the transport half of
// core.Cluster: Forward and Send) and the server's Handler that hands what
// peers send to the engine.
//
// Routing has two calls. Forward carries one job synchronously, because the
// ingress needs the dispatcher's verdict (a refusal travels as an answer,
// not a gRPC error) and is retried on transient failures: the dispatcher
// takes a (job id, generation) once. Post carries batches of every other
// message: one FIFO and one sender per destination node, one Post in flight
// per node, a failed batch resent unchanged before anything behind it, and
// a (session, sequence) pair so a resend is not handled twice. Messages to
// a node whose catalog record is gone are dropped: it is dead.
//
// Authentication proves membership, not the channel. Every call carries the
// caller's node id ("x-switchyard-node") and hex(HMAC-SHA256(secret, id))
// ("x-switchyard-auth"); the server recomputes the MAC and compares it in
// constant time. Anyone who can read the traffic can replay a node's token,
// and nothing is encrypted: run peers on a trusted network. Mutual TLS is the
// upgrade path, and slots in as transport credentials on Server and Client.
package peer
