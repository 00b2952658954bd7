package core_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/core"
)

func TestDefaultConfigIsValid(t *testing.T) {
	cfg := core.DefaultConfig()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("DefaultConfig().Validate() = %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		adjust func(*core.Config)
		field  string
	}{
		{"node name", func(c *core.Config) { c.Node = "" }, "name"},
		{"node name slash", func(c *core.Config) { c.Node = "a/b" }, "name"},
		{"zone", func(c *core.Config) { c.Zone = "eu west" }, "zone"},
		{"limits", func(c *core.Config) { c.Limits.MaxQueueDepth = 0 }, "max-queue-depth"},
		{"fraction zero", func(c *core.Config) { c.DispatchTimeoutFraction = 0 }, "dispatch-timeout-fraction"},
		{"fraction one", func(c *core.Config) { c.DispatchTimeoutFraction = 1 }, "dispatch-timeout-fraction"},
		{"floor", func(c *core.Config) { c.DispatchTimeoutFloor = 0 }, "dispatch-timeout-floor"},
		{"ceiling below floor", func(c *core.Config) { c.DispatchTimeoutCeiling = c.DispatchTimeoutFloor - 1 }, "dispatch-timeout"},
		{"history events", func(c *core.Config) { c.HistoryEvents = 0 }, "history-events"},
		{"history bytes", func(c *core.Config) { c.HistoryBytes = c.Limits.MaxInputBytes - 1 }, "history-bytes"},
		{"retention", func(c *core.Config) { c.Retention = 0 }, "retention"},
		{"retain jobs", func(c *core.Config) { c.RetainJobs = 0 }, "retain-jobs"},
		{"retain bytes", func(c *core.Config) { c.RetainBytes = c.HistoryBytes - 1 }, "retain-bytes"},
		{"expiry slack", func(c *core.Config) { c.ExpirySlack = -1 }, "expiry-slack"},
		{"transport without a cluster", func(c *core.Config) { c.Transport = nopTransport{} }, "transport"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := core.DefaultConfig()
			tt.adjust(&cfg)
			var ce *core.ConfigError
			if err := cfg.Validate(); !errors.As(err, &ce) || ce.Field != tt.field {
				t.Fatalf("Validate() = %v, want ConfigError for %s", err, tt.field)
			}
			cfg.Registerer = prometheus.NewRegistry()
			e, err := core.New(cfg)
			if e != nil || !errors.As(err, &ce) || ce.Field != tt.field {
				t.Fatalf("New() = %v, %v; want ConfigError for %s", e, err, tt.field)
			}
		})
	}
}

func TestNewRegistersMetrics(t *testing.T) {
	h := newHarness(t, nil)
	wantJobsTotal(t, h, map[core.Outcome]float64{})
	if v := h.metric("switchyard_workers_connected"); v != 0 {
		t.Errorf("workers_connected = %v", v)
	}
	if h.e.Config().Node != "node" || h.e.Draining() {
		t.Errorf("Config().Node = %q, Draining = %v", h.e.Config().Node, h.e.Draining())
	}
}

func TestEpochIdentifiesTheEngine(t *testing.T) {
	before := uint64(time.Now().UnixMilli())
	h := newHarness(t, nil)
	after := uint64(time.Now().UnixMilli())
	ep := h.e.Epoch()
	if ep < before || ep > after {
		t.Fatalf("Epoch = %d, want the creation time in ms [%d, %d]", ep, before, after)
	}
	if h.e.Epoch() != ep {
		t.Fatal("Epoch changed between calls")
	}
}

