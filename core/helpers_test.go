package core_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/internal/promtest"
	"github.com/switchyard/switchyard/internal/ticktest"
)

// waitFor polls cond until it holds, failing the test after timeout. It
// is the only way real-clock tests wait for something asynchronous.
var waitFor = ticktest.WaitFor

type cancelMsg struct {
	JobID  string
	Gen    uint64
	Reason core.Code
}

type creditMsg struct {
	JobID  string
	Gen    uint64
	Credit core.OutputCredit
}

// fakeConn is a core.WorkerConn that records what the engine sends. Its
// methods are called with the engine's lock held, so they only append.
// Close records the cause; like a transport, the test then calls
// Worker.Detach itself.
type fakeConn struct {
	mu       sync.Mutex
	offers   []core.Offer
	cancels  []cancelMsg
	credits  []creditMsg
	closes   []error
	offerErr error
}

func (f *fakeConn) SendOffer(o core.Offer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.offerErr != nil {
		return f.offerErr
	}
	f.offers = append(f.offers, o)
	return nil
}

func (f *fakeConn) SendCancel(id string, gen uint64, reason core.Code) error {
	record(f, &f.cancels, cancelMsg{id, gen, reason})
	return nil
}

func (f *fakeConn) SendCredit(id string, gen uint64, c core.OutputCredit) error {
	record(f, &f.credits, creditMsg{id, gen, c})
	return nil
}

func (f *fakeConn) Close(cause error) { record(f, &f.closes, cause) }

func (f *fakeConn) Offers() []core.Offer { return recorded(f, &f.offers) }
func (f *fakeConn) Cancels() []cancelMsg { return recorded(f, &f.cancels) }
func (f *fakeConn) Credits() []creditMsg { return recorded(f, &f.credits) }
func (f *fakeConn) Closes() []error      { return recorded(f, &f.closes) }

// record appends v to one of f's records, under f's lock.
func record[T any](f *fakeConn, to *[]T, v T) {
	f.mu.Lock()
	defer f.mu.Unlock()
	*to = append(*to, v)
}

// recorded is a copy of one of f's records, taken under f's lock.
func recorded[T any](f *fakeConn, from *[]T) []T {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(*from)
}

// wantCancels checks that the worker was told to cancel exactly want, in
// order (nothing, with no want).
func (f *fakeConn) wantCancels(t *testing.T, want ...cancelMsg) {
	t.Helper()
	if c := f.Cancels(); !slices.Equal(c, want) {
		t.Fatalf("worker cancels %+v, want %+v", c, want)
	}
}

// wantStalledAt, in a synctest bubble, checks that the worker is dropped
// as stalled (one close, ErrStalled) after exactly d more: not a
// millisecond sooner. what names the timeout (dispatch, cancel).
func (f *fakeConn) wantStalledAt(t *testing.T, d time.Duration, what string) {
	t.Helper()
	time.Sleep(d - time.Millisecond)
	synctest.Wait()
	if len(f.Closes()) != 0 {
		t.Fatalf("worker dropped before the %s timeout", what)
	}
	time.Sleep(time.Millisecond)
	synctest.Wait()
	if closes := f.Closes(); len(closes) != 1 || !errors.Is(closes[0], core.ErrStalled) {
		t.Fatalf("closes = %v, want one ErrStalled", closes)
	}
}

// offersFor returns the offers this worker got for one job.
func (f *fakeConn) offersFor(id string) []core.Offer {
	var out []core.Offer
	for _, o := range f.Offers() {
		if o.JobID == id {
			out = append(out, o)
		}
	}
	return out
}

// lastOffer returns the newest offer, failing the test if there is none.
func (f *fakeConn) lastOffer(t *testing.T) core.Offer {
	t.Helper()
	o := f.Offers()
	if len(o) == 0 {
		t.Fatal("the worker got no offer")
	}
	return o[len(o)-1]
}

type harness struct {
	t   *testing.T
	e   *core.Engine
	reg *prometheus.Registry
}

// testConfig is DefaultConfig with the harness's own registry. Its dispatch
// timeouts are generous so that a test goroutine descheduled under -race
// never looks like a stalled worker; stall tests opt into shortDispatch.
func testConfig(reg *prometheus.Registry) core.Config {
	cfg := core.DefaultConfig()
	cfg.Registerer = reg
	cfg.DispatchTimeoutFloor = time.Second
	cfg.DispatchTimeoutCeiling = 10 * time.Second
	cfg.Retention = time.Minute
	return cfg
}

