package core_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/switchyard/switchyard/core"
)

// memStore is an IdempotencyStore in memory, as the catalog keeps one, with
// a switch to fail every call.
type memStore struct {
	mu       sync.Mutex
	recs     map[string]core.IdempotencyRecord
	ttls     []time.Duration
	released int
	fail     error
}

var _ core.IdempotencyStore = (*memStore)(nil)

func (m *memStore) ClaimKey(_ context.Context, key string, rec core.IdempotencyRecord, ttl time.Duration) (core.IdempotencyRecord, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return core.IdempotencyRecord{}, false, m.fail
	}
	if held, ok := m.recs[key]; ok {
		return held, false, nil
	}
	m.recs[key] = rec
	m.ttls = append(m.ttls, ttl)
	return rec, true, nil
}

func (m *memStore) ReleaseKey(_ context.Context, key string, rec core.IdempotencyRecord) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.recs[key] == rec {
		delete(m.recs, key)
		m.released++
	}
	return nil
}

// movedTo makes every record name a job of node that it does not have.
func (m *memStore) movedTo(node string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, r := range m.recs {
		r.Ingress, r.Job = node, "j_elsewhere"
		m.recs[k] = r
	}
}

func TestIdempotencyAcrossTheCluster(t *testing.T) {
	store := &memStore{recs: map[string]core.IdempotencyRecord{}}
	h, _, fc := oneWorker(t, func(c *core.Config) { c.Node, c.Idempotency = "n1", store })
	ctx := context.Background()
	alice := core.SubmitOptions{IdempotencyKey: "k", Owner: "alice"}

	j1, existing, err := h.e.Submit(ctx, "q", env(time.Minute), alice)
	if err != nil || existing {
		t.Fatalf("first: %v %v", err, existing)
	}
	if len(store.recs) != 1 || store.ttls[0] < time.Minute+time.Minute {
		t.Fatalf("the claim: %v, ttls %v: want one record outliving TTL plus retention", store.recs, store.ttls)
	}
	// A retry here, the body's white space aside: the same job.
	same := env(time.Minute)
	same.Input = json.RawMessage(`{ "prompt" : "hi" }`)
	if j, existing, err := h.e.Submit(ctx, "q", same, alice); err != nil || !existing || j != j1 {
		t.Fatalf("retry: %v %v", err, existing)
	}
	// Another body, another subject.
	other := env(time.Minute)
	other.Input = json.RawMessage(`"something else"`)
	_, _, err = h.e.Submit(ctx, "q", other, alice)
	wantCode(t, err, core.CodeIdempotencyReuse)
	bob := core.SubmitOptions{IdempotencyKey: "k", Owner: "bob"}
	if j, existing, err := h.e.Submit(ctx, "q", env(time.Minute), bob); err != nil || existing || j == j1 {
		t.Fatalf("bob's key k is another key: %v %v", err, existing)
	}
	if n := len(fc.Offers()); n != 1 {
		t.Fatalf("%d offers, want 1 (bob's job waits behind alice's)", n)
	}

	// A key the cluster holds for another node's job: JobElsewhere, or
	// the refusal of a different body.
	carol := core.SubmitOptions{IdempotencyKey: "c", Owner: "carol"}
	h2 := newHarness(t, func(c *core.Config) { c.Node, c.Idempotency = "n2", store })
	h2.attach("q", 1)
	if j, _, err := h.e.Submit(ctx, "q", env(time.Minute), carol); err != nil || j == nil {
		t.Fatal(err)
	}
	_, _, err = h2.e.Submit(ctx, "q", env(time.Minute), carol)
	var elsewhere *core.JobElsewhere
	if !errors.As(err, &elsewhere) || elsewhere.Node != "n1" {
		t.Fatalf("a retry through n2: %v, want the job on n1", err)
	}
	_, _, err = h2.e.Submit(ctx, "q", other, carol)
	wantCode(t, err, core.CodeIdempotencyReuse)

	// A refused submission releases its claim: a retry may make the job.
	full := env(time.Minute)
	full.Limits.MaxQueueDepth = 1
	dave := core.SubmitOptions{IdempotencyKey: "d", Owner: "dave"}
	_, _, err = h.e.Submit(ctx, "q", full, dave)
	wantCode(t, err, core.CodeQueueFull)
	if store.released != 1 {
		t.Fatalf("released %d claims, want 1", store.released)
	}
	// The catalog failing: the node refuses rather than risk a second job.
	store.fail = errors.New("etcd down")
	_, _, err = h.e.Submit(ctx, "q", env(time.Minute), core.SubmitOptions{IdempotencyKey: "e", Owner: "erin"})
	wantCode(t, err, core.CodeCatalogUnavailable)
	store.fail = nil
	// A record naming a job of this node it no longer has (ended and
	// evicted, or from before a restart).
	frank := core.SubmitOptions{IdempotencyKey: "f", Owner: "frank"}
	if _, _, err := h2.e.Submit(ctx, "q", env(time.Minute), frank); err != nil {
		t.Fatal(err)
	}
	store.movedTo("n1")
	_, _, err = h.e.Submit(ctx, "q", env(time.Minute), frank)
	wantCode(t, err, core.CodeJobNotFound)
}

// Concurrent submissions of one key on one node make one job: the others
// wait for the first to settle, and get its job.
func TestIdempotencyConcurrentOnOneNode(t *testing.T) {
	store := &memStore{recs: map[string]core.IdempotencyRecord{}}
	h := newHarness(t, func(c *core.Config) { c.Node, c.Idempotency = "n1", store })
	h.attach("q", 1)
	var wg sync.WaitGroup
	jobs := make([]*core.Job, 8)
	for i := range jobs {
		wg.Go(func() {
			j, _, err := h.e.Submit(context.Background(), "q", env(time.Minute), core.SubmitOptions{IdempotencyKey: "k", Owner: "a"})
			if err != nil {
				t.Error(err)
			}
			jobs[i] = j
		})
	}
	wg.Wait()
	for _, j := range jobs {
		if j != jobs[0] {
			t.Fatalf("two jobs for one key: %s, %s", jobs[0].ID, j.ID)
		}
	}
}
