// Package grpcapi serves Switchyard's three public gRPC services on a
// node's --grpc-addr: WorkerService (worker.go), the bidirectional session
// a worker attaches through; JobService (jobs.go), which submits, resumes,
// gets and cancels jobs for Go clients; and ClusterService (cluster.go),
// the cluster's nodes and queues. grpc.go builds the *grpc.Server that
// serves them, with the interceptors that authenticate every call
// (auth.go). Each handler is thin: it validates the request, calls a
// core.Engine and maps the engine's error to a status with package apierr,
// the one error map every transport shares.
//
// Job streams apply exactly the policy of the SSE transport (httpapi): the
// one writer, the event encoding and the resume tokens are core/stream's,
// signed with the node's keyring, a worker session's send queue is
// core.Outbox, and every refusal carries the same stable code as the HTTP
// API's problem documents.
package grpcapi
