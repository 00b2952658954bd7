// Package grpcapi serves Switchyard's public gRPC services on a node's
// --grpc-addr: WorkerService (worker.go), the bidirectional session a worker
// attaches through, and JobService (jobs.go), which submits, resumes, gets
// and cancels jobs for Go clients; grpc.go builds the *grpc.Server that
// serves both. Each handler is thin: it validates the request, calls a
// core.Engine and maps the engine's error to a status with package apierr,
// the one error map every transport shares.
//
// Job streams apply exactly the policy of the SSE transport (httpapi): the
// one writer is core/stream, resume tokens are core/resume tokens signed
// with the node's keyring, and every refusal carries the same stable code as
// the HTTP API's problem documents.
package grpcapi
