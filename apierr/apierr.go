// Package apierr is how a core error looks on the wire: one table maps
// every stable code core declares to its HTTP status and its gRPC code,
// and the encoders here turn an error into the one form each transport
// sends — an RFC 9457 problem document (WriteProblem) or a gRPC status
// carrying google.rpc.ErrorInfo (Status) — and a status back into the core
// error it carries (FromStatus). httpapi and both gRPC services use it and
// nothing else, so a code means the same on every transport.
//
// An error that is not a *core.Error is a server fault: it is answered as
// code internal with a fixed detail, and its text stays in the node's log.
package apierr

import (
	"errors"
	"maps"
	"net/http"
	"slices"

	"google.golang.org/grpc/codes"

	"github.com/switchyard/switchyard/core"
)

// wire is how one code travels.
type wire struct {
	http int
	grpc codes.Code
}

// table maps every code core declares; docs/errors.md shows it, with when
// each code is sent, and a test keeps the two the same. The gRPC code
// follows the HTTP status where gRPC has one for it (400 InvalidArgument,
// 404 NotFound, 409 AlreadyExists, 429 ResourceExhausted, 503
// Unavailable); the limits a request passed (413, 422) are OutOfRange.
// A job's outcome codes are mostly the code of its error event, not a
// status; they reach a caller as an error only when a call itself ends
// with one (a submission forwarded to a dispatcher that finds the job's TTL
// gone answers expired). Their statuses say which side failed: the worker
// (502), the job's clock (504, DeadlineExceeded), a cancel (Canceled).
var table = map[core.Code]wire{
	// The request is malformed or invalid.
	core.CodeMalformedJSON:         {http.StatusBadRequest, codes.InvalidArgument},
	core.CodeInvalidField:          {http.StatusBadRequest, codes.InvalidArgument},
	core.CodeUnsupportedVersion:    {http.StatusBadRequest, codes.InvalidArgument},
	core.CodeMissingInput:          {http.StatusBadRequest, codes.InvalidArgument},
	core.CodeInvalidQueueName:      {http.StatusBadRequest, codes.InvalidArgument},
	core.CodeInvalidResumeToken:    {http.StatusBadRequest, codes.InvalidArgument},
	core.CodeInvalidWorker:         {http.StatusBadRequest, codes.InvalidArgument},
	core.CodeUnexpectedMessage:     {http.StatusBadRequest, codes.InvalidArgument},
	core.CodeUnsupportedMediaType:  {http.StatusUnsupportedMediaType, codes.InvalidArgument},
	core.CodeNotFound:              {http.StatusNotFound, codes.NotFound},
	core.CodeMethodNotAllowed:      {http.StatusMethodNotAllowed, codes.Unimplemented},
	core.CodeJobNotFound:           {http.StatusNotFound, codes.NotFound},
	core.CodeModelNotFound:         {http.StatusNotFound, codes.NotFound},
	core.CodeIdempotencyReuse:      {http.StatusConflict, codes.AlreadyExists},
	core.CodeInvalidIdempotencyKey: {http.StatusBadRequest, codes.InvalidArgument},
	core.CodeSessionNotFound:       {http.StatusNotFound, codes.NotFound},
	core.CodeJobNotHeld:            {http.StatusConflict, codes.FailedPrecondition},
	core.CodeInvalidAffinityKey:    {http.StatusBadRequest, codes.InvalidArgument},
	// Who calls, and what the key allows.
	core.CodeUnauthenticated:  {http.StatusUnauthorized, codes.Unauthenticated},
	core.CodePermissionDenied: {http.StatusForbidden, codes.PermissionDenied},
	// The key may not ask for this.
	core.CodePriorityNotAllowed: {http.StatusForbidden, codes.PermissionDenied},

	// The request passes a limit.
	core.CodeBodyTooLarge:       {http.StatusRequestEntityTooLarge, codes.OutOfRange},
	core.CodeRequestTimeout:     {http.StatusRequestTimeout, codes.DeadlineExceeded},
	core.CodeInputTooLarge:      {http.StatusRequestEntityTooLarge, codes.OutOfRange},
	core.CodeTTLOutOfRange:      {http.StatusUnprocessableEntity, codes.OutOfRange},
	core.CodeLimitAboveCeiling:  {http.StatusUnprocessableEntity, codes.OutOfRange},
	core.CodePriorityOutOfRange: {http.StatusUnprocessableEntity, codes.OutOfRange},
	core.CodeQueueFull:          {http.StatusTooManyRequests, codes.ResourceExhausted},
	core.CodeQueueBytesFull:     {http.StatusTooManyRequests, codes.ResourceExhausted},
	core.CodeTooManyUpdates:     {http.StatusTooManyRequests, codes.ResourceExhausted},
	core.CodeRateLimited:        {http.StatusTooManyRequests, codes.ResourceExhausted},
	core.CodeReaderBehind:       {http.StatusTooManyRequests, codes.ResourceExhausted},

	// The node cannot serve it now; the same request may succeed later.
	core.CodeNoCapableWorker:       {http.StatusServiceUnavailable, codes.Unavailable},
	core.CodeDraining:              {http.StatusServiceUnavailable, codes.Unavailable},
	core.CodeDispatcherUnavailable: {http.StatusServiceUnavailable, codes.Unavailable},
	core.CodeCatalogUnavailable:    {http.StatusServiceUnavailable, codes.Unavailable},

	// A stream or worker session the node ended.
	core.CodeWriteFailed:   {http.StatusServiceUnavailable, codes.Unavailable},
	core.CodeSessionClosed: {http.StatusServiceUnavailable, codes.Unavailable},
	core.CodeSetupTimeout:  {http.StatusRequestTimeout, codes.DeadlineExceeded},
	// Unavailable, not DeadlineExceeded: the session was healthy once, and
	// a worker reconnects on Unavailable.
	core.CodeIdleTimeout: {http.StatusRequestTimeout, codes.Unavailable},

	// A job's terminal outcome.
	core.CodeCancelled:      {http.StatusConflict, codes.Canceled},
	core.CodeExpired:        {http.StatusGatewayTimeout, codes.DeadlineExceeded},
	core.CodeRejected:       {http.StatusUnprocessableEntity, codes.FailedPrecondition},
	core.CodeWorkerLost:     {http.StatusBadGateway, codes.Unavailable},
	core.CodeNodeShutdown:   {http.StatusServiceUnavailable, codes.Unavailable},
	core.CodeOutputTooLarge: {http.StatusBadGateway, codes.ResourceExhausted},
	core.CodeCreditExceeded: {http.StatusBadGateway, codes.ResourceExhausted},
	core.CodeTooLarge:       {http.StatusRequestEntityTooLarge, codes.ResourceExhausted},
	core.CodeBadOutput:      {http.StatusBadGateway, codes.Unknown},
	core.CodeWorkerError:    {http.StatusBadGateway, codes.Unknown},

	// The catalog's membership (docs/membership.md).
	core.CodeInvalidMember:         {http.StatusBadRequest, codes.InvalidArgument},
	core.CodeMemberNotFound:        {http.StatusNotFound, codes.NotFound},
	core.CodeMemberExists:          {http.StatusConflict, codes.AlreadyExists},
	core.CodeMemberRunning:         {http.StatusConflict, codes.FailedPrecondition},
	core.CodeQuorumAtRisk:          {http.StatusConflict, codes.FailedPrecondition},
	core.CodeMemberAddressUnusable: {http.StatusConflict, codes.FailedPrecondition},

	// A server fault.
	core.CodeInternal: {http.StatusInternalServerError, codes.Internal},
}

// HTTPStatus returns the HTTP status of code; 500 for a code it does not
// know (a newer peer's), which is shown with its code and detail all the
// same.
func HTTPStatus(code core.Code) int {
	if w, ok := table[code]; ok {
		return w.http
	}
	return http.StatusInternalServerError
}

// GRPCCode returns the gRPC code of code; Internal for a code it does not
// know.
func GRPCCode(code core.Code) codes.Code {
	if w, ok := table[code]; ok {
		return w.grpc
	}
	return codes.Internal
}

// internalDetail is the whole of what a client learns about a server fault.
const internalDetail = "the node could not complete the request"

// ErrorOf returns the core error err is or wraps, or, for any other error
// (a server fault), the internal error that stands for it on the wire.
func ErrorOf(err error) *core.Error {
	var ce *core.Error
	if errors.As(err, &ce) && ce != nil {
		return ce
	}
	return &core.Error{Code: core.CodeInternal, Detail: internalDetail}
}

// Codes returns every code of the table, sorted: the codes a node can
// answer with.
func Codes() []core.Code {
	return slices.Sorted(maps.Keys(table))
}
