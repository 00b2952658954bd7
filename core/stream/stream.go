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
	"sync"
	"time"

	"github.com/switchyard/switchyard/core"
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
	w := newWriter(req, sink)
	defer w.stopClocks()
	if req.Policy.Slow == Terminate {
		stopc := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() { watch(w.h, &w.written, w.base, w.p, &w.overflow, sink, stopc) })
		defer func() { close(stopc); wg.Wait() }()
	}
	w.run(ctx)
	return w.res
}
