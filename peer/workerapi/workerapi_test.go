package workerapi

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/switchyard/switchyard/core"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConfigValidate(t *testing.T) {
	ok := DefaultConfig()
	for _, tc := range []struct {
		name  string
		mut   func(*Config)
		field string
	}{
		{"default", func(*Config) {}, ""},
		{"no setup", func(c *Config) { c.SetupTimeout = 0 }, "worker-setup-timeout"},
		{"no heartbeat", func(c *Config) { c.HeartbeatInterval = 0 }, "heartbeat-interval"},
		{"idle below two heartbeats", func(c *Config) { c.IdleTimeout = c.HeartbeatInterval*2 - time.Millisecond }, "worker-idle-timeout"},
		{"idle at two heartbeats", func(c *Config) { c.IdleTimeout = c.HeartbeatInterval * 2 }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.mut(&c)
			err := c.Validate()
			var ce *core.ConfigError
			switch {
			case tc.field == "" && err != nil:
				t.Fatalf("got %v, want valid", err)
			case tc.field != "" && (!errors.As(err, &ce) || ce.Field != tc.field):
				t.Fatalf("got %v, want a ConfigError naming %s", err, tc.field)
			}
		})
	}
}

func TestToStatus(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want codes.Code
	}{
		{&core.Error{Code: core.CodeInvalidQueueName}, codes.InvalidArgument},
		{&core.Error{Code: core.CodeInvalidWorker}, codes.InvalidArgument},
		{&core.Error{Code: core.CodeDraining}, codes.Unavailable},
		{&core.Error{Code: core.CodeQueueFull}, codes.ResourceExhausted},
		{&core.Error{Code: core.CodeJobNotFound}, codes.NotFound},
		{&core.Error{Code: core.CodeTTLOutOfRange}, codes.OutOfRange},
		{context.Canceled, codes.Canceled},
		{context.DeadlineExceeded, codes.DeadlineExceeded},
		{errors.New("catalog down"), codes.Unavailable},
	} {
		if got := status.Code(toStatus(tc.err)); got != tc.want {
			t.Errorf("toStatus(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
	if toStatus(nil) != nil {
		t.Error("toStatus(nil) must be nil")
	}
}
