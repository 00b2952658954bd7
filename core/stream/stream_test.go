package stream_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/stream"
	"github.com/switchyard/switchyard/internal/coretest"
	"github.com/switchyard/switchyard/internal/ticktest"
)

const testJobID = "j_test"

func newJob(maxEvents int, maxBytes int64) *core.Job {
	return &core.Job{ID: testJobID, History: core.NewHistory(maxEvents, maxBytes)}
}

// acceptedJob is a job keeping maxEvents events (and 1 MiB) of history,
// its accepted event appended.
func acceptedJob(t *testing.T, maxEvents int) *core.Job {
	t.Helper()
	j := newJob(maxEvents, 1<<20)
	coretest.Append(t, j, core.EventAccepted, `{"queue":"q"}`)
	return j
}

func appendOutputs(t *testing.T, j *core.Job, n int) {
	t.Helper()
	for i := range n {
		coretest.Append(t, j, core.EventOutput, fmt.Sprintf(`{"data":"out-%d"}`, i))
	}
}

func seqTokens(dst []byte, ev core.Event, _ time.Time) []byte {
	return fmt.Appendf(dst, "tok-%d", ev.Seq)
}

func seqsOf(evs []core.Event) []uint64 {
	out := make([]uint64, 0, len(evs))
	for _, ev := range evs {
		out = append(out, ev.Seq)
	}
	return out
}

func seqRange(from, to uint64) []uint64 {
	var out []uint64
	for s := from; s <= to; s++ {
		out = append(out, s)
	}
	return out
}

func equalSeqs(a, b []uint64) bool { return fmt.Sprint(a) == fmt.Sprint(b) }

// shortClocks satisfy Validate and let the clock tests finish in about a
// second: heartbeat 20ms < setup 100ms < idle 200ms < max duration 1s.
func shortClocks() stream.Policy {
	p := stream.DefaultPolicy()
	p.Heartbeat = 20 * time.Millisecond
	p.Setup = 100 * time.Millisecond
	p.WriteTimeout = 50 * time.Millisecond
	p.Idle = 200 * time.Millisecond
	p.MaxDuration = time.Second
	return p
}

// clocked is a stream of an accepted job (room for maxEvents) run under
// shortClocks into a fakeSink, and when it started.
type clocked struct {
	j     *core.Job
	p     stream.Policy
	sink  *fakeSink
	start time.Time
	wait  func() stream.Result
}

func runClocked(t *testing.T, ctx context.Context, maxEvents int, adjust ...func(*stream.Policy)) clocked {
	t.Helper()
	c := clocked{j: acceptedJob(t, maxEvents), p: shortClocks(), sink: &fakeSink{}}
	for _, f := range adjust {
		f(&c.p)
	}
	c.start = time.Now()
	c.wait = runAsync(t, ctx, stream.Request{Job: c.j, Policy: c.p}, c.sink)
	return c
}

// num reads a JSON number from control data.
func num(t *testing.T, data map[string]any, key string) uint64 {
	t.Helper()
	v, ok := data[key].(float64)
	if !ok {
		t.Fatalf("control data %v: %q is %T, want a number", data, key, data[key])
	}
	return uint64(v)
}

// onlyControl asserts the sink got exactly one control event, of kind c,
// carrying the job id, and returns its data.
func onlyControl(t *testing.T, s *fakeSink, c stream.Control) map[string]any {
	t.Helper()
	ctls := s.controls()
	if len(ctls) != 1 || ctls[0].Ctl != c {
		t.Fatalf("controls = %s, want one %s", s.trace(), c)
	}
	if ctls[0].Data["job_id"] != testJobID {
		t.Errorf("%s control job_id = %v, want %s", c, ctls[0].Data["job_id"], testJobID)
	}
	return ctls[0].Data
}

// wantTerminated checks that the one control sink got is terminated, for
// reason, telling the client to resume after seq resumeAfter; it returns
// the control's data.
func wantTerminated(t *testing.T, sink *fakeSink, reason string, resumeAfter uint64) map[string]any {
	t.Helper()
	data := onlyControl(t, sink, stream.Terminated)
	if data["reason"] != reason {
		t.Errorf("reason = %v, want %s", data["reason"], reason)
	}
	if got := num(t, data, "resume_after_seq"); got != resumeAfter {
		t.Errorf("resume_after_seq = %d, want %d", got, resumeAfter)
	}
	return data
}

