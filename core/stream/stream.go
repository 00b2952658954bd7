// Package stream is the one writer of a job's outbound stream, shared by
// every transport (SSE in httpapi, the JobService streams in grpcapi, each
// a Sink): it reads the job's History with its own cursor and applies
// ADR-GRPC-005 — a bound on how far the stream may fall behind (both events
// and bytes), terminate as the default slow-consumer policy and drop-oldest
// only when a request asks for it, an envelope on every event, resume
// tokens, and four separate clocks. docs/streams.md tells the whole design.
//
// "Accepted" in this package means appended to the History. Nothing here
// can know that a client received an event: a transport call returns when
// bytes are handed to the kernel.
package stream

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/resume"
)

// Control is an event about the stream rather than the job. Control events
// carry no id, so they never move a client's resume position.
type Control string

// Control events.
const (
	// Gap: a drop-oldest stream skipped events (from_seq..to_seq).
	Gap Control = "gap"
	// Resync: the client's position is older than the retained history;
	// resume is refused, the client must start over.
	Resync Control = "resync"
	// Terminated: the node ended the stream (slow, idle, max_duration); the
	// client resumes from the last id it received.
	Terminated Control = "terminated"
)

// Sink writes one stream on one transport. Run calls it from a single
// goroutine: it is the stream's only writer.
type Sink interface {
	// Event writes a job event with its resume token (empty: none). The
	// token's bytes are the writer's, and only valid during the call: a
	// sink copies them out (into what it writes), never keeps them.
	Event(ev core.Event, token []byte) error
	// Control writes a control event with JSON data.
	Control(c Control, data map[string]any) error
	// Heartbeat writes a liveness signal. It is not an acknowledgement and
	// not an ordering guarantee; never make it one.
	Heartbeat() error
	// Flush hands what was written to the transport. After the job's
	// terminal event it may leave that to the end of the transport's
	// response, which follows at once (Run returns after that flush).
	Flush() error
	// SetWriteDeadline bounds the writes and flushes that follow.
	SetWriteDeadline(t time.Time) error
	// Abort bounds the write that is in progress now, and every later one,
	// by deadline, whatever SetWriteDeadline says after it: the stream is
	// over, and the writer only gets until then to finish the write it is in
	// and to say so with a terminated event. A sink that can make room for
	// that write and the event should (the SSE sink raises its connection's
	// send buffer): a client still reading then gets the event however
	// slowly it reads. It is the only method called from another goroutine
	// (the stream's lag watcher) and must be safe for that.
	Abort(deadline time.Time)
}

// End says why a stream ended.
type End string

// Reasons a stream ends.
const (
	EndTerminal    End = "terminal"     // the job's terminal event was written
	EndClientGone  End = "client_gone"  // the client (or the node) closed it
	EndWriteFailed End = "write_failed" // a write failed or timed out
	EndSlow        End = "slow"         // terminated as a slow consumer
	EndIdle        End = "idle"
	EndMaxDuration End = "max_duration"
	EndResync      End = "resync" // the position was older than retained history
)

// ClientLeft reports whether the client, not the node, ended the stream:
// the case that cancels a job whose POST opened the stream.
func (e End) ClientLeft() bool { return e == EndClientGone || e == EndWriteFailed }

// Result is how a stream went.
type Result struct {
	End     End
	LastSeq uint64
	// Gaps counts the gaps the drop-oldest policy made (a stream that fell
	// behind skipping ahead); Dropped counts every event a gap skipped,
	// those a stream read from the start finds no longer retained included.
	Gaps    int
	Dropped int
	// LagEvents and LagBytes are the stream's queue when it was terminated
	// as slow: how far past its bound it was allowed to get.
	LagEvents int
	LagBytes  int64
}