// shortDispatch makes stalls happen in test time: a worker gets between
// 50ms and 200ms to accept an offer, and 200ms to acknowledge a cancel.
func shortDispatch(c *core.Config) {
	c.DispatchTimeoutFloor = 50 * time.Millisecond
	c.DispatchTimeoutCeiling = 200 * time.Millisecond
}

// newHarness builds an engine (no catalog) and closes it when the test ends,
// which stops every timer it armed.
func newHarness(t *testing.T, adjust func(*core.Config)) *harness {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := testConfig(reg)
	if adjust != nil {
		adjust(&cfg)
	}
	e, err := core.New(cfg)
	if err != nil {
		t.Fatalf("core.New: %v", err)
	}
	t.Cleanup(e.Close)
	return &harness{t: t, e: e, reg: reg}
}

// attach registers a worker on queue with a fake connection.
func (h *harness) attach(queue string, concurrency int, caps ...string) (*core.Worker, *fakeConn) {
	h.t.Helper()
	fc := &fakeConn{}
	w, err := h.e.AttachWorker(context.Background(), core.WorkerSpec{
		Queue: queue, Name: "w-" + queue, Capabilities: caps, Concurrency: concurrency,
	}, fc)
	if err != nil {
		h.t.Fatalf("AttachWorker: %v", err)
	}
	return w, fc
}

// env returns an envelope with a small JSON input and the given TTL.
func env(ttl time.Duration) *core.Envelope {
	return &core.Envelope{Version: 1, TTL: ttl, Input: json.RawMessage(`{"prompt":"hi"}`)}
}

func (h *harness) submit(queue string, e *core.Envelope) *core.Job {
	h.t.Helper()
	j, existing, err := h.e.Submit(context.Background(), queue, e, core.SubmitOptions{})
	if err != nil {
		h.t.Fatalf("Submit: %v", err)
	}
	if existing {
		h.t.Fatal("Submit: existing=true without an idempotency key")
	}
	return j
}

func (h *harness) view(id string) core.JobView {
	h.t.Helper()
	v, err := h.e.View(id)
	if err != nil {
		h.t.Fatalf("View(%s): %v", id, err)
	}
	return v
}

// metric returns the value of the series of name with the given labels
// (name, value, ...), or -1 if the series does not exist: a test may ask
// for a series that must be gone. A histogram is read as name_count or
// name_sum.
func (h *harness) metric(name string, labels ...string) float64 {
	h.t.Helper()
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
	v, ok := promtest.Value(h.t, h.reg, name, want)
	if !ok {
		return -1
	}
	return v
}

// jobsTotal returns switchyard_jobs_total for each outcome.
func (h *harness) jobsTotal() map[core.Outcome]float64 {
	out := map[core.Outcome]float64{}
	for _, o := range []core.Outcome{core.OutcomeCompleted, core.OutcomeFailed, core.OutcomeCancelled, core.OutcomeExpired} {
		out[o] = h.metric("switchyard_jobs_total", "outcome", string(o))
	}
	return out
}

func wantJobsTotal(t *testing.T, h *harness, want map[core.Outcome]float64) {
	t.Helper()
	got := h.jobsTotal()
	for _, o := range []core.Outcome{core.OutcomeCompleted, core.OutcomeFailed, core.OutcomeCancelled, core.OutcomeExpired} {
		if got[o] != want[o] {
			t.Errorf("switchyard_jobs_total{outcome=%q} = %v, want %v", o, got[o], want[o])
		}
	}
}

// events returns every retained event of a job.
func events(t *testing.T, j *core.Job) []core.Event {
	t.Helper()
	r, _, err := j.History.Since(0, 1<<20)
	if err != nil {
		t.Fatalf("History.Since(0): %v", err)
	}
	return r.Events
}

func kinds(evs []core.Event) []core.EventKind {
	out := make([]core.EventKind, len(evs))
	for i, ev := range evs {
		out[i] = ev.Kind
	}
	return out
}

