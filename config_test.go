package switchyard_test

import (
	"errors"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/core"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Config errors name the flag an operator has to fix.
func TestConfigValidateNamesTheFlag(t *testing.T) {
	for _, tc := range []struct {
		flag string
		mut  func(*switchyard.Config)
	}{
		{"", func(*switchyard.Config) {}},
		{"http-addr", func(c *switchyard.Config) { c.HTTPAddr = "8080" }},
		{"grpc-addr", func(c *switchyard.Config) { c.GRPCAddr = "" }},
		{"http-write-buffer", func(c *switchyard.Config) { c.HTTP.WriteBuffer = -1 }},
		{"peer-addr", func(c *switchyard.Config) { c.PeerAddr = "nohost" }},
		{"cluster-secret", func(c *switchyard.Config) { c.ClusterSecret = "too-short" }},
		{"peer-heartbeat-interval", func(c *switchyard.Config) { c.PeerHeartbeatInterval = 0 }},
		{"peer-failure-threshold", func(c *switchyard.Config) { c.PeerFailureThreshold = 0 }},
		{"data-dir", func(c *switchyard.Config) { c.DataDir = "" }},
		{"lease-ttl", func(c *switchyard.Config) { c.LeaseTTL = 0 }},
		{"drain-timeout", func(c *switchyard.Config) { c.DrainTimeout = -1 }},
		{"max-message-bytes", func(c *switchyard.Config) { c.MaxMessageBytes = 1024 }},
		{"name", func(c *switchyard.Config) { c.Name = "a/b" }},
		{"zone", func(c *switchyard.Config) { c.Zone = "eu west" }},
		{"max-queue-depth", func(c *switchyard.Config) { c.Engine.Limits.MaxQueueDepth = 0 }},
		{"default-ttl", func(c *switchyard.Config) { c.Engine.Limits.DefaultTTL = c.Engine.Limits.MaxTTL * 2 }},
		{"stream-heartbeat", func(c *switchyard.Config) { c.HTTP.Stream.Heartbeat = c.HTTP.Stream.Idle }},
		{"retain-jobs", func(c *switchyard.Config) { c.Engine.RetainJobs = 0 }},
		{"retain-bytes", func(c *switchyard.Config) { c.Engine.RetainBytes = c.Engine.HistoryBytes - 1 }},
		{"worker-idle-timeout", func(c *switchyard.Config) { c.Workers.IdleTimeout = c.Workers.HeartbeatInterval }},
		{"worker-setup-timeout", func(c *switchyard.Config) { c.Workers.SetupTimeout = 0 }},
		// A stream bound at or above the history's: a slow stream would get
		// resync instead of terminate-and-resume.
		{"stream-max-events", func(c *switchyard.Config) { c.HTTP.Stream.MaxLagEvents = c.Engine.HistoryEvents }},
		{"stream-max-bytes", func(c *switchyard.Config) { c.HTTP.Stream.MaxLagBytes = c.Engine.HistoryBytes }},
		{"stream-max-bytes", func(c *switchyard.Config) { c.Engine.HistoryBytes = c.HTTP.Stream.MaxLagBytes - 1 }},
		{"", func(c *switchyard.Config) { // just below the history's bounds: fine
			c.HTTP.Stream.MaxLagEvents, c.HTTP.Stream.MaxLagBytes = c.Engine.HistoryEvents-1, c.Engine.HistoryBytes-1
		}},
		// An output window above the stream bound: a paced stream would
		// hold more than any stream may.
		{"output-window-events", func(c *switchyard.Config) { c.Engine.OutputWindowEvents = c.HTTP.Stream.MaxLagEvents + 1 }},
		{"output-window-bytes", func(c *switchyard.Config) { c.Engine.OutputWindowBytes = c.HTTP.Stream.MaxLagBytes + 1 }},
		{"output-window-events", func(c *switchyard.Config) { c.Engine.OutputWindowEvents = -1 }},
		{"", func(c *switchyard.Config) { // at the stream bound: fine
			c.Engine.OutputWindowEvents, c.Engine.OutputWindowBytes = c.HTTP.Stream.MaxLagEvents, c.HTTP.Stream.MaxLagBytes
		}},
		{"stream-stall-timeout", func(c *switchyard.Config) { c.HTTP.Stream.Stall = c.HTTP.Stream.WriteTimeout }},
	} {
		t.Run(tc.flag, func(t *testing.T) {
			c := switchyard.DefaultConfig()
			tc.mut(&c)
			err := c.Validate()
			var ce *core.ConfigError
			if tc.flag == "" {
				if err != nil {
					t.Fatalf("default config: %v", err)
				}
				return
			}
			if !errors.As(err, &ce) || ce.Field != tc.flag || !strings.Contains(err.Error(), "--"+tc.flag+"=") {
				t.Fatalf("got %v, want a ConfigError naming --%s", err, tc.flag)
			}
		})
	}
}

// An output window left at 0 is half the streams' bound, and follows it.
func TestOutputWindowDefaultsToHalfTheStreamBound(t *testing.T) {
	c := switchyard.DefaultConfig()
	c.HTTP.Stream.MaxLagEvents, c.HTTP.Stream.MaxLagBytes = 64, 1<<20
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if e, b := c.Engine.OutputWindowEvents, c.Engine.OutputWindowBytes; e != 32 || b != 512<<10 {
		t.Fatalf("window %d outputs, %d bytes; want half the stream bound: 32, %d", e, b, 512<<10)
	}
}