// Request is one stream of one job.
type Request struct {
	Job *core.Job
	// After is the position to start after (0: from the beginning).
	After uint64
	// Filter, when non-nil, is the set of event kinds to send. Terminal
	// events are always sent: a stream must say that it ended.
	Filter map[core.EventKind]bool
	Policy Policy
	// Token appends the resume token for an event to dst and returns it
	// (dst as it was: no token for this one), issued at now: the clock is
	// read once per batch, not per event. nil sends no ids.
	Token func(dst []byte, ev core.Event, now time.Time) []byte
	// Writers, when set, is the node's count of what its streams write,
	// this one's included: the first output is flushed ahead of its batch
	// only when the stream had the node to itself (see writeBatch). nil:
	// the stream is taken to have it to itself.
	Writers *Writers
	// Sent, when set, makes the stream a paced one: the job's owner
	// stream, whose worker is paced by it (core.Engine.StreamSent). It is
	// told the stream's position after each flush that moved it. A paced
	// stream is never judged by how far behind it is (its job's worker
	// waits for it instead), only by Policy.Stall: no progress for that
	// long with something to send.
	Sent func(seq uint64)
}

// Run writes the stream until the job's terminal event, the client leaving,
// or a policy ending it. It is the stream's one writer, and its only
// goroutine.
//
// The stream's queue is what was appended to the job after the stream
// opened and is not yet written: a replay of history that already existed
// is catch-up, not lag, so a client that resumes far back is never judged
// slow for it. A lag watcher (Terminate streams only; watch.go) is run by
// the append that takes that queue past its bound, so a writer blocked on
// a client that stopped reading is aborted the moment the bound is passed,
// not when the write finally returns. A paced stream (Request.Sent) has a
// stall watcher instead, whatever its slow policy: its queue never passes
// the bound, because its job's worker waits for it.
func Run(ctx context.Context, req Request, sink Sink) Result {
	w := newWriter(req, sink)
	defer w.stopClocks()
	if w.sent != nil || req.Policy.Slow == Terminate {
		defer startWatch(w)()
	}
	w.run(ctx)
	return w.res
}

// Writers counts what the streams of one node write: the streams being
// written now, each counted from the read that found events for it until
// it has written and flushed them (blocked in a write or waiting for a
// processor included), and the batches they began. The zero value is
// ready for use.
type Writers struct {
	n       atomic.Int64
	batches atomic.Uint64
}

// readBatch is how many events are taken from the history per read.
const readBatch = 64

// writer is one stream while Run writes it. Run's goroutine owns it; the
// watcher shares only written, overflow and fields that never change (h,
// base, p, sink: its Abort is safe from another goroutine).
type writer struct {
	jobID  string
	h      *core.History
	filter map[core.EventKind]bool
	token  func(dst []byte, ev core.Event, now time.Time) []byte
	// tok is the buffer token signs each event's token into.
	tok     []byte
	writers *Writers
	// batchSeen is writers.batches as this stream's latest batch began it
	// (as the stream opened, before its first).
	batchSeen uint64
	// sent is Request.Sent (nil: not paced); reported is the position it
	// was last told.
	sent     func(seq uint64)
	reported uint64
	p        Policy
	sink     Sink
	res      Result
	// start is when the stream opened: the setup clock runs from it.
	start time.Time
	// flushed turns true with the first flush that goes through: until
	// then the setup clock bounds every write, after it WriteTimeout does.
	flushed bool
	// deadlineSet is when setDeadline last moved the WriteTimeout deadline.
	deadlineSet time.Time
	// cursor is the last position read: written, filtered out or skipped.
	cursor uint64
	// base is the history's head when the stream opened. The queue is what
	// lies after max(base, cursor): a replay is catch-up, not lag.
	base uint64
	// written is cursor as the watcher sees it, stored once the event at
	// it is written or filtered out.
	written  atomic.Uint64
	overflow overflow
	// The stream's clocks: a heartbeat is due at hbDue and the stream is
	// idle at idleDue, both moved by every flushed batch of events (a
	// heartbeat moves hbDue alone), and it ends at maxDue, whatever
	// happens. One timer, clock, fires at the earliest of the three: a
	// stream pays one timer and one reset per batch, not three and two.
	clock                  *time.Timer
	hbDue, idleDue, maxDue time.Time
	// outputFlushed: an output appended after the stream opened was
	// written (see writeBatch).
	outputFlushed bool
}

