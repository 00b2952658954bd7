package grpcapi

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/resume"
)

func TestGRPCToStatus(t *testing.T) {
	for _, tc := range []struct {
		code core.Code
		want codes.Code
	}{
		{core.CodeMalformedJSON, codes.InvalidArgument},
		{core.CodeInvalidField, codes.InvalidArgument},
		{core.CodeUnsupportedVersion, codes.InvalidArgument},
		{core.CodeMissingInput, codes.InvalidArgument},
		{core.CodeInvalidQueueName, codes.InvalidArgument},
		{CodeInvalidResumeToken, codes.InvalidArgument},
		{core.CodeInputTooLarge, codes.OutOfRange},
		{core.CodeTTLOutOfRange, codes.OutOfRange},
		{core.CodeLimitAboveCeiling, codes.OutOfRange},
		{core.CodeQueueFull, codes.ResourceExhausted},
		{core.CodeQueueBytesFull, codes.ResourceExhausted},
		{core.CodeNoCapableWorker, codes.Unavailable},
		{core.CodeDraining, codes.Unavailable},
		{core.CodeJobNotFound, codes.NotFound},
		{core.CodeIdempotencyReuse, codes.AlreadyExists},
		{core.Code("something_new"), codes.Internal},
	} {
		err := toStatus(fmt.Errorf("wrapped: %w", &core.Error{Code: tc.code, Detail: "why", Field: "f"}))
		st := status.Convert(err)
		if st.Code() != tc.want || st.Message() != string(tc.code)+": why" {
			t.Errorf("%s: %s %q, want %s %q", tc.code, st.Code(), st.Message(), tc.want, string(tc.code)+": why")
		}
		info := detail[*errdetails.ErrorInfo](st)
		if info.GetReason() != string(tc.code) || info.GetDomain() != ErrorDomain || info.GetMetadata()["field"] != "f" {
			t.Errorf("%s: ErrorInfo %v", tc.code, info)
		}
		if detail[*errdetails.RetryInfo](st) != nil {
			t.Errorf("%s: RetryInfo without a RetryAfter", tc.code)
		}
	}

	st := status.Convert(toStatus(&core.Error{Code: core.CodeNoCapableWorker, Detail: "none", RetryAfter: 1500 * time.Millisecond}))
	if d := detail[*errdetails.RetryInfo](st).GetRetryDelay().AsDuration(); d != 1500*time.Millisecond {
		t.Errorf("retry delay %s", d)
	}
	if st := status.Convert(toStatus(errors.New("disk on fire"))); st.Code() != codes.Internal || st.Message() != "internal: the node could not complete the request" {
		t.Errorf("a server fault shows %s %q", st.Code(), st.Message())
	}
	if got := status.Code(toStatus(context.Canceled)); got != codes.Canceled {
		t.Errorf("context.Canceled → %s", got)
	}
	if got := status.Code(toStatus(context.DeadlineExceeded)); got != codes.DeadlineExceeded {
		t.Errorf("context.DeadlineExceeded → %s", got)
	}
	if toStatus(nil) != nil {
		t.Error("toStatus(nil) is not nil")
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

func TestGRPCInvalidResumeTokenIsOneAnswer(t *testing.T) {
	a, b := status.Convert(invalidResumeToken()), status.Convert(invalidResumeToken())
	if a.Code() != codes.InvalidArgument || a.Message() != "invalid_resume_token: the resume token is not valid for this stream" {
		t.Fatalf("%s %q", a.Code(), a.Message())
	}
	if !proto.Equal(a.Proto(), b.Proto()) {
		t.Fatalf("two refusals differ: %v, %v", a.Proto(), b.Proto())
	}
}

func TestGRPCParseTypes(t *testing.T) {
	if f, err := parseTypes(nil); f != nil || err != nil {
		t.Errorf("no types: %v, %v", f, err)
	}
	f, err := parseTypes([]string{" output", "done "})
	if err != nil || len(f) != 2 || !f[core.EventOutput] || !f[core.EventDone] {
		t.Errorf("types: %v, %v", f, err)
	}
	for _, bad := range [][]string{{"output", "bogus"}, {""}, {"output,done"}, {"heartbeat"}, {"terminated"}} {
		if _, err := parseTypes(bad); status.Code(toStatus(err)) != codes.InvalidArgument {
			t.Errorf("types %q: %v", bad, err)
		}
	}
}

// The fingerprints are the ones httpapi computes: a token binds the same
// caller and filter whichever transport issued it.
func TestGRPCFingerprintsMatchHTTP(t *testing.T) {
	if filterFingerprint(nil) != resume.Fingerprint("types", "*") {
		t.Error("no filter")
	}
	f1, _ := parseTypes([]string{"output", "done"})
	f2, _ := parseTypes([]string{"done", "output"})
	if filterFingerprint(f1) != filterFingerprint(f2) || filterFingerprint(f1) != resume.Fingerprint("types", "done", "output") {
		t.Error("a filter's fingerprint depends on the order of its types")
	}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer x"))
	if callerFingerprint(ctx) != resume.Fingerprint("authorization", "Bearer x") {
		t.Error("caller with authorization")
	}
	if callerFingerprint(context.Background()) != resume.Fingerprint("authorization", "") {
		t.Error("caller without authorization")
	}
}

func TestGRPCEventData(t *testing.T) {
	j := &core.Job{ID: "j_1"}
	for _, tc := range []struct{ data, want string }{
		{`{"data":"x"}`, `{"job_id":"j_1","gen":1,"seq":3,"snap":9,"attempt":2,"data":"x"}`},
		{`{}`, `{"job_id":"j_1","gen":1,"seq":3,"snap":9,"attempt":2}`},
		{` { } `, `{"job_id":"j_1","gen":1,"seq":3,"snap":9,"attempt":2}`},
		{``, `{"job_id":"j_1","gen":1,"seq":3,"snap":9,"attempt":2}`},
	} {
		if got := string(eventData(j, core.Event{Seq: 3, Gen: 2, Data: []byte(tc.data)}, 9)); got != tc.want {
			t.Errorf("eventData(%q) = %s, want %s", tc.data, got, tc.want)
		}
	}
}

func TestGRPCConfigValidate(t *testing.T) {
	ring, err := resume.NewKeyring("k0", resume.GenerateKey("k0"))
	if err != nil {
		t.Fatal(err)
	}
	good := JobConfig{Stream: policy(), Keyring: ring, TokenTTL: time.Hour}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]JobConfig{
		"no keyring": {Stream: policy(), TokenTTL: time.Hour},
		"ttl":        {Stream: policy(), Keyring: ring, TokenTTL: time.Millisecond},
		"policy":     {Stream: func() JobConfig { p := good; p.Stream.Heartbeat = p.Stream.Idle; return p }().Stream, Keyring: ring, TokenTTL: time.Hour},
	} {
		var ce *core.ConfigError
		if err := c.Validate(); !errors.As(err, &ce) {
			t.Errorf("%s: %v, want a ConfigError", name, err)
		}
	}
}