func TestPolicyValidate(t *testing.T) {
	tests := []struct {
		name  string
		edit  func(p *stream.Policy)
		field string // "" means valid
	}{
		{"default", func(*stream.Policy) {}, ""},
		{"short test clocks", func(p *stream.Policy) { *p = shortClocks() }, ""},
		{"heartbeat just under idle", func(p *stream.Policy) { p.Heartbeat = p.Idle - 1 }, ""},
		{"max events zero", func(p *stream.Policy) { p.MaxLagEvents = 0 }, "stream-max-events"},
		{"max events negative", func(p *stream.Policy) { p.MaxLagEvents = -1 }, "stream-max-events"},
		{"max bytes zero", func(p *stream.Policy) { p.MaxLagBytes = 0 }, "stream-max-bytes"},
		{"max bytes negative", func(p *stream.Policy) { p.MaxLagBytes = -5 }, "stream-max-bytes"},
		{"setup zero", func(p *stream.Policy) { p.Setup = 0 }, "stream-setup-timeout"},
		{"setup negative", func(p *stream.Policy) { p.Setup = -time.Second }, "stream-setup-timeout"},
		{"idle zero", func(p *stream.Policy) { p.Idle = 0 }, "stream-idle-timeout"},
		{"idle negative", func(p *stream.Policy) { p.Idle = -time.Second }, "stream-idle-timeout"},
		{"max duration zero", func(p *stream.Policy) { p.MaxDuration = 0 }, "stream-max-duration"},
		{"max duration negative", func(p *stream.Policy) { p.MaxDuration = -time.Second }, "stream-max-duration"},
		{"heartbeat zero", func(p *stream.Policy) { p.Heartbeat = 0 }, "stream-heartbeat"},
		{"heartbeat negative", func(p *stream.Policy) { p.Heartbeat = -time.Second }, "stream-heartbeat"},
		{"write timeout zero", func(p *stream.Policy) { p.WriteTimeout = 0 }, "stream-write-timeout"},
		{"write timeout negative", func(p *stream.Policy) { p.WriteTimeout = -time.Second }, "stream-write-timeout"},
		{"heartbeat equals idle", func(p *stream.Policy) { p.Heartbeat = p.Idle }, "stream-heartbeat"},
		{"heartbeat above idle", func(p *stream.Policy) { p.Heartbeat = p.Idle + time.Second }, "stream-heartbeat"},
		{"setup equals idle", func(p *stream.Policy) { p.Setup = p.Idle }, "stream-setup-timeout"},
		{"setup above idle", func(p *stream.Policy) { p.Setup = 2 * p.Idle }, "stream-setup-timeout"},
		{"idle equals max duration", func(p *stream.Policy) { p.Idle = p.MaxDuration }, "stream-idle-timeout"},
		{"idle above max duration", func(p *stream.Policy) { p.MaxDuration = p.Idle / 2 }, "stream-idle-timeout"},
		{"write timeout equals idle", func(p *stream.Policy) { p.WriteTimeout = p.Idle }, "stream-write-timeout"},
		{"write timeout above idle", func(p *stream.Policy) { p.WriteTimeout = p.Idle * 2 }, "stream-write-timeout"},
		{"stall zero: half the write timeout", func(p *stream.Policy) { p.Stall = 0 }, ""},
		{"stall negative", func(p *stream.Policy) { p.Stall = -time.Second }, "stream-stall-timeout"},
		{"stall equals write timeout", func(p *stream.Policy) { p.Stall = p.WriteTimeout }, "stream-stall-timeout"},
		{"stall just under write timeout", func(p *stream.Policy) { p.Stall = p.WriteTimeout - 1 }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := stream.DefaultPolicy()
			tt.edit(&p)
			coretest.WantConfigError(t, p.Validate(), tt.field)
		})
	}
}

func TestEndClientLeft(t *testing.T) {
	for _, e := range []stream.End{stream.EndTerminal, stream.EndClientGone, stream.EndWriteFailed, stream.EndSlow, stream.EndIdle, stream.EndMaxDuration, stream.EndResync} {
		want := e == stream.EndClientGone || e == stream.EndWriteFailed
		if got := e.ClientLeft(); got != want {
			t.Errorf("%s.ClientLeft() = %v, want %v", e, got, want)
		}
	}
}

func TestReplayAfterPosition(t *testing.T) {
	j := acceptedJob(t, 100)
	appendOutputs(t, j, 4)
	coretest.Append(t, j, core.EventDone, `{"outcome":"completed"}`)

	sink := &fakeSink{}
	res := runSync(t, stream.Request{
		Job: j, After: 2, Policy: stream.DefaultPolicy(), Token: seqTokens,
	}, sink)

	if res.End != stream.EndTerminal || res.LastSeq != 6 || res.Gaps != 0 || res.Dropped != 0 {
		t.Fatalf("Result = %+v, want terminal at 6, no gaps", res)
	}
	evs := sink.ops("event")
	if got := seqsOf(sink.events()); !equalSeqs(got, seqRange(3, 6)) {
		t.Fatalf("seqs = %v, want 3..6 (%s)", got, sink.trace())
	}
	for _, c := range evs {
		if c.Token != string(seqTokens(nil, c.Event, time.Time{})) {
			t.Errorf("event %d token %q, want %q", c.Event.Seq, c.Token, string(seqTokens(nil, c.Event, time.Time{})))
		}
	}
	if evs[len(evs)-1].Event.Kind != core.EventDone || string(evs[len(evs)-1].Event.Data) != `{"outcome":"completed"}` {
		t.Errorf("last event = %+v, want the done event as appended", evs[len(evs)-1].Event)
	}
	if n := len(sink.controls()); n != 0 {
		t.Errorf("%d control events on a clean replay: %s", n, sink.trace())
	}
	calls := sink.calls.All()
	if calls[0].Op != "event" || calls[1].Op != "event" {
		t.Errorf("first calls %s, %s: want the replay's events, the headers flushed with them in one write", calls[0].Op, calls[1].Op)
	}
	if last := calls[len(calls)-1]; last.Op != "flush" {
		t.Errorf("last call %s, want a flush after the terminal event", last.Op)
	}
}

