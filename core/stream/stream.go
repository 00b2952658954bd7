// Package stream is the one writer of a job's outbound stream, shared by
// every transport (SSE today, gRPC job streams next): it reads the job's
// History with its own cursor and applies ADR-GRPC-005 — a bound on how far
// the stream may fall behind (both events and bytes), terminate as the
// default slow-consumer policy and drop-oldest only when a request asks for
// it, an envelope on every event, resume tokens, and four separate clocks.
//
// "Accepted" in this package means appended to the History. Nothing here
// can know that a client received an event: a transport call returns when
// bytes are handed to the kernel.
package stream

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchyard/switchyard/core"
)

// SlowPolicy is what happens when a stream falls too far behind.
type SlowPolicy int

// Slow-consumer policies.
const (
	// Terminate ends the stream with a terminated event; the client resumes
	// from the last id it received. The default: a client cannot detect a
	// message it never saw, so dropping must be asked for.
	Terminate SlowPolicy = iota
	// DropOldest skips the oldest unsent events and says so with a gap event.
	DropOldest
)

// Policy is one stream's bounds and clocks.
type Policy struct {
	// MaxLagEvents and MaxLagBytes bound the events appended to the job but
	// not yet written to this stream: its queue.
	MaxLagEvents int
	MaxLagBytes  int64
	Slow         SlowPolicy
	// Setup bounds the time until the first write has been handed over.
	Setup time.Duration
	// Idle ends a stream that wrote no event for this long (heartbeats do
	// not count: they are not events).
	Idle time.Duration
	// MaxDuration ends any stream after this long; the client resumes.
	MaxDuration time.Duration
	// Heartbeat is sent after this much silence. Liveness only.
	Heartbeat time.Duration
	// WriteTimeout bounds each write after the first: a client that cannot
	// take one in this long is gone or hopelessly slow.
	WriteTimeout time.Duration
}

// DefaultPolicy returns the bounds and clocks a node uses unless told
// otherwise.
func DefaultPolicy() Policy {
	return Policy{
		MaxLagEvents: 1024,
		MaxLagBytes:  4 << 20,
		Setup:        10 * time.Second,
		Idle:         5 * time.Minute,
		MaxDuration:  time.Hour,
		Heartbeat:    15 * time.Second,
		WriteTimeout: 10 * time.Second,
	}
}

// Validate refuses a combination in which one clock could never fire, or a
// bound that could never hold an event.
func (p Policy) Validate() error {
	bad := func(field string, v any, msg string) error {
		return &core.ConfigError{Field: field, Value: v, Err: errors.New(msg)}
	}
	switch {
	case p.MaxLagEvents < 1:
		return bad("stream-max-events", p.MaxLagEvents, "must be positive")
	case p.MaxLagBytes < 1:
		return bad("stream-max-bytes", p.MaxLagBytes, "must be positive")
	case p.Setup <= 0:
		return bad("stream-setup-timeout", p.Setup, "must be positive")
	case p.Idle <= 0:
		return bad("stream-idle-timeout", p.Idle, "must be positive")
	case p.MaxDuration <= 0:
		return bad("stream-max-duration", p.MaxDuration, "must be positive")
	case p.Heartbeat <= 0:
		return bad("stream-heartbeat", p.Heartbeat, "must be positive")
	case p.WriteTimeout <= 0:
		return bad("stream-write-timeout", p.WriteTimeout, "must be positive")
	case p.Heartbeat >= p.Idle:
		return bad("stream-heartbeat", p.Heartbeat, "must be shorter than stream-idle-timeout, or the idle timeout fires on a healthy stream before any heartbeat could show it alive")
	case p.Setup >= p.Idle:
		return bad("stream-setup-timeout", p.Setup, "must be shorter than stream-idle-timeout, or the idle timeout could pre-empt setup")
	case p.Idle >= p.MaxDuration:
		return bad("stream-idle-timeout", p.Idle, "must be shorter than stream-max-duration, or it could never fire")
	case p.WriteTimeout >= p.Idle:
		return bad("stream-write-timeout", p.WriteTimeout, "must be shorter than stream-idle-timeout")
	}
	return nil
}

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
	// Event writes a job event with its resume token.
	Event(ev core.Event, token string) error
	// Control writes a control event with JSON data.
	Control(c Control, data map[string]any) error
	// Heartbeat writes a liveness signal. It is not an acknowledgement and
	// not an ordering guarantee; never make it one.
	Heartbeat() error
	// Flush hands what was written to the transport.
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

