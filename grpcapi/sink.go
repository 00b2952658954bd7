package grpcapi

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
	"unsafe"

	"github.com/switchyard/switchyard/internal/chans"

	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/stream"
)

// KindHeartbeat is the JobEvent kind of a heartbeat: liveness only, never
// an acknowledgement and never an ordering guarantee.
const KindHeartbeat = "heartbeat"

// sendStream is the send side of a server stream: what the stream's writer
// calls, and nothing else does.
type sendStream interface {
	SendMsg(any) error
	SendHeader(metadata.MD) error
}

var (
	errWriteTimeout = fmt.Errorf("grpcapi: write deadline exceeded: %w", os.ErrDeadlineExceeded)
	errAborted      = fmt.Errorf("grpcapi: stream aborted: %w", os.ErrDeadlineExceeded)
	errStreamEnded  = errors.New("grpcapi: stream ended")
)

// sink writes one job stream on gRPC; it implements stream.Sink.
//
// The stream's writer (stream.Run) calls Send itself, on a goroutine of its
// own (a runner: JobServer.serve), with no hand-off per message: Send returns as
// soon as gRPC queued the message for its connection's writer, which
// batches what the connection's streams queued together into one socket
// write. Flush therefore has nothing left to wait for but the headers of a
// stream that sent nothing yet.
//
// A gRPC Send cannot be interrupted, though: it blocks on flow control when
// the client stops reading, until the stream ends. The handler's goroutine
// therefore watches the writer (watch) instead of writing: it waits for it
// to end, and gives up on it when a Send is still in progress at its write
// deadline (the one set by SetWriteDeadline, or Abort's). Giving up returns
// from the handler, which ends the gRPC stream and cancels its context; the
// blocked Send then fails at once, and the writer ends the stream as one
// whose write failed. So a client that does not read fails the write after
// the write timeout, as a blocked SSE write does. A write that starts with
// its deadline already past fails without being sent, as a write on a
// connection past its deadline does. Once the watch gave up, no Send starts
// any more.
//
// Abort, which the stream's lag watcher calls concurrently with the writer,
// replaces the deadline of the write in progress and of every later one,
// whatever SetWriteDeadline says afterwards: a writer blocked on a client
// that stopped reading is given up on when the abort deadline passes (at
// once for a deadline already past) and, if the client reads again in time,
// still gets its terminated event through.
//
// The writer reuses one message and one data buffer for every event (Send
// encodes the message before it returns), which the server's codec encodes
// into pooled memory (wireEvent).
//
// The sink decides the stream's message framing, and nothing else differs
// between the two: a JobEvent per message (Submit, Resume), each sent by
// the writer's Event, Control or Heartbeat; or, with maxBatch set
// (SubmitBatched, ResumeBatched), a JobEventBatch per flush: those calls
// encode their event into the pending batch (wireBatch), and Flush sends
// it as one message. The writer flushes what it had ready together (one
// read of the history), and the first output of a stream on its own (see
// stream.Run), so a batch adds no wait to any event: it holds what a
// JobEvent stream would have sent back to back. An event that would take
// the pending batch past maxBatch bytes sends the batch first; an event
// larger than maxBatch goes alone. The writes that fail, the deadlines
// and the watch are the same: in a batched stream they are the batch's
// Send, in Flush (or in the Event that sends a full batch).
type sink struct {
	st   sendStream
	job  *core.Job
	snap uint64
	// maxBatch, when not 0, batches the stream's events (see above) in
	// messages of at most that many bytes, unless one event is larger.
	maxBatch int

	// Used only by the writer.
	msg        wireEvent
	batch      wireBatch
	data       []byte
	headerSent bool
	err        error // a failed Send: every later write fails with it
	lastErr    error // the result of the latest write or flush

	mu       sync.Mutex
	deadline time.Time // SetWriteDeadline's
	abortAt  time.Time // Abort's, once aborted
	aborted  bool
	sending  bool // a Send is in progress
	gone     bool // the watch gave up on the writer: no Send starts
	// idle: the watch has no deadline to wait for (none, or one that passed
	// while no Send was in progress) and waits on moved for the next.
	idle   bool
	moved  chan struct{} // capacity 1: a new deadline, for an idle watch
	abortc chan struct{} // closed by the first Abort
}

var _ stream.Sink = (*sink)(nil)

// newSink returns the sink of a stream on st: maxBatch 0 sends a JobEvent
// per message, more batches the events (see sink).
func newSink(st sendStream, j *core.Job, snap uint64, maxBatch int) *sink {
	pool := mem.DefaultBufferPool()
	return &sink{st: st, job: j, snap: snap, maxBatch: maxBatch, msg: wireEvent{pool: pool}, batch: wireBatch{pool: pool},
		moved: make(chan struct{}, 1), abortc: make(chan struct{})}
}

// close releases what the writer holds; it runs once the writer is done.
func (s *sink) close() {
	s.msg.release()
	s.batch.release()
}

// Abort bounds the write in progress and every later one by deadline,
// whatever SetWriteDeadline says after it. Safe from any goroutine; the
// first call wins.
func (s *sink) Abort(deadline time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.aborted {
		return
	}
	s.aborted, s.abortAt = true, deadline
	close(s.abortc)
}

// SetWriteDeadline bounds the writes that follow, unless the stream was
// aborted.
func (s *sink) SetWriteDeadline(t time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.deadline = t
	if s.idle {
		s.idle = false
		chans.Notify(s.moved)
	}
	return nil
}

// deadlineLocked is the deadline of the write in progress or the next one
// (zero: none).
func (s *sink) deadlineLocked() time.Time {
	if s.aborted {
		return s.abortAt
	}
	return s.deadline
}

