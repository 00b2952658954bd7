// Package resume issues and verifies signed, expiring resume tokens for job
// event streams.
//
// Every event a node sends on a job stream carries a token naming the
// position just after it: the stream (job id), its generation, the sequence
// number of the event, the snapshot version of the stream's history, and
// fingerprints of the caller and of the filter the stream was opened with.
// On SSE the token is the event's "id:" field, so a browser's EventSource
// hands it back by itself as Last-Event-ID when it reconnects; gRPC clients
// send it in their resume request. A token looks like
//
//	<kid>.<payload>.<mac>
//
// where kid names the signing key, payload is a compact versioned binary
// encoding of the Position (base64url, no padding) and mac is
// HMAC-SHA256(secret, "swy-resume-v1" || kid || "." || payload) (base64url,
// no padding). Only base64url characters and '.' appear, so a token is a
// valid SSE id (no CR, LF or NUL) and survives headers, URLs and logs as is.
//
// # Why tokens are signed
//
// A resume token comes back from the client, and Last-Event-ID is a header
// anyone can set. Were it a bare "job/seq" cursor, a client could point it at
// somebody else's job, at a filter it was never granted, or at a sequence
// number ahead of what it received, and the node would replay from there:
// a data leak in the first two cases and a silent gap in the third. The MAC
// makes the token something only a node can have produced, and binding the
// caller and filter fingerprints and the stream id makes it usable only by
// the request it was issued to. The token is signed, not encrypted: its
// payload is readable, so fingerprints must be derived from identifiers, not
// from secrets.
//
// # Why the key id is in clear and covered by the MAC
//
// The verifier has to know which key to check the MAC with before it can
// trust anything in the token, so the key id cannot be inside the signed
// payload; carrying it in clear lets a Keyring hold several keys (a new
// signing key plus old ones kept for verification) and pick the right one
// with a single lookup, instead of trying every key in turn. The key id is
// nonetheless part of the MACed message, so relabelling a token with another
// key id invalidates it: a token can only ever be verified under the key it
// was signed with, and the kid a node logs for a valid token is authentic.
// The fixed "swy-resume-v1" prefix separates these MACs from any other use of
// the same secret and from future token versions.
//
// # Why the length is bounded before decoding
//
// Verify runs on input from unauthenticated clients, often before anything
// else about the request has been checked. Rejecting anything longer than
// MaxTokenLen before splitting, base64-decoding or hashing it caps the work
// and memory an attacker can make a node spend per request, whatever they
// send. The bound costs nothing for honest clients: Sign refuses positions
// whose token could exceed it (see MaxStreamLen), so no valid token is ever
// longer. For the same reason the MAC is checked before the payload is
// decoded: the payload decoder only ever sees bytes a node signed.
//
// # Why every failure looks the same to the client
//
// Every error Verify and Position.Check return satisfies
// errors.Is(err, ErrInvalidToken), and transports must map that to one
// identical response. Distinct answers would be an oracle: "expired" versus
// "bad signature" tells a forger that a guessed payload carried a valid MAC;
// "caller mismatch" tells the holder of a stolen token that it is genuine and
// whose it is; "unknown key" enumerates key ids. The client's remedy is the
// same in every case anyway: resubscribe from the start (a full resync). The
// precise cause is kept on the error as an InvalidError Reason, which nodes
// may log and count (see ReasonOf and Reasons) but never send.
//
// # What the token does not decide
//
// Whether the generation or snapshot version has moved, and whether the
// sequence number is still within retained history, depend on the stream's
// current state, which this package does not know. Position.Check compares
// generation and snapshot; a cursor older than retained history is the
// stream's to detect and answer with "full resync required", never by
// skipping silently to what is left.
//
// # Key rotation
//
// Keys are named by short ids and held in a Keyring: one key signs, every
// key in the ring verifies. To rotate across a cluster:
//
//  1. add the new key to every node's ring as a verification key;
//  2. once every node has it, make it the signing key everywhere (the old
//     key stays in the rings, so outstanding tokens keep verifying);
//  3. after the longest token TTL in use has passed, remove the old key.
//
// Removing a key from the ring retires it: tokens signed with it then fail
// with reason ReasonUnknownKey. Step 1 matters because a token signed with
// the new key by one node may be presented to another.
package resume
