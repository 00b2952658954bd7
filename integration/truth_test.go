package integration_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/openapi/client"
	"github.com/switchyard/switchyard/worker"
)

// What README, docs/streams.md and docs/errors.md promise, tried as a new
// user would.

// A job whose output passes its max_output_bytes ends output_too_large,
// decided by the node, whatever the worker does: the Go SDK's handler that
// keeps sending, and an HTTP worker that posts past the limit.
func TestOutputTooLargeIsTheNodes(t *testing.T) {
	n := MustStartNode(t, nil)
	c := apiClient(t, n)
	env := client.Envelope{Input: "x", TtlMs: ptr(20000), Limits: &client.EnvelopeLimits{MaxOutputBytes: ptr(20)}}

	stop := MustStartWorker(t, n, worker.Config{}, func(ctx context.Context, _ *worker.Job, out *worker.Output) (any, error) {
		for {
			if err := out.Send(ctx, "0123456789"); err != nil {
				return nil, err
			}
		}
	})
	res, err := c.SubmitJob(t.Context(), "demo", &client.SubmitJobParams{Accept: ptr("text/event-stream")}, env)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("submit: %v %v", res, err)
	}
	evs := readAll(t, res.Body)
	res.Body.Close()
	if last := evs[len(evs)-1]; last.Type != "error" || field[string](t, last, "code") != "output_too_large" {
		t.Fatalf("SDK worker: events %v, last %s", types(evs), last.Data)
	}
	stop()
	waitFor(t, 5*time.Second, "the SDK worker gone", func() bool {
		return metric(t, n, "switchyard_workers_connected", nil) == 0
	})

	hw := openHTTPWorker(t, n, "demo", client.WorkerRequest{Capabilities: &[]string{"model=demo"}})
	res, err = c.SubmitJob(t.Context(), "demo", &client.SubmitJobParams{Accept: ptr("text/event-stream")}, env)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("submit: %v %v", res, err)
	}
	defer res.Body.Close()
	o := hw.offer()
	hw.accept(o)
	hw.output(o, "0123456789")
	hw.output(o, "0123456789") // 24 bytes with the quotes: past 20
	cancel := hw.recv("cancel")
	if !strings.Contains(cancel.Data, `"reason":"output_too_large"`) {
		t.Fatalf("cancel %s", cancel.Data)
	}
	evs = readAll(t, res.Body)
	if last := evs[len(evs)-1]; last.Type != "error" || field[string](t, last, "code") != "output_too_large" || len(evs) != 3 {
		t.Fatalf("HTTP worker: events %v, last %s", types(evs), last.Data)
	}
}

