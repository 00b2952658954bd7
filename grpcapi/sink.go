package grpcapi

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/stream"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// KindHeartbeat is the JobEvent kind of a heartbeat: liveness only, never
// an acknowledgement and never an ordering guarantee.
const KindHeartbeat = "heartbeat"

// sendStream is the send side of a server stream: what the sender
// goroutine calls, and nothing else does.
type sendStream interface {
	Send(*pb.JobEvent) error
	SendHeader(metadata.MD) error
}

var (
	errWriteTimeout = fmt.Errorf("grpcapi: write deadline exceeded: %w", os.ErrDeadlineExceeded)
	errAborted      = fmt.Errorf("grpcapi: stream aborted: %w", os.ErrDeadlineExceeded)
	errStreamEnded  = errors.New("grpcapi: stream ended")
)

// op is one thing handed to the sender: an event to send, or a flush
// marker the sender closes once everything handed before it was sent.
type op struct {
	ev      *pb.JobEvent
	flushed chan struct{}
}

// sink writes one job stream on gRPC; it implements stream.Sink.
//
// A gRPC Send cannot be interrupted: it blocks on flow control until the
// client reads or the stream ends. So the sink does not call Send itself.
// It hands each message through an unbuffered channel to a dedicated sender
// goroutine (send), the stream's only Send caller, and Event, Control,
// Heartbeat and Flush wait on that handoff — and Flush on the sender having
// sent everything handed to it — only until the write deadline set by
// SetWriteDeadline. A client that does not read therefore fails the write
// after the write timeout, as a blocked SSE write does, and the one writer
// (stream.Run) ends the stream. The unbuffered handoff keeps the transport's
// readiness visible: a message is taken only when the previous Send
// returned, so nothing queues here beyond what stream.Run bounds.
//
// Abort, which the stream's lag watcher calls concurrently with the writer,
// replaces the deadline of the wait in progress and of every later one,
// whatever SetWriteDeadline says afterwards: a writer blocked on a client
// that stopped reading fails when the abort deadline passes (at once for a
// deadline already past) and, if the client reads again in time, still gets
// its terminated event through.
//
// The handler owns the sender goroutine. When stream.Run returns, the
// handler calls stop, which lets an idle sender end and waits for it (no
// longer than the write deadline); then the handler returns. If the sender
// is still blocked in Send at that point — its client stopped reading —
// returning from the handler ends the gRPC stream, which cancels the
// stream's context, and a Send blocked on flow control returns as soon as
// that context is done: the sender goroutine ends with the stream, never
// later. JobServer.Wait waits for it.
type sink struct {
	st   sendStream
	job  *core.Job
	snap uint64

	ops    chan op       // the handoff, unbuffered
	quit   chan struct{} // closed by stop: the writer wrote its last
	exited chan struct{} // closed when the sender returned
	err    error         // why the sender returned; read only after exited

	abortOnce sync.Once
	abortc    chan struct{} // closed by the first Abort
	abortAt   time.Time     // written before abortc is closed

	// Used only by the writer (stream.Run's goroutine, then the handler's
	// stop, which is the same goroutine).
	deadline time.Time
	timer    *time.Timer
	lastErr  error // the result of the latest write or flush
}

var _ stream.Sink = (*sink)(nil)

func newSink(st sendStream, j *core.Job, snap uint64) *sink {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &sink{
		st: st, job: j, snap: snap,
		ops:    make(chan op),
		quit:   make(chan struct{}),
		exited: make(chan struct{}),
		abortc: make(chan struct{}),
		timer:  t,
	}
}

// send is the stream's only Send (and SendHeader) caller. It ends when
// stop is called while it is idle, or when a Send fails — which happens at
// the latest when the stream ends (see sink).
func (s *sink) send() {
	defer close(s.exited)
	headerSent := false
	for {
		select {
		case <-s.quit:
			s.err = errStreamEnded
			return
		case o := <-s.ops:
			var err error
			if o.ev != nil {
				headerSent = true
				err = s.st.Send(o.ev)
			} else {
				// The first flush opens the stream: headers (x-job-id) go
				// out before the job has anything to say, as on SSE.
				if !headerSent {
					headerSent = true
					err = s.st.SendHeader(nil)
				}
				if err == nil {
					close(o.flushed)
				}
			}
			if err != nil {
				s.err = err
				return
			}
		}
	}
}

