// Package peer is the node-to-node transport: core.Transport over gRPC.
//
// A node builds one Transport (transport.go) from its Config, builds its
// engine with it, and hands it the engine with Start. Outbound, the router
// carries the engine's messages by three ordered paths, each in a pair of
// files named for its sending and receiving side: a lane per (node, queue)
// for the request leg, over a Deliver stream or unary calls
// (deliver_send.go, deliver_recv.go); a reply leg per job binding for the
// response leg (leg_send.go, leg_recv.go), the legs to one ingress node
// multiplexed on one reply trunk, a Respond stream (trunk_send.go,
// trunk_recv.go); and a Post FIFO per node for a binding's only message
// (post_send.go, post_recv.go). The server hands each path's messages to
// the engine in order and once each. Each core.Transport method is
// written where its work is done: Forward in deliver_send.go, Send and
// Expect in leg_send.go.
//
// What is off a job's usual path has files of its own: a lane's acks and
// the fallback to unary calls when its stream stalls (lane_acks.go,
// lane_stall.go, lane_unary.go), its zone test (lane_zone.go) and its end
// (lane_end.go); a reply leg's window and its end (leg_window.go,
// leg_end.go); resending after a failure (retry.go). Every call is
// authenticated with the cluster secret and carries the protocol version
// (auth.go, version.go); the Tracker pings every peer and keeps this
// node's verdict on each (tracker.go). The design, and why:
// docs/cluster.md, "Peer streams".
//
// The cluster secret proves membership, not the channel: anyone who can
// read plaintext traffic can replay a node's token. With Config.ServerTLS
// and ClientTLS (the node's --peer-tls-*), the channel is mutual TLS from
// the cluster CA as well: private, and open only to certificates of that
// CA, the secret still checked inside it. Without them, run peers on a
// trusted network.
//
// # Locks
//
// The node's lock order, this package's locks among core's, core/stream's
// and httpapi's, is written once, in docs/ARCHITECTURE.md ("Lock order").
// No lock of this package is held while it calls the engine, except the
// server's per-path locks, which serialise a path's messages; the engine
// calls the transport with Engine.mu held only for Send and Expect, which
// never block.
package peer