func newWriter(req Request, sink Sink) *writer {
	p := req.Policy
	now := time.Now()
	w := &writer{
		jobID: req.Job.ID, h: req.Job.History, filter: req.Filter, token: req.Token, writers: req.Writers,
		sent: req.Sent, reported: req.After, p: p, sink: sink,
		res:      Result{LastSeq: req.After},
		start:    now,
		cursor:   req.After,
		base:     max(req.Job.History.Head(), req.After),
		overflow: overflow{abortc: make(chan struct{})},
		hbDue:    now.Add(p.Heartbeat),
		idleDue:  now.Add(p.Idle),
		maxDue:   now.Add(p.MaxDuration),
	}
	if req.Token != nil {
		// Room for any token (resume.MaxTokenLen): one allocation per
		// stream, not the appends' growth.
		w.tok = make([]byte, 0, resume.MaxTokenLen)
	}
	w.clock = time.NewTimer(w.nextDue().Sub(now))
	w.written.Store(req.After)
	if w.writers != nil {
		w.batchSeen = w.writers.batches.Load()
	}
	return w
}

func (w *writer) stopClocks() { w.clock.Stop() }

// nextDue is the earliest of the stream's clocks.
func (w *writer) nextDue() time.Time {
	next := w.hbDue
	if w.idleDue.Before(next) {
		next = w.idleDue
	}
	if w.maxDue.Before(next) {
		next = w.maxDue
	}
	return next
}

// rewind moves the heartbeat and idle clocks to now, after a flushed
// batch of events.
func (w *writer) rewind() {
	now := time.Now()
	w.hbDue, w.idleDue = now.Add(w.p.Heartbeat), now.Add(w.p.Idle)
	resetTimer(w.clock, w.nextDue().Sub(now))
}

// run writes the stream until it is over; w.res then says how it went.
func (w *writer) run(ctx context.Context) {
	// The headers go out at once when there is nothing to send yet, so a
	// client knows its stream is open before the job has anything to say;
	// otherwise with the first batch (a POST's accepted event, a replay):
	// one write instead of two. step flushes them before it first waits.
	if w.h.Head() <= w.cursor && !w.flush() {
		w.failed()
		return
	}
	for !w.step(ctx) {
	}
}

// step writes the next batch of the history, or what replaces it (a gap, a
// resync, a verdict of slow), or waits for the history to grow. Like every
// method below that returns over, it reports whether the stream ended.
func (w *writer) step(ctx context.Context) (over bool) {
	if e, b, ok := w.overflow.get(); ok {
		// The lag watcher judged the stream slow while the writer was in a
		// write (or its flush): the queue is what it measured the moment
		// the bound was passed, not what it grew to while that write
		// finished.
		return w.slow(e, b)
	}
	rd, oldest, err := w.h.Since(w.cursor, readBatch)
	if errors.Is(err, core.ErrHistoryGone) {
		return w.historyGone(oldest)
	}
	if w.sent == nil {
		// A paced stream's queue is its job's worker waiting: no bound.
		if lagE, lagB, _ := w.h.Lag(max(w.cursor, w.base)); lagE > w.p.MaxLagEvents || lagB > w.p.MaxLagBytes {
			return w.behind(lagE, lagB)
		}
	}
	if w.writeBatch(rd.Events) {
		return true
	}
	if len(rd.Events) == readBatch {
		return false // there may be more to read at once
	}
	if !w.flushed && !w.flush() { // nothing written yet: the headers
		return w.failed()
	}
	return w.wait(ctx, rd.Wake)
}

// historyGone handles a position the history no longer retains: a resumed
// stream must resync; a client starting from the beginning is not resuming,
// and gets what is retained after a gap event that says what is not; and a
// drop-oldest stream whose position fell out of the history asked for
// exactly that too: it skips to the oldest retained event.
func (w *writer) historyGone(oldest uint64) (over bool) {
	switch {
	case w.cursor == 0:
		// The start of a history no longer retained is not a stream
		// falling behind: not a drop-oldest gap (Result.Gaps).
		return w.skip(oldest-1, false, "the oldest events of this job are no longer retained")
	case w.p.Slow == DropOldest:
		return w.skip(oldest-1, true, "this stream asked for drop-oldest and fell behind the retained history: these events were skipped")
	}
	return w.end(EndResync, Resync, map[string]any{
		"oldest_seq": oldest, "after_seq": w.cursor,
		"detail": "full resync required: the events after your position are no longer retained",
	})
}