func TestAttachWorkerValidation(t *testing.T) {
	h := newHarness(t, nil)
	tests := []struct {
		name  string
		spec  core.WorkerSpec
		code  core.Code
		field string
	}{
		{"bad queue", core.WorkerSpec{Queue: "a/b"}, core.CodeInvalidQueueName, "queue"},
		{"empty queue", core.WorkerSpec{Queue: ""}, core.CodeInvalidQueueName, "queue"},
		{"bad capability", core.WorkerSpec{Queue: "q", Capabilities: []string{"model"}}, core.CodeInvalidWorker, "capabilities"},
		{"negative concurrency", core.WorkerSpec{Queue: "q", Concurrency: -1}, core.CodeInvalidWorker, "concurrency"},
		{"huge concurrency", core.WorkerSpec{Queue: "q", Concurrency: 10001}, core.CodeInvalidWorker, "concurrency"},
		{"long name", core.WorkerSpec{Queue: "q", Name: strings.Repeat("n", 129)}, core.CodeInvalidWorker, "name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, err := h.e.AttachWorker(context.Background(), tt.spec, &fakeConn{})
			if w != nil {
				t.Errorf("AttachWorker returned a worker with its error")
			}
			if ce := wantCode(t, err, tt.code); ce.Field != tt.field {
				t.Errorf("Field = %q, want %q", ce.Field, tt.field)
			}
		})
	}
	if v := h.metric("switchyard_workers_connected"); v != 0 {
		t.Errorf("refused workers were counted: workers_connected = %v", v)
	}
	// Concurrency 0 means 1.
	w, err := h.e.AttachWorker(context.Background(), core.WorkerSpec{Queue: "q", Name: "n"}, &fakeConn{})
	if err != nil || w.Concurrency != 1 || w.Queue != "q" || w.Name != "n" || !strings.HasPrefix(w.ID, "c_") {
		t.Fatalf("AttachWorker = %+v, %v", w, err)
	}
	if v := h.metric("switchyard_workers_connected"); v != 1 {
		t.Errorf("workers_connected = %v, want 1", v)
	}
	w.Detach(context.Background())
	w.Detach(context.Background()) // idempotent
	if v := h.metric("switchyard_workers_connected"); v != 0 {
		t.Errorf("workers_connected after Detach = %v, want 0", v)
	}
}

func TestUnknownJob(t *testing.T) {
	h := newHarness(t, nil)
	if _, err := h.e.Job("j_nope"); !errors.Is(err, core.ErrJobNotFound) {
		t.Errorf("Job = %v", err)
	}
	if _, err := h.e.View("j_nope"); !errors.Is(err, core.ErrJobNotFound) {
		t.Errorf("View = %v", err)
	}
	if _, err := h.e.Cancel("j_nope", "x"); !errors.Is(err, core.ErrJobNotFound) {
		t.Errorf("Cancel = %v", err)
	}
	// Stream bookkeeping on an unknown job is a no-op, not a panic.
	h.e.StreamOpened("j_nope", true)
	h.e.StreamClosed("j_nope", true, true)
}

// TestRetentionForgetsEndedJobs: an ended job stays readable for Retention,
// then is forgotten along with its idempotency key.
func TestRetentionForgetsEndedJobs(t *testing.T) {
	h := newHarness(t, func(c *core.Config) { c.Retention = 30 * time.Millisecond })
	_, _ = h.attach("q", 1)
	j, _, err := h.e.Submit(context.Background(), "q", env(time.Minute), core.SubmitOptions{IdempotencyKey: "k1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.e.Cancel(j.ID, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.e.Job(j.ID); err != nil {
		t.Fatalf("ended job not readable right after it ended: %v", err)
	}
	waitFor(t, 5*time.Second, "the ended job to be forgotten", func() bool {
		_, err := h.e.View(j.ID)
		return errors.Is(err, core.ErrJobNotFound)
	})
	j2, existing, err := h.e.Submit(context.Background(), "q", env(time.Minute), core.SubmitOptions{IdempotencyKey: "k1"})
	if err != nil || existing || j2.ID == j.ID {
		t.Fatalf("Submit with a forgotten key = %v, existing=%v, %v; want a new job", j2, existing, err)
	}
}

// nopTransport is a core.Transport that carries nothing.
type nopTransport struct{}

var _ core.Transport = nopTransport{}

func (nopTransport) Forward(context.Context, string, core.Delivery) error { return nil }
func (nopTransport) Send(string, core.Message)                            {}
func (nopTransport) Expect(string, string, uint64, string, time.Duration) {}