// abortGrace is how long a stream judged slow gets to finish the write it
// is blocked in and send its terminated event. A client that reads slowly
// gets the event telling it how to resume (on SSE at once, the sink making
// room for it; see Sink.Abort); a write still blocked when the grace runs
// out is cut — and the client resumes all the same.
func abortGrace(p Policy) time.Duration { return min(p.WriteTimeout, time.Second) }

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
	// Token returns the resume token for an event; nil sends no id.
	Token func(ev core.Event) string
}

// readBatch is how many events are taken from the history per read.
const readBatch = 64

// Run writes the stream until the job's terminal event, the client leaving,
// or a policy ending it. It is the stream's one writer.
//
// The stream's queue is what was appended to the job after the stream
// opened and is not yet written: a replay of history that already existed
// is catch-up, not lag, so a client that resumes far back is never judged
// slow for it. A watcher goroutine (Terminate streams only) is woken by
// the append that takes that queue past its bound, so a writer blocked on
// a client that stopped reading is aborted the moment the bound is passed,
// not when the write finally returns.
func Run(ctx context.Context, req Request, sink Sink) Result {
	p := req.Policy
	start := time.Now()
	res := Result{LastSeq: req.After}
	h := req.Job.History
	heartbeat := time.NewTimer(p.Heartbeat)
	defer heartbeat.Stop()
	idle := time.NewTimer(p.Idle)
	defer idle.Stop()
	maxDur := time.NewTimer(p.MaxDuration)
	defer maxDur.Stop()

	cursor := req.After
	base := max(h.Head(), cursor)
	var written atomic.Uint64
	written.Store(cursor)
	over := &overflow{abortc: make(chan struct{})}
	if p.Slow == Terminate {
		stopw := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() { watch(h, &written, base, p, over, sink, stopw) })
		defer func() { close(stopw); wg.Wait() }()
	}

	first := true
	deadline := func() {
		if first {
			_ = sink.SetWriteDeadline(start.Add(p.Setup))
		} else {
			_ = sink.SetWriteDeadline(time.Now().Add(p.WriteTimeout))
		}
	}
	end := func(e End, c Control, data map[string]any) Result {
		res.End = e
		if c != "" {
			deadline()
			data["job_id"] = req.Job.ID
			if sink.Control(c, data) == nil {
				_ = sink.Flush()
			}
		}
		return res
	}
	slow := func(lagEvents int, lagBytes int64) Result {
		res.LagEvents, res.LagBytes = lagEvents, lagBytes
		return end(EndSlow, Terminated, map[string]any{
			"reason": "slow_consumer", "resume_after_seq": res.LastSeq,
			"lag_events": lagEvents, "lag_bytes": lagBytes,
			"detail": "the stream fell too far behind; reconnect with Last-Event-ID set to the last id you received",
		})
	}
	// failed ends a stream whose write failed: as slow if the watcher
	// aborted it (the terminated event cannot get through a connection the
	// client stopped reading, but the count and the reason are right).
	failed := func() Result {
		if e, b, ok := over.get(); ok {
			return slow(e, b)
		}
		return end(EndWriteFailed, "", nil)
	}
	flush := func() bool {
		deadline()
		if err := sink.Flush(); err != nil {
			return false
		}
		first = false
		return true
	}
	// The headers (and a replay, if any) go out at once, so a client knows
	// its stream is open before the job has anything to say.
	if !flush() {
		return failed()
	}
	for {
		rd, oldest, err := h.Since(cursor, readBatch)
		if errors.Is(err, core.ErrHistoryGone) {
			if cursor > 0 && p.Slow != DropOldest {
				return end(EndResync, Resync, map[string]any{
					"oldest_seq": oldest, "after_seq": cursor,
					"detail": "full resync required: the events after your position are no longer retained",
				})
			}
			// A client starting from the beginning is not resuming: it gets
			// what is retained, after a gap event that says what is not. A
			// drop-oldest stream whose position fell out of the history asked
			// for exactly that: it skips to the oldest retained event too.
			detail, dropOldest := "the oldest events of this job are no longer retained", cursor > 0
			if dropOldest {
				detail = "this stream asked for drop-oldest and fell behind the retained history: these events were skipped"
			}
			deadline()
			if sink.Control(Gap, map[string]any{
				"job_id": req.Job.ID, "from_seq": cursor + 1, "to_seq": oldest - 1, "dropped": oldest - 1 - cursor,
				"detail": detail,
			}) != nil {
				return failed()
			}
			if dropOldest {
				// Only the drop-oldest policy's gaps count as such: the start
				// of a history no longer retained is not a stream falling
				// behind.
				res.Gaps++
			}
			res.Dropped += int(oldest - 1 - cursor)
			cursor = oldest - 1
			continue
		}
		if lagE, lagB, _ := h.Lag(max(cursor, base)); lagE > p.MaxLagEvents || lagB > p.MaxLagBytes {
			if p.Slow == Terminate {
				return slow(lagE, lagB)
			}
			to := h.SkipTo(max(cursor, base), p.MaxLagEvents/2+1, p.MaxLagBytes/2+1)
			deadline()
			if err := sink.Control(Gap, map[string]any{
				"job_id": req.Job.ID, "from_seq": cursor + 1, "to_seq": to, "dropped": to - cursor,
				"detail": "this stream asked for drop-oldest and fell behind: these events were skipped",
			}); err != nil {
				return failed()
			}
			res.Gaps++
			res.Dropped += int(to - cursor)
			cursor = to
			continue
		}
		wrote := false
		for _, ev := range rd.Events {
			if e, b, ok := over.get(); ok {
				return slow(e, b)
			}
			cursor = ev.Seq
			if req.Filter != nil && !req.Filter[ev.Kind] && !ev.Kind.Terminal() {
				written.Store(cursor)
				continue
			}
			var tok string
			if req.Token != nil {
				tok = req.Token(ev)
			}
			deadline()
			if err := sink.Event(ev, tok); err != nil {
				return failed()
			}
			written.Store(cursor)
			wrote = true
			res.LastSeq = ev.Seq
			if ev.Kind.Terminal() {
				flush()
				return end(EndTerminal, "", nil)
			}
		}
		if wrote {
			if !flush() {
				return failed()
			}
			resetTimer(heartbeat, p.Heartbeat)
			resetTimer(idle, p.Idle)
		}
		if len(rd.Events) == readBatch {
			continue
		}
		select {
		case <-rd.Wake:
		case <-over.abortc:
			e, b, _ := over.get()
			return slow(e, b)
		case <-heartbeat.C:
			deadline()
			if sink.Heartbeat() != nil || !flush() {
				return failed()
			}
			heartbeat.Reset(p.Heartbeat)
		case <-idle.C:
			return end(EndIdle, Terminated, map[string]any{
				"reason": "idle", "resume_after_seq": cursor,
				"detail": "no event for the idle timeout; reconnect with Last-Event-ID to continue",
			})
		case <-maxDur.C:
			return end(EndMaxDuration, Terminated, map[string]any{
				"reason": "max_duration", "resume_after_seq": cursor,
				"detail": "the stream reached its maximum duration; reconnect with Last-Event-ID to continue",
			})
		case <-ctx.Done():
			return end(EndClientGone, "", nil)
		}
	}
}

