package core_test

import (
	"context"
	"encoding/json"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/internal/promtest"
)

// lastOfferConn is a core.WorkerConn that keeps only the last offer, so a
// benchmark of thousands of jobs measures the engine's memory, not the
// fake's.
type lastOfferConn struct {
	mu   sync.Mutex
	last core.Offer
}

func (c *lastOfferConn) SendOffer(o core.Offer) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	o.Input, o.Options = nil, nil
	c.last = o
	return nil
}

func (c *lastOfferConn) SendCancel(string, uint64, core.Code) error         { return nil }
func (c *lastOfferConn) SendCredit(string, uint64, core.OutputCredit) error { return nil }
func (c *lastOfferConn) Close(error)                                        {}

func (c *lastOfferConn) offer() core.Offer {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// BenchmarkEndedJobMemory measures what one ended job costs its ingress
// node while it is retained for late readers: the load of `make soak` (a
// streamed job whose worker sends 16 outputs of 32 bytes, then completes),
// nothing evicted. It reports the live heap per ended job after a GC
// (heap-B/job) and what the engine accounts for it against --retain-bytes
// (accounted-B/job). Run with -benchtime 20000x: each iteration is a job.
//
// The heap figure includes what is not the ended job's but grows with
// jobs all the same: the dispatcher's forward-idempotency entry (kept for
// the job's TTL) and allocator rounding. Before ended jobs were trimmed
// and packed it was 5.1 KB; after, 2.8 KB (2.5 KB accounted).
func BenchmarkEndedJobMemory(b *testing.B) {
	reg := prometheus.NewRegistry()
	cfg := testConfig(reg)
	cfg.Retention = time.Hour
	e, err := core.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	conn := &lastOfferConn{}
	w, err := e.AttachWorker(context.Background(), core.WorkerSpec{
		Queue: "q", Name: "w", Capabilities: []string{"model=demo"}, Concurrency: 1,
	}, conn)
	if err != nil {
		b.Fatal(err)
	}
	word := strings.Repeat("x", 31) + " "
	input, _ := json.Marshal(strings.Repeat(word, 16))
	outputs := make([][]byte, 16)
	for i := range outputs {
		outputs[i], _ = json.Marshal(word)
	}
	result := json.RawMessage(`{"words":16}`)
	run := func() {
		env := &core.Envelope{
			Version: 1, TTL: time.Minute, Input: append(json.RawMessage(nil), input...),
			Options:      json.RawMessage(`{"delay_ms":0}`),
			Capabilities: map[string]string{"model": "demo"},
		}
		j, _, err := e.Submit(context.Background(), "q", env, core.SubmitOptions{Streamed: true})
		if err != nil {
			b.Fatal(err)
		}
		o := conn.offer()
		if o.JobID != j.ID {
			b.Fatalf("offer for %s, want %s", o.JobID, j.ID)
		}
		w.Accept(j.ID, o.Gen)
		for _, out := range outputs {
			w.Output(j.ID, o.Gen, out)
		}
		w.End(j.ID, o.Gen, "", "", result)
	}
	// Warm the engine's maps and pools so the baseline includes them.
	run()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	b.ResetTimer()
	for range b.N {
		run()
	}
	b.StopTimer()
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/float64(b.N), "heap-B/job")
	b.ReportMetric(retainedBytes(b, reg)/float64(b.N+1), "accounted-B/job")
}

// retainedBytes reads switchyard_retention_bytes.
func retainedBytes(tb testing.TB, reg *prometheus.Registry) float64 {
	v, _ := promtest.Value(tb, reg, "switchyard_retention_bytes", nil)
	return v
}