// grace_ms above --max-grace is capped, as documented; a negative grace_ms
// or limit, and an explicit zero limit, are invalid_field.
func TestEnvelopeValuesAsDocumented(t *testing.T) {
	n := MustStartNode(t, func(c *switchyard.Config) { c.Engine.Limits.MaxGrace = 500 * time.Millisecond })
	MustStartWorker(t, n, worker.Config{}, func(ctx context.Context, _ *worker.Job, _ *worker.Output) (any, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	for _, tc := range []struct{ name, body, field string }{
		{"negative grace", `{"input":"x","grace_ms":-1}`, "grace_ms"},
		{"negative limit", `{"input":"x","limits":{"max_output_bytes":-5}}`, "limits.max_output_bytes"},
		{"zero limit", `{"input":"x","limits":{"max_output_bytes":0}}`, "limits.max_output_bytes"},
	} {
		res := post(t.Context(), t, n, "demo", tc.body, false)
		p := problemOf(t, tc.name, res, readBody(t, res), nil, 400, "invalid_field")
		if p.Field == nil || *p.Field != tc.field {
			t.Errorf("%s: field %v, want %s", tc.name, p.Field, tc.field)
		}
	}
	// A grace window far above the ceiling is accepted and capped to it:
	// the job is cancelled about 500ms after its client leaves, not a
	// minute later.
	ctx, cancel := context.WithCancel(t.Context())
	res := post(ctx, t, n, "demo", `{"input":"x","ttl_ms":60000,"grace_ms":60000}`, true)
	if res.StatusCode != 200 {
		t.Fatalf("grace above the ceiling: %d %s", res.StatusCode, readBody(t, res))
	}
	id := res.Header.Get("X-Job-Id")
	cancel()
	res.Body.Close()
	left := time.Now()
	c := apiClient(t, n)
	waitFor(t, 10*time.Second, "the job cancelled after the capped grace", func() bool {
		g, err := c.GetJobWithResponse(t.Context(), id)
		return err == nil && g.JSON200 != nil && g.JSON200.State == "cancelled"
	})
	if took := time.Since(left); took < 400*time.Millisecond || took > 5*time.Second {
		t.Errorf("cancelled %s after the client left, want about the 500ms ceiling", took)
	}
}

// A drop-oldest stream whose position fell out of a small history skips to
// the oldest retained event with a gap and gets the rest of the job; a
// terminate stream gets resync. Only the drop-oldest gap is counted as one.
func TestDropOldestPastTheHistory(t *testing.T) {
	n := MustStartNode(t, func(c *switchyard.Config) {
		c.Engine.HistoryEvents = 40
		c.HTTP.Stream.MaxLagEvents = 20
	})
	// Slow enough for the POST's own stream to keep up with (a burst past
	// the history would end it with resync itself).
	MustStartWorker(t, n, worker.Config{}, worker.Tokens(time.Millisecond))
	words := strings.Repeat("w ", 100)
	res := post(t.Context(), t, n, "demo", `{"input":"`+words+`","ttl_ms":20000}`, true)
	evs := readAll(t, res.Body)
	res.Body.Close()
	if len(evs) < 100 || evs[len(evs)-1].Type != "done" {
		t.Fatalf("the job: %d events, last %s", len(evs), evs[len(evs)-1].Type)
	}
	id, early := res.Header.Get("X-Job-Id"), evs[1].LastEventID // seq 2: long gone from a 40-event history

	stream := func(slow string) []string {
		req, _ := http.NewRequestWithContext(t.Context(), "GET", baseURL(n)+"/v1/jobs/"+id+"/events?slow="+slow, nil)
		req.Header.Set("Last-Event-ID", early)
		res, err := http.DefaultClient.Do(req)
		if err != nil || res.StatusCode != 200 {
			t.Fatalf("resume %s: %v %v", slow, res, err)
		}
		defer res.Body.Close()
		return types(readAll(t, res.Body))
	}
	gaps := func() float64 {
		return metric(t, n, "switchyard_stream_drop_oldest_gaps_total", map[string]string{"transport": "sse"})
	}
	if got := stream("terminate"); len(got) != 1 || got[0] != "resync" {
		t.Fatalf("terminate stream: %v, want resync", got)
	}
	got := stream("drop-oldest")
	if got[0] != "gap" || got[len(got)-1] != "done" || len(got) != 41 {
		t.Fatalf("drop-oldest stream: %v, want a gap then the 40 retained events", got)
	}
	if g := gaps(); g != 1 {
		t.Fatalf("drop_oldest_gaps_total = %v, want 1", g)
	}
	// A stream read from the start gets the history's own gap, which is not
	// a drop-oldest gap.
	req, _ := http.NewRequestWithContext(t.Context(), "GET", baseURL(n)+"/v1/jobs/"+id+"/events", nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	fromStart := types(readAll(t, res.Body))
	res.Body.Close()
	if fromStart[0] != "gap" || fromStart[len(fromStart)-1] != "done" {
		t.Fatalf("from the start: %v", fromStart)
	}
	if g := gaps(); g != 1 {
		t.Fatalf("drop_oldest_gaps_total = %v after an ordinary stream's gap, want still 1", g)
	}
}
