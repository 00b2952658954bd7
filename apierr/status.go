package apierr

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/switchyard/switchyard/core"
)

// Domain is the google.rpc.ErrorInfo domain of every status Status builds.
const Domain = "switchyard"

// Status returns the gRPC status error a call that failed with err ends
// with (nil for nil). The status has the table's code for the error's code
// and the message "<code>: <detail>", the code being the string the HTTP
// API puts in its problem documents; it carries a google.rpc.ErrorInfo
// (reason = the code, domain "switchyard", metadata "field" when one field
// is at fault) and, for a refusal that may succeed later, a RetryInfo.
//
// context.Canceled and context.DeadlineExceeded pass through as their own
// statuses: the caller left or ran out of time, and nobody reads more. Any
// other error that is not a *core.Error is a server fault: Internal with
// the fixed message "internal: the node could not complete the request",
// never its own text. That includes statuses made elsewhere (an etcd
// client's, say): their codes and messages are another system's and are
// not passed on.
func Status(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return status.FromContextError(err).Err()
	}
	return statusOf(ErrorOf(err)).Err()
}

func statusOf(ce *core.Error) *status.Status {
	st := status.New(GRPCCode(ce.Code), fmt.Sprintf("%s: %s", ce.Code, ce.Detail))
	info := &errdetails.ErrorInfo{Reason: string(ce.Code), Domain: Domain}
	if ce.Field != "" {
		info.Metadata = map[string]string{"field": ce.Field}
	}
	details := []protoadapt.MessageV1{info}
	if ce.RetryAfter > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(ce.RetryAfter)})
	}
	// WithDetails fails only for a status with code OK, which no table
	// entry has.
	if withDetails, err := st.WithDetails(details...); err == nil {
		st = withDetails
	}
	return st
}

// FromStatus returns the core error a status carries: the reverse of
// Status, for a handler that receives statuses and writes problem documents
// (the grpc-gateway's error handler). It is nil for nil or OK.
//
// A status without a Switchyard ErrorInfo was not made by Status. One with
// InvalidArgument is the gateway's own refusal of a request body it could
// not decode, and becomes malformed_json with the status message as its
// detail; any other (a transport failure, a context's end) is answered as a
// server fault, code internal.
func FromStatus(st *status.Status) *core.Error {
	if st == nil || st.Code() == codes.OK {
		return nil
	}
	var info *errdetails.ErrorInfo
	var retry *errdetails.RetryInfo
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			if d.GetDomain() == Domain && info == nil {
				info = d
			}
		case *errdetails.RetryInfo:
			retry = d
		}
	}
	switch {
	case info != nil:
		return &core.Error{
			Code:       core.Code(info.GetReason()),
			Detail:     strings.TrimPrefix(st.Message(), info.GetReason()+": "),
			Field:      info.GetMetadata()["field"],
			RetryAfter: retry.GetRetryDelay().AsDuration(),
		}
	case st.Code() == codes.InvalidArgument:
		return &core.Error{Code: core.CodeMalformedJSON, Detail: st.Message()}
	}
	return &core.Error{Code: core.CodeInternal, Detail: internalDetail}
}