func TestReplayFromStartWithoutTokens(t *testing.T) {
	j := acceptedJob(t, 1000)
	appendOutputs(t, j, 150) // more than one read batch
	coretest.Append(t, j, core.EventError, `{"code":"x"}`)

	sink := &fakeSink{}
	p := stream.DefaultPolicy()
	p.MaxLagEvents = 1000
	res := runSync(t, stream.Request{Job: j, Policy: p}, sink)
	if res.End != stream.EndTerminal || res.LastSeq != 152 {
		t.Fatalf("Result = %+v, want terminal at 152", res)
	}
	if got := seqsOf(sink.events()); !equalSeqs(got, seqRange(1, 152)) {
		t.Fatalf("seqs = %v, want 1..152", got)
	}
	for _, c := range sink.ops("event") {
		if c.Token != "" {
			t.Fatalf("event %d token %q with a nil Token func", c.Event.Seq, c.Token)
		}
	}
}

func TestLiveEvents(t *testing.T) {
	j := acceptedJob(t, 100)
	sink := &fakeSink{}
	wait := runAsync(t, context.Background(), stream.Request{
		Job: j, Policy: stream.DefaultPolicy(), Token: seqTokens,
	}, sink)

	waitFor(t, "the accepted event", func() bool { return len(sink.events()) == 1 })
	for i := range 3 {
		ev := coretest.Append(t, j, core.EventOutput, fmt.Sprintf(`{"data":"live-%d"}`, i))
		waitFor(t, fmt.Sprintf("live event %d and its flush", ev.Seq), func() bool {
			calls := sink.calls.All()
			last := calls[len(calls)-1]
			return len(sink.events()) == int(ev.Seq) && last.Op == "flush"
		})
	}
	coretest.Append(t, j, core.EventDone, `{"outcome":"completed"}`)
	res := wait()
	if res.End != stream.EndTerminal || res.LastSeq != 5 {
		t.Fatalf("Result = %+v, want terminal at 5", res)
	}
	if got := seqsOf(sink.events()); !equalSeqs(got, seqRange(1, 5)) {
		t.Fatalf("seqs = %v, want 1..5", got)
	}
	for _, c := range sink.ops("event") {
		if c.Token != string(seqTokens(nil, c.Event, time.Time{})) {
			t.Errorf("event %d token %q", c.Event.Seq, c.Token)
		}
	}
}

func TestFilter(t *testing.T) {
	tests := []struct {
		name     string
		filter   map[core.EventKind]bool
		terminal core.EventKind
		want     []uint64
	}{
		{"outputs", map[core.EventKind]bool{core.EventOutput: true}, core.EventDone, []uint64{2, 3, 5}},
		{"accepted only, error terminal", map[core.EventKind]bool{core.EventAccepted: true}, core.EventError, []uint64{1, 4, 5}},
		{"empty filter still ends", map[core.EventKind]bool{}, core.EventDone, []uint64{5}},
		{"nil filter is everything", nil, core.EventDone, []uint64{1, 2, 3, 4, 5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j := acceptedJob(t, 100)
			coretest.Append(t, j, core.EventOutput, `{"data":1}`)
			coretest.Append(t, j, core.EventOutput, `{"data":2}`)
			// A kind outside the filter set between two that are in it.
			coretest.Append(t, j, core.EventAccepted, `{"queue":"again"}`)
			j.History.Append(tt.terminal, 1, []byte(`{"outcome":"x"}`))
			sink := &fakeSink{}
			res := runSync(t, stream.Request{
				Job: j, Filter: tt.filter, Policy: stream.DefaultPolicy(), Token: seqTokens,
			}, sink)
			if res.End != stream.EndTerminal || res.LastSeq != 5 {
				t.Fatalf("Result = %+v, want terminal at 5", res)
			}
			got := sink.events()
			if !equalSeqs(seqsOf(got), tt.want) {
				t.Fatalf("seqs = %v, want %v", seqsOf(got), tt.want)
			}
			for _, ev := range got {
				if tt.filter != nil && !tt.filter[ev.Kind] && !ev.Kind.Terminal() {
					t.Errorf("event %d of kind %s passed the filter %v", ev.Seq, ev.Kind, tt.filter)
				}
			}
			if last := got[len(got)-1]; last.Kind != tt.terminal {
				t.Errorf("last event kind %s, want the terminal %s", last.Kind, tt.terminal)
			}
		})
	}
}

// blocker blocks Event for seqs >= from until release is closed, and
// signals blocked when it first does.
type blocker struct {
	from    uint64
	blocked chan struct{}
	release chan struct{}
	once    sync.Once
	rel     sync.Once
}

func newBlocker(from uint64) *blocker {
	return &blocker{from: from, blocked: make(chan struct{}), release: make(chan struct{})}
}

func (b *blocker) onEvent(ev core.Event) error {
	if ev.Seq >= b.from {
		b.once.Do(func() { close(b.blocked) })
		<-b.release
	}
	return nil
}

func (b *blocker) Release() { b.rel.Do(func() { close(b.release) }) }