// behind handles a queue past its bound: terminated as slow, or, on a
// drop-oldest stream, the oldest unsent events skipped down to half the
// bound.
func (w *writer) behind(lagEvents int, lagBytes int64) (over bool) {
	if w.p.Slow == Terminate {
		if e, b, ok := w.overflow.get(); ok {
			lagEvents, lagBytes = e, b // the watcher's verdict, if it just gave one (see step)
		}
		return w.slow(lagEvents, lagBytes)
	}
	to := w.h.SkipTo(max(w.cursor, w.base), w.p.MaxLagEvents/2+1, w.p.MaxLagBytes/2+1)
	return w.skip(to, true, "this stream asked for drop-oldest and fell behind: these events were skipped")
}

// skip moves the cursor to the position to, past events the client will
// not get, and says so with a gap event. dropOldest says the drop-oldest
// policy made the gap (it counts in Result.Gaps).
func (w *writer) skip(to uint64, dropOldest bool, detail string) (over bool) {
	w.setDeadline()
	if w.sink.Control(Gap, map[string]any{
		"job_id": w.jobID, "from_seq": w.cursor + 1, "to_seq": to, "dropped": to - w.cursor,
		"detail": detail,
	}) != nil {
		return w.failed()
	}
	if dropOldest {
		w.res.Gaps++
	}
	w.res.Dropped += int(to - w.cursor)
	w.cursor = to
	return false
}

// writeBatch writes the events of one read that pass the filter, then
// flushes them and restarts the heartbeat and idle clocks if there were
// any. The job's terminal event ends the stream. The clock is read once
// for the batch's tokens: their issue time is to the second anyway.
//
// The first output event appended after the stream opened is flushed as
// soon as it is written, ahead of the rest of its batch, when the stream
// has had the node to itself (Request.Writers): no other stream of the
// node is being written, and none began a batch since this stream's
// previous one (or its opening), while it waited for that output. The
// time to a job's first output is what a streaming client waits on, and
// a worker that answers at once sends its outputs together, so its first
// would otherwise wait for the whole batch to be encoded and signed. The
// flush costs one more write syscall per stream. When other streams are
// being written, the node's processors are shared with them: that write
// would come out of every stream's throughput, and what it would save is
// the encoding of the rest of one batch, which the first output's wait
// for a processor already exceeds. The first output then goes out with
// its batch. A replay of what the history held when the stream opened is
// catch-up, and goes out in whole batches.
func (w *writer) writeBatch(events []core.Event) (over bool) {
	if len(events) == 0 {
		return false
	}
	alone := true // the stream has had the node to itself (see above)
	if w.writers != nil {
		w.writers.n.Add(1)
		defer w.writers.n.Add(-1)
		b := w.writers.batches.Add(1)
		alone = b-1 == w.batchSeen
		w.batchSeen = b
	}
	wrote := false
	var now time.Time // the tokens' clock, read at the first
	for i, ev := range events {
		if e, b, ok := w.overflow.get(); ok {
			return w.slow(e, b)
		}
		w.cursor = ev.Seq
		if w.filter != nil && !w.filter[ev.Kind] && !ev.Kind.Terminal() {
			w.written.Store(w.cursor)
			continue
		}
		w.tok = w.tok[:0]
		if w.token != nil {
			if now.IsZero() {
				now = time.Now()
			}
			w.tok = w.token(w.tok, ev, now)
		}
		w.setDeadline()
		if err := w.sink.Event(ev, w.tok); err != nil {
			return w.failed()
		}
		w.written.Store(w.cursor)
		wrote = true
		w.res.LastSeq = ev.Seq
		if ev.Kind.Terminal() {
			w.flush()
			return w.end(EndTerminal, "", nil)
		}
		if ev.Kind == core.EventOutput && !w.outputFlushed && ev.Seq > w.base {
			w.outputFlushed = true
			if i < len(events)-1 && alone && (w.writers == nil || w.writers.n.Load() == 1) && !w.flush() {
				return w.failed()
			}
		}
	}
	if !wrote {
		return false
	}
	if !w.flush() {
		return w.failed()
	}
	w.rewind()
	return false
}