// Event sends a job event, with its envelope and resume token.
//
// The message's token is a string view of the writer's token bytes, not a
// copy: Send encodes the message before it returns (Marshal runs within
// it, whatever the codec), the bytes are not written to until Event
// returns (stream.Sink), and send clears the view once Send returned.
func (s *sink) Event(ev core.Event, token []byte) error {
	s.data = stream.AppendEventData(s.data[:0], s.job, ev, s.snap)
	s.msg.set(string(ev.Kind), s.job.ID, ev.Stream, ev.Seq, s.snap, ev.Gen, unsafe.String(unsafe.SliceData(token), len(token)), s.data)
	return s.send()
}

// Control sends a control event (no position, no token).
func (s *sink) Control(c stream.Control, data map[string]any) error {
	s.msg.set(string(c), s.job.ID, 0, 0, 0, 0, "", stream.ControlData(data))
	return s.send()
}

// Heartbeat sends a JobEvent of kind "heartbeat" with no data and no
// position. Liveness only.
func (s *sink) Heartbeat() error {
	s.msg.set(KindHeartbeat, s.job.ID, 0, 0, 0, 0, "", nil)
	return s.send()
}

// Flush sends a batched stream's pending batch, and opens a stream that
// sent nothing yet: its headers (x-job-id) go out before the job has
// anything to say, as on SSE. Everything written before it on a JobEvent
// stream was handed to the transport when its Send returned.
func (s *sink) Flush() error {
	// What was sent holds the chunk until gRPC wrote it; the next batch
	// takes another, and a stream that waits holds none.
	s.msg.release()
	if s.batch.n > 0 {
		return s.sendBatch()
	}
	if s.err == nil && !s.headerSent {
		s.lastErr = s.call(func() error { return s.st.SendHeader(nil) })
		if s.lastErr == nil {
			s.headerSent = true
		}
		return s.lastErr
	}
	s.lastErr = s.err
	return s.lastErr
}

// send sends s.msg under the write deadline, or adds it to the pending
// batch of a batched stream, and records the result.
func (s *sink) send() error {
	var err error
	if s.maxBatch == 0 {
		err = s.call(func() error { return s.st.SendMsg(&s.msg) })
		s.lastErr = err
		if err == nil {
			s.headerSent = true
		}
	} else {
		err = s.add()
	}
	s.msg.DataJson, s.msg.ResumeToken = nil, ""
	return err
}

// add adds s.msg to the pending batch, after sending the batch when the
// event would take it past maxBatch.
func (s *sink) add() error {
	if s.err != nil {
		s.lastErr = s.err
		return s.err
	}
	n, err := s.msg.size()
	if err != nil {
		s.err, s.lastErr = err, err // as a Send that failed to encode it
		return err
	}
	if s.batch.n > 0 && s.batch.len()+framedSize(n) > s.maxBatch {
		if err := s.sendBatch(); err != nil {
			return err
		}
	}
	s.batch.add(&s.msg, n)
	// Not written yet: lastWriteFailed counts the pending batch.
	s.lastErr = nil
	return nil
}

// sendBatch sends the pending batch as one message under the write
// deadline and records the result. The batch is empty afterwards: sent, or
// dropped with the stream, whose writes all fail from then on.
func (s *sink) sendBatch() error {
	s.lastErr = s.call(func() error { return s.st.SendMsg(&s.batch) })
	if s.lastErr == nil {
		s.headerSent = true
	}
	s.batch.release() // a Send that failed before encoding it
	return s.lastErr
}

// call runs one Send (or SendHeader) as the write in progress, unless a
// Send failed before, the watch gave up, or the deadline already passed.
func (s *sink) call(send func() error) error {
	if s.err != nil {
		return s.err
	}
	s.mu.Lock()
	if s.gone {
		s.mu.Unlock()
		return errStreamEnded
	}
	if d := s.deadlineLocked(); !d.IsZero() && !time.Now().Before(d) {
		aborted := s.aborted
		s.mu.Unlock()
		if aborted {
			return errAborted
		}
		return errWriteTimeout
	}
	s.sending = true
	s.mu.Unlock()
	err := send()
	s.mu.Lock()
	s.sending = false
	s.mu.Unlock()
	if err != nil {
		s.err = err
	}
	return err
}

// watch waits until the writer is done, and reports false; or, when a
// Send is still in progress at its deadline, gives up on the writer and
// reports true: the caller then ends the gRPC stream, which ends that Send
// (see sink).
func (s *sink) watch(done <-chan struct{}) (gaveUp bool) {
	t := time.NewTimer(time.Hour)
	t.Stop()
	defer t.Stop()
	abortc := s.abortc
	for {
		var timeout <-chan time.Time
		var moved <-chan struct{}
		s.mu.Lock()
		s.idle = false
		d := s.deadlineLocked()
		switch {
		case !d.IsZero() && time.Now().Before(d):
			t.Reset(time.Until(d))
			timeout = t.C
		case !d.IsZero() && s.sending:
			s.gone = true
			s.mu.Unlock()
			return true
		default:
			// No deadline, or one that passed with no Send in progress: a
			// Send can only start under a new one.
			s.idle = true
			moved = s.moved
		}
		s.mu.Unlock()
		select {
		case <-done:
			return false
		case <-timeout:
		case <-moved:
		case <-abortc:
			abortc = nil
			t.Stop()
		}
	}
}

// lastWriteFailed reports whether the stream's last write or flush failed:
// its client may not have been told why the stream ended.
// Events left in a pending batch were not written either.
func (s *sink) lastWriteFailed() bool { return s.lastErr != nil || s.batch.n > 0 }