// overflow is the watcher's verdict, read by the writer.
type overflow struct {
	once   sync.Once
	abortc chan struct{}
	events int
	bytes  int64
}

func (o *overflow) set(events int, bytes int64) {
	o.once.Do(func() {
		o.events, o.bytes = events, bytes
		close(o.abortc)
	})
}

func (o *overflow) get() (int, int64, bool) {
	select {
	case <-o.abortc:
		return o.events, o.bytes, true
	default:
		return 0, 0, false
	}
}

// watch aborts the stream's writer as soon as what was appended since the
// stream opened, and not yet written, passes a bound. It sleeps until an
// append takes the job past the bound as measured from the writer's
// position when it last looked (History.LagWait), so a stream that keeps
// up costs no wake-up per event; woken, it looks again from where the
// writer is now. It owns nothing but its loop; Run stops and waits for it.
func watch(h *core.History, written *atomic.Uint64, base uint64, p Policy, over *overflow, sink Sink, stopc <-chan struct{}) {
	for {
		e, b, passed, wake := h.LagWait(max(written.Load(), base), p.MaxLagEvents, p.MaxLagBytes)
		if passed {
			over.set(e, b)
			sink.Abort(time.Now().Add(abortGrace(p)))
			return
		}
		select {
		case <-wake:
		case <-stopc:
			h.StopLagWait(wake)
			return
		}
	}
}

func resetTimer(t *time.Timer, d time.Duration) {
	t.Stop()
	t.Reset(d)
}