// wait blocks until the history grows, the watcher judges the stream slow,
// a clock fires or the client leaves. A heartbeat keeps the stream open.
func (w *writer) wait(ctx context.Context, grown <-chan struct{}) (over bool) {
	select {
	case <-grown:
		return false
	case <-w.overflow.abortc:
		e, b, _ := w.overflow.get()
		return w.slow(e, b)
	case <-w.clock.C:
		return w.clockFired()
	case <-ctx.Done():
		return w.end(EndClientGone, "", nil)
	}
}

// clockFired acts on the clocks that are due: the maximum duration first,
// then idleness, then a heartbeat, which keeps the stream open.
func (w *writer) clockFired() (over bool) {
	now := time.Now()
	switch {
	case !now.Before(w.maxDue):
		return w.end(EndMaxDuration, Terminated, map[string]any{
			"reason": "max_duration", "resume_after_seq": w.cursor,
			"detail": "the stream reached its maximum duration; reconnect with Last-Event-ID to continue",
		})
	case !now.Before(w.idleDue):
		return w.end(EndIdle, Terminated, map[string]any{
			"reason": "idle", "resume_after_seq": w.cursor,
			"detail": "no event for the idle timeout; reconnect with Last-Event-ID to continue",
		})
	case !now.Before(w.hbDue):
		w.setDeadline()
		if w.sink.Heartbeat() != nil || !w.flush() {
			return w.failed()
		}
		w.hbDue = now.Add(w.p.Heartbeat)
	}
	// The timer fired, so it needs no Stop before its Reset.
	w.clock.Reset(w.nextDue().Sub(now))
	return false
}

// setDeadline bounds the next write by the setup clock until the first
// flush went through, by WriteTimeout after.
//
// Moving a connection's deadline updates a timer in the runtime's poller,
// and this runs for every event: a deadline set less than WriteTimeout/16
// ago is left as it is, so a write gets between 15/16 of WriteTimeout and
// all of it.
func (w *writer) setDeadline() {
	if !w.flushed {
		_ = w.sink.SetWriteDeadline(w.start.Add(w.p.Setup))
		return
	}
	now := time.Now()
	if !w.deadlineSet.IsZero() && now.Sub(w.deadlineSet) < w.p.WriteTimeout/16 {
		return
	}
	w.deadlineSet = now
	_ = w.sink.SetWriteDeadline(now.Add(w.p.WriteTimeout))
}

// flush hands what was written to the transport and reports whether it
// went through. A paced stream then reports its position.
func (w *writer) flush() bool {
	w.setDeadline()
	if err := w.sink.Flush(); err != nil {
		return false
	}
	w.flushed = true
	if w.sent != nil && w.cursor > w.reported {
		w.reported = w.cursor
		w.sent(w.cursor)
	}
	return true
}

// end ends the stream for the reason e, with the control event c (none if
// empty) carrying data and the job id; it always reports over.
func (w *writer) end(e End, c Control, data map[string]any) (over bool) {
	w.res.End = e
	if c != "" {
		w.setDeadline()
		data["job_id"] = w.jobID
		if w.sink.Control(c, data) == nil {
			_ = w.sink.Flush()
		}
	}
	return true
}

// slow ends the stream as a slow consumer whose queue was lagEvents,
// lagBytes.
func (w *writer) slow(lagEvents int, lagBytes int64) (over bool) {
	w.res.LagEvents, w.res.LagBytes = lagEvents, lagBytes
	detail := "the stream fell too far behind; reconnect with Last-Event-ID set to the last id you received"
	if w.sent != nil {
		detail = "the stream made no progress for the stall timeout; reconnect with Last-Event-ID set to the last id you received (the job waits for you within its grace window)"
	}
	return w.end(EndSlow, Terminated, map[string]any{
		"reason": "slow_consumer", "resume_after_seq": w.res.LastSeq,
		"lag_events": lagEvents, "lag_bytes": lagBytes, "detail": detail,
	})
}

// failed ends a stream whose write failed: as slow if the watcher aborted
// it (the terminated event cannot get through a connection the client
// stopped reading, but the count and the reason are right).
func (w *writer) failed() (over bool) {
	if e, b, ok := w.overflow.get(); ok {
		return w.slow(e, b)
	}
	return w.end(EndWriteFailed, "", nil)
}

func resetTimer(t *time.Timer, d time.Duration) {
	t.Stop()
	t.Reset(d)
}
