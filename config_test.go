package switchyard_test

import (
	"errors"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/internal/coretest"
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
		{"advertise-peer-addr", func(c *switchyard.Config) { c.AdvertisePeerAddr = "0.0.0.0:7070" }},
		{"advertise-http-addr", func(c *switchyard.Config) { c.AdvertiseHTTPAddr = "node-1" }},
		{"advertise-grpc-addr", func(c *switchyard.Config) { c.AdvertiseGRPCAddr = "node-1:0" }},
		{"cluster-secret", func(c *switchyard.Config) { c.ClusterSecret = "too-short" }},
		{"peer-heartbeat-interval", func(c *switchyard.Config) { c.PeerHeartbeatInterval = 0 }},
		{"peer-failure-threshold", func(c *switchyard.Config) { c.PeerFailureThreshold = 0 }},
		{"peer-suspect-after", func(c *switchyard.Config) { c.PeerSuspectAfter = c.PeerFailureThreshold + 1 }},
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
			coretest.WantConfigError(t, c.Validate(), tc.flag)
		})
	}
}

// Without keys a node serves loopback addresses only, unless told
// --allow-anonymous; with keys, any address.
func TestAnonymousOnlyOnLoopback(t *testing.T) {
	for _, tc := range []struct {
		http, grpc string
		keys, anon bool
		flag       string
	}{
		{"127.0.0.1:8080", "127.0.0.1:9090", false, false, ""},
		{"127.0.0.2:0", "[::1]:0", false, false, ""},
		{"localhost:8080", "localhost:0", false, false, ""},
		{"0.0.0.0:8080", "127.0.0.1:9090", false, false, "http-addr"},
		{":8080", "127.0.0.1:9090", false, false, "http-addr"},
		{"127.0.0.1:8080", "[::]:9090", false, false, "grpc-addr"},
		{"127.0.0.1:8080", "10.0.0.5:9090", false, false, "grpc-addr"},
		{"127.0.0.1:8080", "node.example:9090", false, false, "grpc-addr"},
		{"0.0.0.0:8080", "0.0.0.0:9090", true, false, ""},
		{"0.0.0.0:8080", "0.0.0.0:9090", false, true, ""},
	} {
		cfg := switchyard.DefaultConfig()
		cfg.HTTPAddr, cfg.GRPCAddr, cfg.AllowAnonymous = tc.http, tc.grpc, tc.anon
		if tc.keys {
			cfg.Auth.File = "keys.yaml"
		}
		err := cfg.Validate()
		var ce *core.ConfigError
		switch {
		case tc.flag == "" && err != nil:
			t.Errorf("%s %s: %v", tc.http, tc.grpc, err)
		case tc.flag != "" && (!errors.As(err, &ce) || ce.Field != tc.flag || !strings.Contains(err.Error(), "--auth-file") || !strings.Contains(err.Error(), "--allow-anonymous")):
			t.Errorf("%s %s: %v, want a refusal of --%s naming both ways out", tc.http, tc.grpc, err, tc.flag)
		}
	}
}

// An embedded etcd member always serves TLS (given, or derived from the
// cluster secret), so it may listen anywhere; the members of an embedded
// cluster must be given their secret; TLS flags come in their sets.
func TestEtcdPerimeter(t *testing.T) {
	for _, tc := range []struct {
		name string
		mut  func(*switchyard.Config)
		flag string
	}{
		{"loopback", func(*switchyard.Config) {}, ""},
		{"client port exposed", func(c *switchyard.Config) { c.EtcdClientAddr = "0.0.0.0:2379" }, ""},
		{"peer port exposed", func(c *switchyard.Config) { c.EtcdPeerAddr = "10.1.2.3:2380" }, ""},
		{"exposed with TLS", func(c *switchyard.Config) {
			c.EtcdClientAddr, c.PeerTLSCert, c.PeerTLSKey, c.PeerTLSCA = "0.0.0.0:2379", "c.pem", "k.pem", "ca.pem"
		}, ""},
		{"external etcd", func(c *switchyard.Config) {
			c.EtcdClientAddr, c.EtcdEndpoints = "0.0.0.0:2379", []string{"https://etcd:2379"}
		}, ""},
		{"a member of a cluster without a secret", func(c *switchyard.Config) {
			c.EtcdClientAddr, c.EtcdPeerAddr = "127.0.0.1:23791", "127.0.0.1:23801"
			c.EtcdInitialCluster = "node-1=https://127.0.0.1:23801,node-2=https://127.0.0.1:23802,node-3=https://127.0.0.1:23803"
		}, "cluster-secret"},
		{"a member of a cluster with one", func(c *switchyard.Config) {
			c.EtcdClientAddr, c.EtcdPeerAddr = "127.0.0.1:23791", "127.0.0.1:23801"
			c.EtcdInitialCluster = "node-1=https://127.0.0.1:23801,node-2=https://127.0.0.1:23802,node-3=https://127.0.0.1:23803"
			c.ClusterSecret = "a-cluster-secret-of-16+"
		}, ""},
		{"cert without key", func(c *switchyard.Config) { c.TLSCert = "c.pem" }, "tls-cert"},
		{"peer cert without CA", func(c *switchyard.Config) { c.PeerTLSCert, c.PeerTLSKey = "c.pem", "k.pem" }, "peer-tls-cert"},
		{"etcd cert without key", func(c *switchyard.Config) { c.EtcdTLSCert = "c.pem" }, "etcd-tls-cert"},
	} {
		cfg := switchyard.DefaultConfig()
		tc.mut(&cfg)
		err := cfg.Validate()
		var ce *core.ConfigError
		switch {
		case tc.flag == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.flag != "" && (!errors.As(err, &ce) || ce.Field != tc.flag):
			t.Errorf("%s: %v, want a refusal of --%s", tc.name, err, tc.flag)
		}
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

// The profiling port stays on loopback unless told otherwise.
func TestDebugAddrOnlyOnLoopback(t *testing.T) {
	for _, tc := range []struct {
		addr   string
		remote bool
		ok     bool
	}{
		{"", false, true},
		{"127.0.0.1:6060", false, true},
		{"localhost:0", false, true},
		{"[::1]:6060", false, true},
		{"0.0.0.0:6060", false, false},
		{":6060", false, false},
		{"10.0.0.5:6060", false, false},
		{"0.0.0.0:6060", true, true},
		{"6060", true, false},
	} {
		cfg := switchyard.DefaultConfig()
		cfg.DebugAddr, cfg.DebugAllowRemote = tc.addr, tc.remote
		err := cfg.Validate()
		var ce *core.ConfigError
		switch {
		case tc.ok && err != nil:
			t.Errorf("%q remote=%v: %v", tc.addr, tc.remote, err)
		case !tc.ok && (!errors.As(err, &ce) || ce.Field != "debug-addr"):
			t.Errorf("%q remote=%v: %v, want a refusal of --debug-addr", tc.addr, tc.remote, err)
		}
	}
}
