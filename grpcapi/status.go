package grpcapi

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/switchyard/switchyard/core"
)

// CodeInvalidResumeToken is the one answer to every resume token that does
// not verify, whatever the reason. It is the code httpapi uses for the same
// refusal; clients match on it.
const CodeInvalidResumeToken core.Code = "invalid_resume_token"

// ErrorDomain is the google.rpc.ErrorInfo domain of every status this
// service returns with a code.
const ErrorDomain = "switchyard"

// invalidResumeToken is the status of every refused resume token: the same
// code, message and details whatever the reason, so a caller probing tokens
// learns nothing from the answer. The reason is only logged and counted.
func invalidResumeToken() error {
	return toStatus(&core.Error{Code: CodeInvalidResumeToken, Detail: "the resume token is not valid for this stream"})
}

// grpcCode is the one place this transport maps a stable code to a gRPC
// code. It follows httpapi's statusOf: 400 → InvalidArgument, 413 and 422 →
// OutOfRange (as the worker API does), 429 → ResourceExhausted, 503 →
// Unavailable, 404 → NotFound, 409 → AlreadyExists, anything else →
// Internal.
func grpcCode(code core.Code) codes.Code {
	switch code {
	case core.CodeMalformedJSON, core.CodeInvalidField, core.CodeUnsupportedVersion,
		core.CodeMissingInput, core.CodeInvalidQueueName, CodeInvalidResumeToken:
		return codes.InvalidArgument
	case core.CodeInputTooLarge, core.CodeTTLOutOfRange, core.CodeLimitAboveCeiling:
		return codes.OutOfRange
	case core.CodeQueueFull, core.CodeQueueBytesFull:
		return codes.ResourceExhausted
	case core.CodeNoCapableWorker, core.CodeDraining, core.CodeDispatcherUnavailable:
		return codes.Unavailable
	case core.CodeJobNotFound:
		return codes.NotFound
	case core.CodeIdempotencyReuse:
		return codes.AlreadyExists
	}
	return codes.Internal
}

// toStatus maps an engine error to a gRPC status. The message is
// "<code>: <detail>", the code being the same stable string the HTTP API
// puts in its problem documents; the status also carries an ErrorInfo
// (reason = the code, metadata "field" when one field is at fault) and, for
// a refusal that may succeed later, a RetryInfo. Errors that are not a
// core.Error are server faults: they are shown only as "internal" (the
// caller logs them).
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return status.FromContextError(err).Err()
	}
	var ce *core.Error
	if !errors.As(err, &ce) {
		return status.Error(codes.Internal, "internal: the node could not complete the request")
	}
	st := status.New(grpcCode(ce.Code), fmt.Sprintf("%s: %s", ce.Code, ce.Detail))
	info := &errdetails.ErrorInfo{Reason: string(ce.Code), Domain: ErrorDomain}
	if ce.Field != "" {
		info.Metadata = map[string]string{"field": ce.Field}
	}
	details := []protoadapt.MessageV1{info}
	if ce.RetryAfter > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(ce.RetryAfter)})
	}
	if withDetails, derr := st.WithDetails(details...); derr == nil {
		st = withDetails
	}
	return st.Err()
}