func waitChan(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// blockedOnSecond streams j with policy p (and seqTokens) to a sink that
// blocks on seq 2: it appends j's accepted event and its first output,
// and returns once the sink blocks on that output. The blocker is
// released when the test ends, before runAsync's cleanup waits for the
// stream.
func blockedOnSecond(t *testing.T, j *core.Job, p stream.Policy) (*blocker, *fakeSink, func() stream.Result) {
	t.Helper()
	coretest.Append(t, j, core.EventAccepted, `{"queue":"q"}`)
	b := newBlocker(2)
	sink := &fakeSink{onEvent: b.onEvent}
	wait := runAsync(t, context.Background(), stream.Request{Job: j, Policy: p, Token: seqTokens}, sink)
	t.Cleanup(b.Release) // runs before runAsync's cleanup
	// The stream opens (its base is the head then) before the output is
	// appended, so the blocked output is live, and counts in the lag, in
	// every run rather than only when the stream's goroutine ran first.
	waitFor(t, "the stream to write the accepted event", func() bool { return len(sink.events()) == 1 })
	coretest.Append(t, j, core.EventOutput, `{"data":"first"}`)
	waitChan(t, "the sink to block", b.blocked)
	return b, sink, wait
}

func TestSlowConsumerTerminatedOnEventLag(t *testing.T) {
	j := newJob(1000, 1<<20)
	p := stream.DefaultPolicy()
	p.MaxLagEvents = 5
	b, sink, wait := blockedOnSecond(t, j, p)
	appendOutputs(t, j, 10) // seqs 3..12 pile up behind the stream
	coretest.Append(t, j, core.EventDone, `{"outcome":"completed"}`)
	b.Release()

	res := wait()
	if res.End != stream.EndSlow || res.LastSeq != 2 {
		t.Fatalf("Result = %+v, want slow with LastSeq 2 (%s)", res, sink.trace())
	}
	if got := seqsOf(sink.events()); !equalSeqs(got, []uint64{1, 2}) {
		t.Fatalf("seqs = %v, want 1, 2 and nothing after the bound was passed", got)
	}
	data := wantTerminated(t, sink, "slow_consumer", 2)
	// The append that passes the bound (seq 7: 3..7 and the blocked 2)
	// runs the watcher, which measures the queue then: 6, one past the
	// bound. That is the verdict, not the 11 queued by the time the write
	// returns and the writer looks again.
	if got := num(t, data, "lag_events"); got != 6 {
		t.Errorf("lag_events = %d, want 6: the queue the moment the bound of 5 was passed", got)
	}
	calls := sink.ops("event", "control", "flush", "heartbeat")
	if calls[len(calls)-1].Op != "flush" || calls[len(calls)-2].Op != "control" {
		t.Errorf("the terminated control should be the last thing written, then flushed: %s", sink.trace())
	}
}

func TestLagAtTheBoundIsNotSlow(t *testing.T) {
	j := newJob(100, 1<<20)
	appendOutputs(t, j, 4)
	coretest.Append(t, j, core.EventDone, `{"outcome":"completed"}`)
	p := stream.DefaultPolicy()
	p.MaxLagEvents = 5
	p.MaxLagBytes = int64(j.History.Head()) * 1000
	sink := &fakeSink{}
	if res := runSync(t, stream.Request{Job: j, Policy: p}, sink); res.End != stream.EndTerminal {
		t.Fatalf("Result = %+v with lag exactly MaxLagEvents, want terminal (%s)", res, sink.trace())
	}
}

func TestSlowConsumerTerminatedOnByteLag(t *testing.T) {
	j := newJob(100, 1<<20)
	p := stream.DefaultPolicy()
	p.MaxLagEvents = 100
	p.MaxLagBytes = 1000
	b, sink, wait := blockedOnSecond(t, j, p)
	big := `{"data":"` + strings.Repeat("x", 600) + `"}`
	coretest.Append(t, j, core.EventOutput, big)
	coretest.Append(t, j, core.EventOutput, big) // 1200 bytes queued: over the byte bound, far under the event bound
	// The watcher aborts the blocked writer as soon as the bound is passed,
	// without waiting for the write to return.
	waitFor(t, "the watcher to abort the sink", func() bool { return len(sink.ops("abort")) == 1 })
	b.Release()

	res := wait()
	if res.End != stream.EndSlow || res.LastSeq != 2 {
		t.Fatalf("Result = %+v, want slow at 2 (%s)", res, sink.trace())
	}
	data := onlyControl(t, sink, stream.Terminated)
	if data["reason"] != "slow_consumer" {
		t.Errorf("reason = %v, want slow_consumer", data["reason"])
	}
	// The blocked output and the two big ones: few events, so bytes are
	// the bound that tripped.
	if got := num(t, data, "lag_events"); got != 3 {
		t.Errorf("lag_events = %d, want 3 (the blocked output and the two big ones)", got)
	}
	if got := num(t, data, "lag_bytes"); got <= 1000 {
		t.Errorf("lag_bytes = %d, want > MaxLagBytes", got)
	}
}

// A replay of history that existed when the stream opened is catch-up, not
// lag: a client resuming far back is never judged slow for it.
func TestReplayBacklogIsNotLag(t *testing.T) {
	for _, slow := range []stream.SlowPolicy{stream.Terminate, stream.DropOldest} {
		j := newJob(1000, 1<<20)
		appendOutputs(t, j, 300)
		coretest.Append(t, j, core.EventDone, `{"outcome":"completed"}`) // seq 301
		p := stream.DefaultPolicy()
		p.MaxLagEvents = 4
		p.MaxLagBytes = 100
		p.Slow = slow
		sink := &fakeSink{}
		res := runSync(t, stream.Request{Job: j, Policy: p, Token: seqTokens}, sink)
		if res.End != stream.EndTerminal || res.LastSeq != 301 || res.Gaps != 0 {
			t.Fatalf("policy %d: Result = %+v, want terminal at 301 with no gap", slow, res)
		}
		if got := seqsOf(sink.events()); !equalSeqs(got, seqRange(1, 301)) {
			t.Fatalf("policy %d: %d events, want 1..301", slow, len(got))
		}
	}
}

// A client starting from the beginning of a job whose oldest events are no
// longer retained gets a gap event saying so, then what is retained.
func TestFreshStreamOnTrimmedHistory(t *testing.T) {
	j := newJob(5, 1<<20)
	appendOutputs(t, j, 9)
	coretest.Append(t, j, core.EventDone, `{"outcome":"completed"}`) // seq 10; 6..10 retained
	sink := &fakeSink{}
	res := runSync(t, stream.Request{Job: j, Policy: stream.DefaultPolicy(), Token: seqTokens}, sink)
	// Dropped, not Gaps: the start of a history no longer retained is not a
	// drop-oldest stream falling behind (Gaps feeds drop_oldest_gaps_total).
	if res.End != stream.EndTerminal || res.Gaps != 0 || res.Dropped != 5 {
		t.Fatalf("Result = %+v, want terminal with 5 events dropped and no drop-oldest gap", res)
	}
	data := onlyControl(t, sink, stream.Gap)
	if num(t, data, "from_seq") != 1 || num(t, data, "to_seq") != 5 {
		t.Fatalf("gap %v, want 1..5", data)
	}
	if got := seqsOf(sink.events()); !equalSeqs(got, seqRange(6, 10)) {
		t.Fatalf("seqs %v, want 6..10", got)
	}
}

func TestDropOldestLive(t *testing.T) {
	j := newJob(1000, 1<<20)
	p := stream.DefaultPolicy()
	p.MaxLagEvents = 6
	p.Slow = stream.DropOldest
	b, sink, wait := blockedOnSecond(t, j, p)
	appendOutputs(t, j, 20)                                          // 3..22
	coretest.Append(t, j, core.EventDone, `{"outcome":"completed"}`) // 23
	b.Release()

	res := wait()
	if res.End != stream.EndTerminal || res.LastSeq != 23 {
		t.Fatalf("Result = %+v, want terminal at 23 (%s)", res, sink.trace())
	}
	data := onlyControl(t, sink, stream.Gap)
	from, to, dropped := num(t, data, "from_seq"), num(t, data, "to_seq"), num(t, data, "dropped")
	if from != 3 || dropped != to-from+1 || res.Dropped != int(dropped) || res.Gaps != 1 {
		t.Fatalf("gap %v, result %+v: want from_seq 3 (just after the last event written)", data, res)
	}
	want := append([]uint64{1, 2}, seqRange(to+1, 23)...)
	if got := seqsOf(sink.events()); !equalSeqs(got, want) {
		t.Fatalf("seqs = %v, want %v", got, want)
	}
	if len(want)-2 > p.MaxLagEvents {
		t.Errorf("%d events left after the gap, more than MaxLagEvents %d", len(want)-2, p.MaxLagEvents)
	}
}

func TestResyncWhenPositionNoLongerRetained(t *testing.T) {
	j := newJob(3, 1<<20)
	appendOutputs(t, j, 6) // retains 4, 5, 6
	sink := &fakeSink{}
	res := runSync(t, stream.Request{
		Job: j, After: 2, Policy: stream.DefaultPolicy(), Token: seqTokens,
	}, sink)
	if res.End != stream.EndResync {
		t.Fatalf("Result = %+v, want resync (%s)", res, sink.trace())
	}
	if n := len(sink.events()); n != 0 {
		t.Fatalf("%d events written after a position older than the history: a silent skip", n)
	}
	data := onlyControl(t, sink, stream.Resync)
	if got := num(t, data, "oldest_seq"); got != 4 {
		t.Errorf("oldest_seq = %d, want 4", got)
	}
	if got := num(t, data, "after_seq"); got != 2 {
		t.Errorf("after_seq = %d, want 2", got)
	}
}

// A drop-oldest stream whose position fell out of the history skips to the
// oldest retained event with a gap, as it asked to, instead of resync.
func TestDropOldestSkipsPastTrimmedHistory(t *testing.T) {
	j := newJob(3, 1<<20)
	appendOutputs(t, j, 6)                                           // retains 4, 5, 6
	coretest.Append(t, j, core.EventDone, `{"outcome":"completed"}`) // seq 7; 5..7 retained
	p := stream.DefaultPolicy()
	p.Slow = stream.DropOldest
	sink := &fakeSink{}
	res := runSync(t, stream.Request{Job: j, After: 2, Policy: p, Token: seqTokens}, sink)
	if res.End != stream.EndTerminal || res.Gaps != 1 || res.Dropped != 2 || res.LastSeq != 7 {
		t.Fatalf("Result = %+v, want terminal at 7 after one gap of 2 (%s)", res, sink.trace())
	}
	data := onlyControl(t, sink, stream.Gap)
	if num(t, data, "from_seq") != 3 || num(t, data, "to_seq") != 4 || num(t, data, "dropped") != 2 {
		t.Fatalf("gap %v, want 3..4", data)
	}
	if got := seqsOf(sink.events()); !equalSeqs(got, seqRange(5, 7)) {
		t.Fatalf("seqs %v, want 5..7", got)
	}
}

func TestResumeAtOldestRetainedIsNotResync(t *testing.T) {
	j := newJob(3, 1<<20)
	appendOutputs(t, j, 6)
	coretest.Append(t, j, core.EventDone, `{"outcome":"completed"}`) // retains 5, 6, 7
	sink := &fakeSink{}
	res := runSync(t, stream.Request{Job: j, After: 4, Policy: stream.DefaultPolicy()}, sink)
	if res.End != stream.EndTerminal || !equalSeqs(seqsOf(sink.events()), []uint64{5, 6, 7}) {
		t.Fatalf("Result = %+v, events %v; want 5..7 and terminal", res, seqsOf(sink.events()))
	}
}

func TestHeartbeatAfterSilence(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := runClocked(t, ctx, 100)
	p, sink, wait := c.p, c.sink, c.wait

	waitFor(t, "two heartbeats", func() bool { return sink.count("heartbeat") >= 2 })
	cancel()
	res := wait()
	if res.End != stream.EndClientGone || !res.End.ClientLeft() {
		t.Fatalf("Result = %+v, want client_gone", res)
	}
	evs := sink.ops("event")
	if len(evs) != 1 {
		t.Fatalf("%d events, want only accepted: a heartbeat is not an event", len(evs))
	}
	hbs := sink.ops("heartbeat")
	if gap := hbs[0].At.Sub(evs[0].At); gap < p.Heartbeat*3/4 {
		t.Errorf("first heartbeat %v after the last event, want about %v of silence", gap, p.Heartbeat)
	}
	calls := sink.calls.All()
	for i, c := range calls {
		if c.Op == "heartbeat" && (i+1 >= len(calls) || calls[i+1].Op != "flush") {
			t.Errorf("heartbeat at %d not flushed: %s", i, sink.trace())
		}
	}
	if len(sink.controls()) != 0 {
		t.Errorf("controls on a stream the client closed: %s", sink.trace())
	}
}

func TestIdleTerminates(t *testing.T) {
	c := runClocked(t, context.Background(), 100)
	p, sink := c.p, c.sink
	res := c.wait()
	elapsed := time.Since(c.start)
	if res.End != stream.EndIdle || res.End.ClientLeft() {
		t.Fatalf("Result = %+v, want idle (%s)", res, sink.trace())
	}
	if elapsed < p.Idle || elapsed >= p.MaxDuration {
		t.Errorf("idle fired after %v, want between %v and %v", elapsed, p.Idle, p.MaxDuration)
	}
	wantTerminated(t, sink, "idle", 1)
	if sink.count("heartbeat") == 0 {
		t.Errorf("no heartbeats before idle: heartbeats must not reset the idle clock, but they must be sent")
	}
}

func TestMaxDurationTerminatesBusyStream(t *testing.T) {
	// The idle clock is wide (a busy machine may hold the ticker back for a
	// few hundred milliseconds), and the max duration well past it.
	c := runClocked(t, context.Background(), 1000, func(p *stream.Policy) {
		p.Idle, p.MaxDuration = 600*time.Millisecond, 2*time.Second
	})
	j, p, sink, start, wait := c.j, c.p, c.sink, c.start, c.wait

	// Events every 40ms keep the idle clock from firing: only the max
	// duration may end this stream.
	stop := ticktest.Every(40*time.Millisecond, func() bool {
		j.History.Append(core.EventOutput, 1, []byte(`{"data":"tick"}`))
		return true
	})
	res := wait()
	stop()
	elapsed := time.Since(start)
	if res.End != stream.EndMaxDuration {
		t.Fatalf("Result = %+v after %v, want max_duration (%s)", res, elapsed, sink.trace())
	}
	if elapsed < p.MaxDuration {
		t.Errorf("max duration fired after %v, want >= %v", elapsed, p.MaxDuration)
	}
	wantTerminated(t, sink, "max_duration", res.LastSeq)
	if n := len(sink.events()); n < 10 {
		t.Errorf("only %d events on a busy stream", n)
	}
}

func TestContextCancelIsClientGone(t *testing.T) {
	j := acceptedJob(t, 100)
	sink := &fakeSink{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wait := runAsync(t, ctx, stream.Request{Job: j, Policy: stream.DefaultPolicy()}, sink)
	waitFor(t, "the accepted event", func() bool { return len(sink.events()) == 1 })
	cancel()
	res := wait()
	if res.End != stream.EndClientGone || !res.End.ClientLeft() || res.LastSeq != 1 {
		t.Fatalf("Result = %+v, want client_gone at 1", res)
	}
	if len(sink.controls()) != 0 {
		t.Errorf("control written to a client that left: %s", sink.trace())
	}
}

func TestSinkErrorsAreWriteFailed(t *testing.T) {
	boom := errors.New("broken pipe")
	tests := []struct {
		name    string
		sink    func() *fakeSink
		policy  stream.Policy
		lastSeq uint64
	}{
		{"event", func() *fakeSink {
			return &fakeSink{onEvent: func(ev core.Event) error {
				if ev.Seq == 2 {
					return boom
				}
				return nil
			}}
		}, stream.DefaultPolicy(), 1},
		// The history has events when the stream opens: the first flush
		// carries the headers and them.
		{"first flush", func() *fakeSink {
			return &fakeSink{onFlush: func() error { return boom }}
		}, stream.DefaultPolicy(), 3},
		{"heartbeat", func() *fakeSink {
			return &fakeSink{onHeartbeat: func() error { return boom }}
		}, shortClocks(), 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j := acceptedJob(t, 100)
			appendOutputs(t, j, 2) // no terminal: only the failure ends the stream
			sink := tt.sink()
			wait := runAsync(t, context.Background(), stream.Request{Job: j, Policy: tt.policy}, sink)
			res := wait()
			if res.End != stream.EndWriteFailed || !res.End.ClientLeft() {
				t.Fatalf("Result = %+v, want write_failed (%s)", res, sink.trace())
			}
			if res.LastSeq != tt.lastSeq {
				t.Errorf("LastSeq = %d, want %d", res.LastSeq, tt.lastSeq)
			}
			if len(sink.controls()) != 0 {
				t.Errorf("control written after a failed write: %s", sink.trace())
			}
		})
	}
}

func TestWriteDeadlines(t *testing.T) {
	j := acceptedJob(t, 100)
	p := stream.DefaultPolicy()
	p.Setup = 3 * time.Second
	p.WriteTimeout = time.Second
	sink := &fakeSink{}
	before := time.Now()
	wait := runAsync(t, context.Background(), stream.Request{Job: j, Policy: p}, sink)
	waitFor(t, "the accepted event", func() bool { return len(sink.events()) == 1 })
	appendOutputs(t, j, 2)
	coretest.Append(t, j, core.EventDone, `{"outcome":"completed"}`)
	if res := wait(); res.End != stream.EndTerminal {
		t.Fatalf("Result = %+v", res)
	}

	ds := sink.deadlines.All()
	if len(ds) < 2 {
		t.Fatalf("only %d SetWriteDeadline calls for two batches of writes", len(ds))
	}
	// The first write is bounded by the setup deadline, from when Run started.
	if d := ds[0].Deadline.Add(-p.Setup); d.Before(before) || d.After(ds[0].At) {
		t.Errorf("first deadline %v: want start+Setup, start in [%v, %v]", ds[0].Deadline, before, ds[0].At)
	}
	// Every later one is now+WriteTimeout, taken just before the call.
	var writeTimeouts int
	for i, dc := range ds[1:] {
		if dc.Deadline.Equal(ds[0].Deadline) {
			continue // the setup clock, before the first flush
		}
		writeTimeouts++
		d := dc.Deadline.Add(-p.WriteTimeout)
		if d.Before(ds[i].At) || d.After(dc.At) {
			t.Errorf("deadline %d = %v called at %v: want now+WriteTimeout", i+1, dc.Deadline, dc.At)
		}
	}
	// Once the first flush went through, WriteTimeout bounds the writes,
	// moved forward at most every WriteTimeout/16: each write gets at
	// least 15/16 of it.
	if writeTimeouts == 0 {
		t.Errorf("no WriteTimeout deadline after the first flush: %v", ds)
	}
}

func TestSlowSinkDoesNotDelayOtherStreams(t *testing.T) {
	j := acceptedJob(t, 1000)

	b := newBlocker(2)
	slow := &fakeSink{onEvent: b.onEvent}
	fast := &fakeSink{}
	waitSlow := runAsync(t, context.Background(), stream.Request{Job: j, Policy: stream.DefaultPolicy()}, slow)
	waitFast := runAsync(t, context.Background(), stream.Request{Job: j, Policy: stream.DefaultPolicy()}, fast)
	t.Cleanup(b.Release)

	coretest.Append(t, j, core.EventOutput, `{"data":"first"}`)
	waitChan(t, "the slow sink to block", b.blocked)
	appendStart := time.Now()
	appendOutputs(t, j, 5)
	coretest.Append(t, j, core.EventDone, `{"outcome":"completed"}`)
	if d := time.Since(appendStart); d > time.Second {
		t.Errorf("appending took %v with a blocked reader: the writer must never wait for readers", d)
	}

	res := waitFast()
	released := time.Now()
	if res.End != stream.EndTerminal || res.LastSeq != 8 {
		t.Fatalf("fast stream Result = %+v, want terminal at 8", res)
	}
	if got := seqsOf(fast.events()); !equalSeqs(got, seqRange(1, 8)) {
		t.Fatalf("fast stream seqs = %v", got)
	}
	if n := len(slow.events()); n != 1 {
		t.Fatalf("slow sink recorded %d events while blocked on seq 2", n)
	}
	b.Release()
	res = waitSlow()
	if res.End != stream.EndTerminal || res.LastSeq != 8 {
		t.Fatalf("slow stream Result = %+v, want terminal at 8 once released", res)
	}
	if ev := slow.ops("event")[1]; ev.At.Before(released) {
		t.Errorf("slow stream's seq 2 recorded at %v, before release at %v", ev.At, released)
	}
	if last := fast.ops("event"); last[len(last)-1].At.After(released) {
		t.Errorf("fast stream's terminal event came after the slow one was released")
	}
}

// A stream with nothing to send yet flushes its headers at once, so its
// client knows it is open: an empty history, or one whose events the
// stream's filter leaves out.
func TestHeadersFlushedAtOnceWithNothingToSend(t *testing.T) {
	for _, tc := range []struct {
		name   string
		filter map[core.EventKind]bool
		events int
	}{{"empty history", nil, 0}, {"all filtered out", map[core.EventKind]bool{core.EventOutput: true}, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			j := newJob(100, 1<<20)
			if tc.events > 0 {
				coretest.Append(t, j, core.EventAccepted, `{"queue":"q"}`)
			}
			sink := &fakeSink{}
			wait := runAsync(t, context.Background(), stream.Request{Job: j, Filter: tc.filter, Policy: stream.DefaultPolicy()}, sink)
			waitFor(t, "the headers flush", func() bool { return len(sink.ops("flush")) == 1 })
			if n := len(sink.events()); n != 0 {
				t.Errorf("%d events before the headers flush", n)
			}
			coretest.Append(t, j, core.EventDone, `{"outcome":"completed"}`)
			if res := wait(); res.End != stream.EndTerminal {
				t.Fatalf("Result = %+v", res)
			}
		})
	}
}

