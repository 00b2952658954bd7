package grpcapi

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/switchyard/switchyard/apierr"
	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/resume"
	"github.com/switchyard/switchyard/core/stream"
)

func TestGRPCParseTypes(t *testing.T) {
	if f, err := stream.ParseTypes(nil); f != nil || err != nil {
		t.Errorf("no types: %v, %v", f, err)
	}
	f, err := stream.ParseTypes([]string{" output", "done "})
	if err != nil || len(f) != 2 || !f[core.EventOutput] || !f[core.EventDone] {
		t.Errorf("types: %v, %v", f, err)
	}
	for _, bad := range [][]string{{"output", "bogus"}, {""}, {"output,done"}, {"heartbeat"}, {"terminated"}} {
		if _, err := stream.ParseTypes(bad); status.Code(apierr.Status(err)) != codes.InvalidArgument {
			t.Errorf("types %q: %v", bad, err)
		}
	}
}

// The fingerprints are the ones httpapi computes: a token binds the same
// caller and filter whichever transport issued it.
func TestGRPCFingerprintsMatchHTTP(t *testing.T) {
	if stream.FilterFingerprint(nil) != resume.Fingerprint("types", "*") {
		t.Error("no filter")
	}
	f1, _ := stream.ParseTypes([]string{"output", "done"})
	f2, _ := stream.ParseTypes([]string{"done", "output"})
	if stream.FilterFingerprint(f1) != stream.FilterFingerprint(f2) || stream.FilterFingerprint(f1) != resume.Fingerprint("types", "done", "output") {
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
		if got := string(stream.EventData(j, core.Event{Seq: 3, Gen: 2, Stream: 1, Data: []byte(tc.data)}, 9)); got != tc.want {
			t.Errorf("stream.EventData(%q) = %s, want %s", tc.data, got, tc.want)
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
