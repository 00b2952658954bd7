// Package auth is who may call a node and what they may do: API keys, each
// naming a subject, roles (submit, work, admin) and the queues it may use
// (patterns); the identity a transport attaches to every call; and each
// key's admission limits (a rate and a ceiling on jobs in flight).
//
// It knows no transport. httpapi checks the Authorization header in a chi
// middleware, grpcapi the "authorization" metadata in interceptors; both
// call Store.Authenticate and put the Identity in the call's context, and
// the services read it from there (FromContext) for what only they can
// check: the queue of a gRPC submission or worker registration, and who
// owns a job. The unary HTTP routes are the gRPC services served in process
// by grpc-gateway: the middleware checks them, and the services find its
// identity in the request's context. So every call is authenticated once.
//
// Keys come from a file (YAML or JSON, see File), re-read on SIGHUP
// (Store.Reload: a file that does not parse keeps the keys in use), and
// from the environment. Keys may be stored as their SHA-256; either way a
// node keeps only hashes, compares them in constant time, and never logs
// a key.
//
// Limits count on each node: a key's rate and in-flight ceiling are
// checked by the node that takes the submission, with that node's counts.
// Behind a load balancer spreading a key's calls over n nodes, the key may
// get up to n times its limits. That is deliberate: a cluster-wide count
// would put a catalog write on every submission, which the message path
// never has.
package auth
