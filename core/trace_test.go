package core_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/switchyard/switchyard/core"
)

// Every span the engine starts ends, whatever way its job goes: completed,
// rejected and run elsewhere, cancelled in its queue and on its worker,
// expired in its queue, its worker lost, and left open when the engine
// closes. The spans of one job form one tree: queue under job, offer under
// queue, run under offer, and the worker is handed the offer's context.
func TestTraceSpansEnd(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	h := newHarness(t, func(c *core.Config) { c.Tracer = tp.Tracer("test") })

	// Completed.
	w, fc := h.attach("done", 1)
	done := h.submit("done", env(time.Minute))
	o := fc.lastOffer(t)
	w.Accept(done.ID, o.Gen)
	w.Output(done.ID, o.Gen, []byte(`"a"`))
	w.End(done.ID, o.Gen, "", "", nil)
	wantEnded(t, h, done, core.OutcomeCompleted, "")
	if !o.Trace.IsValid() || o.Trace.TraceID() != done.Trace().TraceID() {
		t.Fatalf("the offer's trace %v is not the job's %v", o.Trace, done.Trace())
	}

	// Rejected by one worker, run by the other.
	r1, rc1 := h.attach("rej", 1)
	r2, rc2 := h.attach("rej", 1)
	rej := h.submit("rej", env(time.Minute))
	first, other, oc := r1, r2, rc2
	if len(rc1.Offers()) == 0 {
		first, other, oc = r2, r1, rc1
	}
	first.Reject(rej.ID, 1, "not mine")
	o = oc.lastOffer(t)
	other.Accept(rej.ID, o.Gen)
	other.End(rej.ID, o.Gen, "", "", nil)
	wantEnded(t, h, rej, core.OutcomeCompleted, "")

	// Cancelled while queued behind a running job, then the running one
	// cancelled on its worker, which acknowledges.
	b, bc := h.attach("busy", 1)
	running := h.submit("busy", env(time.Minute))
	queued := h.submit("busy", env(time.Minute))
	o = bc.lastOffer(t)
	b.Accept(running.ID, o.Gen)
	if _, err := h.e.Cancel(queued.ID, "changed my mind"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.e.Cancel(running.ID, "changed my mind"); err != nil {
		t.Fatal(err)
	}
	b.End(running.ID, o.Gen, core.CodeCancelled, "cancelled", nil)

	// Expired in its queue behind a job that keeps the only worker busy.
	x, xc := h.attach("exp", 1)
	hog := h.submit("exp", env(time.Minute))
	x.Accept(hog.ID, xc.lastOffer(t).Gen)
	expired := h.submit("exp", env(30*time.Millisecond))
	waitFor(t, 5*time.Second, "the queued job to expire", func() bool { return h.view(expired.ID).State.Terminal() })
	wantEnded(t, h, expired, core.OutcomeExpired, core.CodeExpired)

	// Its worker lost after an output.
	l, lc := h.attach("lost", 1)
	lost := h.submit("lost", env(time.Minute))
	o = lc.lastOffer(t)
	l.Accept(lost.ID, o.Gen)
	l.Output(lost.ID, o.Gen, []byte(`"a"`))
	l.Detach(context.Background())
	wantEnded(t, h, lost, core.OutcomeFailed, core.CodeWorkerLost)

	// Left open: a running job (hog) and one waiting behind it.
	h.submit("exp", env(time.Minute))
	h.e.Close()

	ended := map[trace.SpanID]bool{}
	for _, s := range sr.Ended() {
		ended[s.SpanContext().SpanID()] = true
	}
	for _, s := range sr.Started() {
		if !ended[s.SpanContext().SpanID()] {
			t.Errorf("span %s (%v) never ended", s.Name(), s.Attributes())
		}
	}

	// The completed job's spans, as one tree.
	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range sr.Ended() {
		if s.SpanContext().TraceID() == done.Trace().TraceID() {
			spans[s.Name()] = s
		}
	}
	for child, parent := range map[string]string{
		core.SpanQueue: core.SpanJob, core.SpanOffer: core.SpanQueue, core.SpanRun: core.SpanOffer,
	} {
		c, p := spans[child], spans[parent]
		if c == nil || p == nil {
			t.Fatalf("the completed job's trace lacks %s or %s: %v", child, parent, spans)
		}
		if c.Parent().SpanID() != p.SpanContext().SpanID() {
			t.Errorf("%s's parent is not %s", child, parent)
		}
	}
	if got := fc.Offers()[0].Trace.SpanID(); got != spans[core.SpanOffer].SpanContext().SpanID() {
		t.Errorf("the worker was handed span %s, not the offer's", got)
	}
}

// Without a tracer (export off) a job still has a trace: the caller's,
// handed on to the worker unchanged, or a new, unsampled one.
func TestTraceWithoutTracer(t *testing.T) {
	h := newHarness(t, nil)
	_, fc := h.attach("q", 2)
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	caller := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true})
	j, _, err := h.e.Submit(trace.ContextWithRemoteSpanContext(context.Background(), caller), "q", env(time.Minute), core.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := fc.lastOffer(t).Trace; got.TraceID() != tid || got.SpanID() != sid || !got.IsSampled() {
		t.Errorf("the worker got %v; want the caller's span context %v passed on", got, caller)
	}
	if v := h.view(j.ID); v.TraceID != tid.String() {
		t.Errorf("the job's view has trace id %q, want %s", v.TraceID, tid)
	}
	own := h.submit("q", env(time.Minute))
	if sc := own.Trace(); !sc.IsValid() || sc.IsSampled() || sc.TraceID() == tid {
		t.Errorf("a job that came with no trace has %v; want a new, unsampled one", sc)
	}
}

// FormatTrace and ParseTrace are the W3C text form, both ways.
func TestTraceText(t *testing.T) {
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	sc := core.ParseTrace(tp, "congo=t61rcWkgMzE")
	if !sc.IsValid() || !sc.IsRemote() || !sc.IsSampled() {
		t.Fatalf("ParseTrace(%q) = %v", tp, sc)
	}
	if gotTP, gotTS := core.FormatTrace(sc); gotTP != tp || gotTS != "congo=t61rcWkgMzE" {
		t.Errorf("FormatTrace = %q, %q", gotTP, gotTS)
	}
	for _, bad := range []string{"", "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "junk"} {
		if sc := core.ParseTrace(bad, ""); sc.IsValid() {
			t.Errorf("ParseTrace(%q) = %v, want invalid", bad, sc)
		}
	}
	// FormatTrace writes what the W3C propagator writes.
	for _, flags := range []trace.TraceFlags{0, trace.FlagsSampled, 0xff} {
		for _, ts := range []string{"", "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"} {
			state, _ := trace.ParseTraceState(ts)
			sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1, 2}, SpanID: trace.SpanID{3}, TraceFlags: flags, TraceState: state})
			c := propagation.MapCarrier{}
			propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), sc), c)
			if tp, ts := core.FormatTrace(sc); tp != c["traceparent"] || ts != c["tracestate"] {
				t.Errorf("FormatTrace(%v) = %q, %q; the propagator writes %q, %q", sc, tp, ts, c["traceparent"], c["tracestate"])
			}
		}
	}
	if tp, ts := core.FormatTrace(trace.SpanContext{}); tp != "" || ts != "" {
		t.Errorf("FormatTrace(invalid) = %q, %q", tp, ts)
	}
}
