package apierr_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/switchyard/switchyard/apierr"
	"github.com/switchyard/switchyard/core"
)

func TestStatus(t *testing.T) {
	for _, code := range []core.Code{core.CodeMalformedJSON, core.CodeQueueFull, core.CodeCatalogUnavailable, core.CodeIdempotencyReuse, "something_new"} {
		t.Run(string(code), func(t *testing.T) {
			st := status.Convert(apierr.Status(fmt.Errorf("wrapped: %w", &core.Error{Code: code, Detail: "why", Field: "f"})))
			if st.Code() != apierr.GRPCCode(code) || st.Message() != string(code)+": why" {
				t.Errorf("got %s %q, want %s %q", st.Code(), st.Message(), apierr.GRPCCode(code), string(code)+": why")
			}
			info := detail[*errdetails.ErrorInfo](st)
			if info.GetReason() != string(code) || info.GetDomain() != apierr.Domain || info.GetMetadata()["field"] != "f" {
				t.Errorf("ErrorInfo %v", info)
			}
			if detail[*errdetails.RetryInfo](st) != nil {
				t.Error("RetryInfo without a RetryAfter")
			}
		})
	}

	st := status.Convert(apierr.Status(&core.Error{Code: core.CodeNoCapableWorker, Detail: "none", RetryAfter: 1500 * time.Millisecond}))
	if d := detail[*errdetails.RetryInfo](st).GetRetryDelay().AsDuration(); d != 1500*time.Millisecond {
		t.Errorf("retry delay %s", d)
	}
	if got := status.Code(apierr.Status(context.Canceled)); got != codes.Canceled {
		t.Errorf("context.Canceled → %s", got)
	}
	if got := status.Code(apierr.Status(fmt.Errorf("publish: %w", context.DeadlineExceeded))); got != codes.DeadlineExceeded {
		t.Errorf("context.DeadlineExceeded → %s", got)
	}
	if apierr.Status(nil) != nil {
		t.Error("Status(nil) is not nil")
	}
}

// A server fault shows as Internal with a fixed message, never its own
// text, even when it is another system's gRPC status.
func TestStatusHidesServerFaults(t *testing.T) {
	for _, err := range []error{
		errors.New("disk on fire"),
		fmt.Errorf("publish consumer: %w", status.Error(codes.Unavailable, "etcdserver: leader changed")),
	} {
		st := status.Convert(apierr.Status(err))
		if st.Code() != codes.Internal || st.Message() != "internal: the node could not complete the request" {
			t.Errorf("%v shows %s %q", err, st.Code(), st.Message())
		}
		if info := detail[*errdetails.ErrorInfo](st); info.GetReason() != string(core.CodeInternal) {
			t.Errorf("%v: ErrorInfo %v", err, info)
		}
	}
}

// The one answer to every bad resume token is the same status, byte for
// byte: a caller probing tokens learns nothing from it.
func TestStatusInvalidResumeTokenIsOneAnswer(t *testing.T) {
	a, b := status.Convert(apierr.Status(core.ErrInvalidResumeToken)), status.Convert(apierr.Status(core.ErrInvalidResumeToken))
	if a.Code() != codes.InvalidArgument || a.Message() != "invalid_resume_token: the resume token is not valid for this stream" {
		t.Fatalf("%s %q", a.Code(), a.Message())
	}
	if !proto.Equal(a.Proto(), b.Proto()) {
		t.Fatalf("two refusals differ: %v, %v", a.Proto(), b.Proto())
	}
}

func TestFromStatusReversesStatus(t *testing.T) {
	for _, ce := range []*core.Error{
		{Code: core.CodeInvalidField, Detail: "zone must be 1-128 of [A-Za-z0-9._-]", Field: "zone"},
		{Code: core.CodeQueueFull, Detail: "the queue holds its maximum number of waiting jobs", RetryAfter: time.Second},
		{Code: core.CodeJobNotFound, Detail: "no job: with a colon"},
		{Code: core.CodeInternal, Detail: "the node could not complete the request"},
		{Code: "something_new", Detail: "from a newer peer"},
	} {
		got := apierr.FromStatus(status.Convert(apierr.Status(ce)))
		if *got != *ce {
			t.Errorf("FromStatus(Status(%+v)) = %+v", ce, got)
		}
	}
}

func TestFromStatusOfForeignStatuses(t *testing.T) {
	for _, tc := range []struct {
		st         *status.Status
		want       core.Code
		wantDetail string
	}{
		// The gateway refusing a body it could not decode.
		{status.New(codes.InvalidArgument, "proto: syntax error (line 1:2): unexpected token"), core.CodeMalformedJSON, "proto: syntax error (line 1:2): unexpected token"},
		{status.New(codes.Unavailable, "connection refused"), core.CodeInternal, "the node could not complete the request"},
		{status.New(codes.Canceled, "context canceled"), core.CodeInternal, "the node could not complete the request"},
	} {
		got := apierr.FromStatus(tc.st)
		if got.Code != tc.want || got.Detail != tc.wantDetail {
			t.Errorf("FromStatus(%s %q) = %+v, want %s %q", tc.st.Code(), tc.st.Message(), got, tc.want, tc.wantDetail)
		}
	}
	// An ErrorInfo of another domain is not ours to read.
	other, _ := status.New(codes.NotFound, "nope").WithDetails(&errdetails.ErrorInfo{Reason: "job_not_found", Domain: "elsewhere"})
	if got := apierr.FromStatus(other); got.Code != core.CodeInternal {
		t.Errorf("another domain's ErrorInfo read as %+v", got)
	}
	if apierr.FromStatus(nil) != nil || apierr.FromStatus(status.New(codes.OK, "")) != nil {
		t.Error("FromStatus of no error is not nil")
	}
}

func TestErrorOf(t *testing.T) {
	ce := &core.Error{Code: core.CodeDraining, Detail: "later"}
	if got := apierr.ErrorOf(fmt.Errorf("submit: %w", ce)); got != ce {
		t.Errorf("ErrorOf(wrapped) = %+v", got)
	}
	if got := apierr.ErrorOf(errors.New("secret path /var/lib/x")); got.Code != core.CodeInternal || strings.Contains(got.Detail, "secret") {
		t.Errorf("ErrorOf(raw) = %+v", got)
	}
}

func detail[T proto.Message](st *status.Status) T {
	var zero T
	for _, d := range st.Details() {
		if v, ok := d.(T); ok {
			return v
		}
	}
	return zero
}