// terminalEvent checks that the job's history has exactly one terminal
// event, as its last, and returns its decoded data.
func terminalEvent(t *testing.T, j *core.Job) (core.Event, map[string]any) {
	t.Helper()
	evs := events(t, j)
	n := 0
	for _, ev := range evs {
		if ev.Kind.Terminal() {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("job %s has %d terminal events, want exactly 1: %v", j.ID, n, kinds(evs))
	}
	last := evs[len(evs)-1]
	if !last.Kind.Terminal() {
		t.Fatalf("job %s: the terminal event is not the last: %v", j.ID, kinds(evs))
	}
	var data map[string]any
	if err := json.Unmarshal(last.Data, &data); err != nil {
		t.Fatalf("terminal event data %s: %v", last.Data, err)
	}
	return last, data
}

// wantEnded checks a job's view and terminal event agree on an outcome and code.
func wantEnded(t *testing.T, h *harness, j *core.Job, outcome core.Outcome, code core.Code) {
	t.Helper()
	v := h.view(j.ID)
	if v.Outcome != outcome || v.Code != code {
		t.Fatalf("job %s: outcome=%q code=%q state=%q, want outcome=%q code=%q", j.ID, v.Outcome, v.Code, v.State, outcome, code)
	}
	ev, data := terminalEvent(t, j)
	wantKind := core.EventError
	if outcome == core.OutcomeCompleted {
		wantKind = core.EventDone
	}
	if ev.Kind != wantKind || data["outcome"] != string(outcome) {
		t.Fatalf("job %s: terminal event %s %s, want kind %s outcome %s", j.ID, ev.Kind, ev.Data, wantKind, outcome)
	}
	if code != "" && data["code"] != string(code) {
		t.Fatalf("job %s: terminal event code %v, want %s", j.ID, data["code"], code)
	}
}

// wantLostNotRunAgain detaches w, which ran job j until an output, while
// another worker is free on queue q: j fails worker_lost and the other
// worker is offered nothing (at most once, or a restart bound reached).
func wantLostNotRunAgain(t *testing.T, h *harness, w *core.Worker, j *core.Job) {
	t.Helper()
	_, other := h.attach("q", 1)
	w.Detach(context.Background())
	wantEnded(t, h, j, core.OutcomeFailed, core.CodeWorkerLost)
	if n := len(other.Offers()); n != 0 {
		t.Fatalf("job %s was offered again after its worker was lost (%d offers)", j.ID, n)
	}
}

// wantEndsAt, in a synctest bubble, checks that job j, now in state
// before, is still in it after d less a millisecond, and has ended with
// outcome and code at d. what names the deadline d is.
func wantEndsAt(t *testing.T, h *harness, j *core.Job, d time.Duration, what string, before core.State, outcome core.Outcome, code core.Code) {
	t.Helper()
	time.Sleep(d - time.Millisecond)
	synctest.Wait()
	if v := h.view(j.ID); v.State != before {
		t.Fatalf("job %s is %s before %s, want %s: %+v", j.ID, v.State, what, before, v)
	}
	time.Sleep(time.Millisecond)
	synctest.Wait()
	wantEnded(t, h, j, outcome, code)
}

// anyCount, as a count a check takes (wantQueue, wantDrained), leaves
// that count unchecked.
const anyCount = -1

// wantDrained waits for the Drain that done answers to return, and checks
// it ended want jobs (anyCount: any number).
func wantDrained(t *testing.T, done <-chan int, want int) {
	t.Helper()
	select {
	case n := <-done:
		if want != anyCount && n != want {
			t.Fatalf("Drain ended %d jobs, want %d", n, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Drain did not return")
	}
}

func wantCode(t *testing.T, err error, want core.Code) *core.Error {
	t.Helper()
	if err == nil {
		t.Fatalf("err = nil, want code %s", want)
	}
	var ce *core.Error
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v (%T), want *core.Error with code %s", err, err, want)
	}
	if ce.Code != want {
		t.Fatalf("code = %s (%v), want %s", ce.Code, err, want)
	}
	return ce
}

// oneWorker is a harness with one worker of one credit on queue q.
func oneWorker(t *testing.T, adjust func(*core.Config)) (*harness, *core.Worker, *fakeConn) {
	t.Helper()
	h := newHarness(t, adjust)
	w, fc := h.attach("q", 1)
	return h, w, fc
}

// offered submits a job on q (a minute's TTL) and returns it with the
// generation of fc's newest offer: the job's, when fc's worker is the one
// it goes to.
func (h *harness) offered(fc *fakeConn) (*core.Job, uint64) {
	h.t.Helper()
	j := h.submit("q", env(time.Minute))
	return j, fc.lastOffer(h.t).Gen
}

// running submits a job on q (a minute's TTL) that w, whose connection is
// fc, is offered and accepts; it returns the job and its generation.
func (h *harness) running(w *core.Worker, fc *fakeConn) (*core.Job, uint64) {
	h.t.Helper()
	j, gen := h.offered(fc)
	w.Accept(j.ID, gen)
	return j, gen
}