// Abort bounds the wait in progress and every later one by deadline,
// whatever SetWriteDeadline says after it. Safe from any goroutine; the
// first call wins.
func (s *sink) Abort(deadline time.Time) {
	s.abortOnce.Do(func() {
		s.abortAt = deadline
		close(s.abortc)
	})
}

// SetWriteDeadline bounds the handoffs and flushes that follow, unless the
// stream was aborted.
func (s *sink) SetWriteDeadline(t time.Time) error {
	s.deadline = t
	return nil
}

// Event hands a job event, with its envelope and resume token, to the
// sender.
func (s *sink) Event(ev core.Event, token string) error {
	o := op{ev: &pb.JobEvent{
		Kind: string(ev.Kind), JobId: s.job.ID,
		Generation: ev.Stream, Seq: ev.Seq, Snapshot: s.snap, Attempt: ev.Gen,
		ResumeToken: token, DataJson: eventData(s.job, ev, s.snap),
	}}
	return s.write(&o, nil)
}

// Control hands a control event (no position, no token) to the sender.
func (s *sink) Control(c stream.Control, data map[string]any) error {
	o := op{ev: &pb.JobEvent{Kind: string(c), JobId: s.job.ID, DataJson: stream.ControlData(data)}}
	return s.write(&o, nil)
}

// Heartbeat hands a heartbeat to the sender: a JobEvent of kind
// "heartbeat" with no data and no position. Liveness only.
func (s *sink) Heartbeat() error {
	o := op{ev: &pb.JobEvent{Kind: KindHeartbeat, JobId: s.job.ID}}
	return s.write(&o, nil)
}

// Flush returns once the sender has sent everything handed to it before:
// the transport took it (gRPC's Send returns when flow control lets the
// message through, not when the client received it).
func (s *sink) Flush() error {
	done := make(chan struct{})
	if err := s.write(&op{flushed: done}, nil); err != nil {
		return err
	}
	return s.write(nil, done)
}

// write hands o to the sender or, with o nil, waits for done, under the
// write deadline (the abort deadline once aborted), and records the result.
func (s *sink) write(o *op, done <-chan struct{}) error {
	s.lastErr = s.wait(o, done)
	return s.lastErr
}

func (s *sink) wait(o *op, done <-chan struct{}) error {
	var ops chan<- op // nil: never ready
	var v op
	if o != nil {
		ops, v = s.ops, *o
	}
	abortc := s.abortc
	for {
		deadline, aborted := s.deadline, false
		select {
		case <-s.abortc:
			deadline, aborted, abortc = s.abortAt, true, nil
		default:
		}
		select {
		case <-s.exited:
			return s.err
		default:
		}
		timeoutErr := errWriteTimeout
		if aborted {
			timeoutErr = errAborted
		}
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			return timeoutErr
		}
		// The sender usually waits already (its last Send returned): then
		// the hand-off needs no timer.
		select {
		case ops <- v:
			return nil
		case <-done:
			return nil
		default:
		}
		timeout, stop := s.timerFor(deadline)
		select {
		case ops <- v:
			stop()
			return nil
		case <-done:
			stop()
			return nil
		case <-timeout:
			return timeoutErr
		case <-abortc:
			// Aborted while waiting: wait again, now under the abort
			// deadline.
			stop()
			continue
		case <-s.exited:
			stop()
			return s.err
		}
	}
}

// timerFor returns a channel that fires at deadline (nil: never) and a
// function to stop it.
func (s *sink) timerFor(deadline time.Time) (<-chan time.Time, func()) {
	if deadline.IsZero() {
		return nil, func() {}
	}
	s.timer.Reset(time.Until(deadline))
	return s.timer.C, func() { s.timer.Stop() }
}

// stop ends the sender once the writer is done. It waits for the sender to
// return — at once when it is idle, which it is after every successful
// Flush — but no longer than the write deadline (the abort deadline once
// aborted): a sender still blocked in Send then ends with the stream (see
// sink).
func (s *sink) stop() {
	close(s.quit)
	_ = s.wait(nil, s.exited)
}

// lastWriteFailed reports whether the stream's last write or flush failed:
// its client may not have been told why the stream ended.
func (s *sink) lastWriteFailed() bool { return s.lastErr != nil }
