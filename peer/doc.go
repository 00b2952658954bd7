// Package peer is the node-to-node transport: the PeerService gRPC server on
// a node's --peer-addr, the client pool a node uses to call its peers, the
// cluster-secret authentication both share, and the tracker that turns
// missed pings into peer states.
//
// Authentication proves membership, not the channel. Every call carries the
// caller's node id ("x-switchyard-node") and hex(HMAC-SHA256(secret, id))
// ("x-switchyard-auth"); the server recomputes the MAC and compares it in
// constant time. Anyone who can read the traffic can replay a node's token,
// and nothing is encrypted: run peers on a trusted network. Mutual TLS is the
// upgrade path, and slots in as transport credentials on Server and Client.
package peer
