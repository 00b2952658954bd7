package core_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/internal/coretest"
)

// A worker's registration is published with this node and zone and
// withdrawn on detach; a consumer on another node does not make a job
// acceptable while this node cannot route to it.
func TestCatalogRecordsAndRemoteConsumers(t *testing.T) {
	cat := &coretest.Catalog{}
	cfg := testConfig(prometheus.NewRegistry())
	cfg.Node, cfg.Zone, cfg.Catalog = "n1", "z1", cat
	e, err := core.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	w, err := e.AttachWorker(t.Context(), core.WorkerSpec{Queue: "q", Name: "w", Capabilities: []string{"model=a"}, Concurrency: 2}, &fakeConn{})
	if err != nil {
		t.Fatal(err)
	}
	got := cat.Consumers("q")
	if len(got) != 1 || got[0].ID != w.ID || got[0].Node != "n1" || got[0].Zone != "z1" || got[0].Concurrency != 2 || !got[0].Capabilities.Satisfies(map[string]string{"model": "a"}) {
		t.Fatalf("published %+v", got)
	}
	w.Detach(t.Context())
	if got := cat.Consumers("q"); len(got) != 0 {
		t.Fatalf("after detach: %+v", got)
	}

	caps, _ := core.ParseCapabilities([]string{"model=a"})
	_ = cat.PublishConsumer(t.Context(), core.ConsumerInfo{ID: "c_remote", Queue: "q", Node: "n2", Capabilities: caps, Concurrency: 1})
	_, _, err = e.Submit(t.Context(), "q", env(0), core.SubmitOptions{})
	if !errors.Is(err, core.ErrNoCapableWorker) {
		t.Fatalf("submit with only a remote consumer: %v, want no_capable_worker until remote routing exists", err)
	}
}

// A catalog write that fails refuses the registration or the update with
// catalog_unavailable, a code the caller may retry on; the catalog's own
// error stays on the node. A caller that left gets its context's error.
func TestCatalogWriteFailureIsCatalogUnavailable(t *testing.T) {
	cat := &coretest.Catalog{}
	cfg := testConfig(prometheus.NewRegistry())
	cfg.Node, cfg.Catalog = "n1", cat
	e, err := core.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	w, err := e.AttachWorker(t.Context(), core.WorkerSpec{Queue: "q", Capabilities: []string{"model=a"}}, &fakeConn{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Detach(t.Context())

	cat.SetPublish(func(context.Context, core.ConsumerInfo) error { return errors.New("etcdserver: request timed out") })
	unavailable := &core.Error{Code: core.CodeCatalogUnavailable}
	for name, err := range map[string]error{
		"attach": func() error {
			_, err := e.AttachWorker(t.Context(), core.WorkerSpec{Queue: "q"}, &fakeConn{})
			return err
		}(),
		"update": w.UpdateCapabilities(t.Context(), []string{"model=b"}),
	} {
		var ce *core.Error
		if !errors.Is(err, unavailable) || !errors.As(err, &ce) || ce.RetryAfter <= 0 || strings.Contains(ce.Detail, "etcdserver") {
			t.Errorf("%s: %v, want catalog_unavailable with a retry hint and without the cause", name, err)
		}
	}
	if got := len(e.QueueStats()); got != 1 || e.QueueStats()[0].Workers != 1 {
		t.Errorf("queue stats %+v, want the one worker: a refused registration registers nothing", e.QueueStats())
	}

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := e.AttachWorker(ctx, core.WorkerSpec{Queue: "q"}, &fakeConn{}); !errors.Is(err, context.Canceled) {
		t.Errorf("attach of a caller that left: %v, want context.Canceled", err)
	}
}
