// Package peer is the node-to-node transport: the PeerService gRPC server on
// a node's --peer-addr, the client pool a node uses to call its peers, the
// cluster-secret authentication both share, the tracker that turns missed
// pings into peer states, and routing: the Router (the transport half of
// core.Cluster: Forward and Send) and the server's Handler that hands what
// peers send to the engine.
//
// Routing has three paths. The request leg (forward, deliver, cancel,
// unbind, and the synchronous Forward, which needs the dispatcher's
// verdict) goes by lanes, one per (destination node, queue): each lane's
// goroutine opens a Deliver stream to the node on its first message, sends
// its messages on it in order and closes it when idle; a stream that
// stalls (an ack later than the job's TTL allows), fails, or goes silent
// (no heartbeat) is dropped, and what it held unacked is resent in order by
// unary Post and Forward calls, the receiver skipping anything it already
// handled by either path (lane.go, deliver.go). The response leg (reply,
// release) goes by reply legs, one per job binding from its consumer host
// to its ingress, opened when the job is offered (or by its first reply)
// and ended by its end or release, a cancel, or the job's TTL, never for
// being idle; it carries the job's cancel back, is opened again and resent
// after a failure, and blocks rather than drops: a slow ingress makes
// Router.Room ask the worker session to stop reading its worker. The legs
// from one host to one ingress are multiplexed on one Respond stream, the
// host's reply trunk to it (respond.go, respondserver.go); what a leg queued
// while it was sending goes in one frame. A binding's only message (an end or a release with no
// leg open) goes by one FIFO per node as batched Posts, one in flight per
// node, a failed batch resent unchanged before anything behind it. Every
// message carries a (session, sequence) pair so a resend is never handled
// twice, and a refusal travels as an answer, not a gRPC error. A message no
// transport can carry (too large, no valid wire form) is never sent: the
// engine is told, and fails its job. Messages to a node whose catalog
// record is gone are dropped: it is dead.
//
// Liveness: both ends of every Deliver and Respond stream heartbeat every
// RouterConfig.Heartbeat (1s by default, far below gRPC's keepalive), and a
// stream on which nothing arrives for three intervals is dropped. On a
// reply trunk the ingress then fails the job of each leg on it
// worker_lost (the Handler, as a LegWatcher): a consumer host that goes silent without closing its
// connection turns into a terminal error for each of its streaming jobs
// within three heartbeat intervals plus one, not the kernel's minutes.
//
// Authentication proves membership, not the channel. Every call carries the
// caller's node id ("x-switchyard-node") and hex(HMAC-SHA256(secret, id))
// ("x-switchyard-auth"); the server recomputes the MAC and compares it in
// constant time. Anyone who can read the traffic can replay a node's token,
// and nothing is encrypted: run peers on a trusted network. Mutual TLS is the
// upgrade path, and slots in as transport credentials on Server and Client.
package peer
