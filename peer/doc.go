// Package peer is the node-to-node transport: core.Transport over gRPC.
// Its words (delivery stream, response leg, reply stream, unicast, spare)
// are defined once, in docs/ARCHITECTURE.md ("Words").
//
// A node builds one Transport (transport.go) from its Config, builds its
// engine with it, and hands it the engine with Start. Outbound, the router
// carries the engine's messages by three ordered paths, each in a pair of
// files named for its sending and receiving side:
//
//   - a delivery stream per (node, queue), the request leg: forwards to a
//     dispatcher, deliveries to a consumer host and the routing messages
//     that follow them, over a Deliver stream or, when it stalls, unary
//     calls (delivery_send.go, delivery_recv.go);
//   - a response leg per job binding: its answers from the consumer host
//     back to the ingress (leg_send.go, leg_recv.go), every leg to one
//     ingress multiplexed on one reply stream, an rpc Respond stream
//     (reply_send.go, reply_recv.go); a leg has no goroutine: one sender
//     per ingress node does the work of every leg to it, and owns that
//     node's reply stream (leg_sender.go);
//   - a unicast queue per node for a binding's only message, one Post call
//     per batch (unicast_send.go, unicast_recv.go).
//
// The server hands each path's messages to the engine in order and once
// each. Each core.Transport method is written where its work is done:
// Forward in delivery_send.go, Send and Expect in leg_send.go.
//
// What is off a job's usual path has files of its own: a delivery stream's
// acks and the fallback to unary calls when its stream stalls
// (delivery_acks.go, delivery_stall.go, delivery_unary.go), its zone test
// (delivery_zone.go) and its end (delivery_end.go); a response leg's window
// and its end (leg_window.go, leg_end.go); resending after a failure
// (retry.go); waiting, at close, for the acks of what the drain sent
// (await_acks.go). Every call is authenticated with the cluster secret and
// carries the protocol version (auth.go, version.go); the Tracker pings
// every peer and keeps this node's verdict on each: online, suspected, or
// spare (unreachable: it missed its pings) (tracker.go). The design, and
// why: docs/cluster.md, "Peer streams".
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