// The first output appended after a stream opened is flushed as soon as it
// is written, ahead of the rest of its batch, which follows with the
// batch's own flush; one that ends its batch is flushed with it, once; and
// a replay of what the history held when the stream opened goes out in
// one batch. With another stream of the node being written, or one that
// began a batch while the stream waited, the first output goes out with
// its batch: one write per batch.
func TestFirstOutputFlushedAheadOfItsBatch(t *testing.T) {
	for _, tc := range []struct {
		name    string
		replay  bool  // appended before the stream opens
		others  int64 // other streams of the node being written
		batched bool  // another stream began a batch while this one waited
		batch   []core.EventKind
		want    string
	}{
		{"with the rest of the job", false, 0, false, []core.EventKind{core.EventAccepted, core.EventOutput, core.EventOutput, core.EventOutput, core.EventDone},
			"flush accepted output flush output output done flush"},
		{"last of its batch", false, 0, false, []core.EventKind{core.EventAccepted, core.EventOutput},
			"flush accepted output flush done flush"},
		{"replayed", true, 0, false, []core.EventKind{core.EventAccepted, core.EventOutput, core.EventOutput, core.EventDone},
			"accepted output output done flush"},
		{"others being written", false, 1, false, []core.EventKind{core.EventAccepted, core.EventOutput, core.EventOutput, core.EventOutput, core.EventDone},
			"flush accepted output output output done flush"},
		{"another stream wrote meanwhile", false, 0, true, []core.EventKind{core.EventAccepted, core.EventOutput, core.EventOutput, core.EventOutput, core.EventDone},
			"flush accepted output output output done flush"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := newJob(100, 1<<20)
			appendAll := func() {
				for _, k := range tc.batch {
					data := `"x"`
					switch k {
					case core.EventAccepted:
						data = `{"queue":"q"}`
					case core.EventDone:
						data = `{"outcome":"completed"}`
					}
					coretest.Append(t, j, k, data)
				}
			}
			if tc.replay {
				appendAll()
			}
			// The stream's first flush (its headers, when the history is
			// empty) waits until the batch is in the history, so that it
			// is read as one.
			flushing, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			writers := &stream.Writers{}
			writers.Add(tc.others)
			var counted []int64 // the count as each event is written
			sink := &fakeSink{onFlush: func() error {
				once.Do(func() { close(flushing); <-release })
				return nil
			}, onEvent: func(core.Event) error {
				counted = append(counted, writers.Count())
				return nil
			}}
			wait := runAsync(t, context.Background(), stream.Request{Job: j, Policy: stream.DefaultPolicy(), Writers: writers}, sink)
			if !tc.replay {
				<-flushing
				if tc.batched {
					writers.Batch()
				}
				appendAll()
			}
			close(release)
			if !slices.Contains(tc.batch, core.EventDone) {
				waitFor(t, "the batch's flush", func() bool { return len(sink.ops("flush")) == 2 })
				coretest.Append(t, j, core.EventDone, `{"outcome":"completed"}`)
			}
			if res := wait(); res.End != stream.EndTerminal {
				t.Fatalf("Result = %+v", res)
			}
			var got []string
			for _, c := range sink.ops("event", "flush") {
				if c.Op == "event" {
					got = append(got, string(c.Event.Kind))
				} else {
					got = append(got, "flush")
				}
			}
			if g := strings.Join(got, " "); g != tc.want {
				t.Errorf("calls = %s, want %s", g, tc.want)
			}
			for i, n := range counted {
				if n != tc.others+1 {
					t.Errorf("event %d written with %d streams counted, want %d", i, n, tc.others+1)
				}
			}
			if n := writers.Count(); n != tc.others {
				t.Errorf("%d streams counted once the stream ended, want %d", n, tc.others)
			}
		})
	}
}
