package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// Job is one job offered to this worker.
type Job struct {
	// ID and Generation identify this binding of the job; every message about
	// it carries both, and the node refuses any whose generation moved on.
	ID         string
	Generation uint64
	Queue      string
	// Input is the envelope's input, one JSON value.
	Input json.RawMessage
	// Options is the envelope's options object as JSON; it may be empty.
	Options json.RawMessage
	// Capabilities the job requires, as "key=value".
	Capabilities []string
	// Deadline is the local time the job expires: the moment this worker
	// received the offer plus the TTL the node reported then.
	Deadline time.Time
	// MaxOutputBytes is the most output the job may produce, in bytes of
	// compact JSON; 0 means no limit. The node enforces it, not the SDK:
	// once the job's output passes it, the node ends the job
	// output_too_large and cancels it here (Output's methods then return
	// ErrJobEnded). A handler may use it to stop early.
	MaxOutputBytes int64
	// Traceparent and Tracestate are the job's W3C trace context as the
	// node sent it (its parent: the node's offer), and TraceID its trace
	// id, for logs. The handler's context already carries the worker's
	// span of the job: spans started from it join the job's trace.
	Traceparent, Tracestate string
	TraceID                 string
	// AffinityKey is the envelope's affinity key ("" for none). The node
	// sends the jobs of one key to the same worker while it lives and has
	// room, so a handler may keep what the key's jobs share (a session's
	// state, a model server's prefix cache) under it; a job may still
	// come here without its predecessors, when its worker was full or
	// left.
	AffinityKey string
	// Priority is the envelope's, -5 to 5 (0 by default): the node already
	// ran higher priorities first.
	Priority int
}

// Handler runs one job. It streams output through out and returns the
// job's result: a non-nil result is marshalled as JSON and reported with the
// completion. An error fails the job: one made by Fail carries its code, any
// other fails with code "worker_error". ctx ends when the job is cancelled,
// expires, or the session or Run ends; a handler must return promptly then.
//
// A panic in a handler is recovered and fails that job with "worker_error",
// so one bad job does not take the other jobs of the process down with it.
type Handler func(ctx context.Context, job *Job, out *Output) (result any, err error)

// ErrJobEnded is returned (wrapped) by Output's methods once the job has
// ended, been cancelled or expired; nothing is sent then.
var ErrJobEnded = errors.New("worker: job ended")

// FailError is a job failure with a machine-readable code. Make one with
// Fail and return it from a Handler.
type FailError struct {
	Code    string
	Message string
}

// Error implements error.
func (e *FailError) Error() string {
	if e.Message == "" {
		return e.Code
	}
	return e.Code + ": " + e.Message
}

// codeWorkerError is the code of any handler error not made by Fail.
const codeWorkerError = "worker_error"

// Fail returns an error that fails a job with code and message when a
// Handler returns it (possibly wrapped). An empty code means "worker_error".
func Fail(code, message string) error {
	if code == "" {
		code = codeWorkerError
	}
	return &FailError{Code: code, Message: message}
}

// Output streams one job's output to the node. Its methods are safe for
// concurrent use; chunks are delivered in the order the calls returned.
//
// A job's output is paced by its reader: the node gives each job output
// credit (how many chunks, and bytes of them, it may have sent in all) and
// grants more as the job's reader takes what was sent. A send waits while
// the job has none left, so a handler that produces faster than its
// client reads slows down to the client's pace; nothing is buffered or
// dropped on the way, and other jobs of this worker are not held up.
type Output struct {
	s   *session
	job *Job
	// jobv is where job points: the job and its Output are one
	// allocation.
	jobv Job
	// jctx is the job's context: once it is done the job is over for the
	// node too (cancelled, expired, or the session is gone).
	jctx context.Context

	mu    sync.Mutex
	ended bool
	// arena makes the job's frames, Accept to the end (arena.go); after
	// end, none.
	arena arena
	// credit is the job's output credit (zero: not paced) and sent what
	// was sent against it; moved wakes the sends that wait for credit when
	// it grows or the job ends.
	credit, sent credit
	moved        wakeup
}

// credit is an amount of output: chunks and the bytes of their data.
type credit struct{ events, bytes uint64 }

// allowsLocked reports whether one more chunk may be sent: one chunk may
// end past the bytes, so a chunk larger than the window still goes, alone.
func (o *Output) allowsLocked() bool {
	c := o.credit
	return c == credit{} || o.sent.events < c.events && o.sent.bytes < c.bytes
}

// grant raises the job's credit to c (credits are cumulative: a smaller
// one is old news) and wakes the sends waiting for it.
func (o *Output) grant(c credit) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.ended || o.credit == (credit{}) || c.events <= o.credit.events && c.bytes <= o.credit.bytes {
		return
	}
	o.credit = credit{max(o.credit.events, c.events), max(o.credit.bytes, c.bytes)}
	o.moved.wake()
}

// Send marshals v as JSON and sends it as one output chunk. It returns once
// the chunk is queued for the stream (not when the node has it). It waits
// while the job has no output credit left — its reader is behind — and
// while the stream's queue is full, which is how a slow reader, or a slow
// node, slows a handler down. It gives up when ctx is done (an error
// wrapping ctx's cause), or the job ends (ErrJobEnded).
func (o *Output) Send(ctx context.Context, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("worker: marshal output: %w", err)
	}
	return o.send(ctx, data)
}

// SendRaw sends data, which must be one valid JSON value, as one output
// chunk. data is copied, so the caller may reuse it.
func (o *Output) SendRaw(ctx context.Context, data json.RawMessage) error {
	if !json.Valid(data) {
		return errors.New("worker: output is not valid JSON")
	}
	return o.send(ctx, data)
}

// send sends data, one valid JSON value, as one chunk. It is encoded (and
// so copied) before send returns or waits: the caller may reuse data.
func (o *Output) send(ctx context.Context, data []byte) error {
	var f *frame
	for {
		// The lock is held while queueing so that end, which takes it
		// too, cannot let the terminal message overtake a chunk being
		// queued; it is not held while waiting for credit, which may take
		// as long as the job's reader does.
		o.mu.Lock()
		if o.ended {
			o.mu.Unlock()
			return ErrJobEnded
		}
		if o.jctx.Err() != nil {
			o.mu.Unlock()
			return o.jobEnded()
		}
		if o.allowsLocked() {
			if f == nil {
				f = arenaFrame(&o.arena, fieldOutput, o.job.ID, o.job.Generation, data, "")
			}
			hold, ok := o.s.sq.put(f, o.jctx.Done(), ctx.Done())
			if !ok {
				o.mu.Unlock()
				return o.gaveUp(ctx)
			}
			o.sent.events++
			o.sent.bytes += uint64(len(data))
			o.mu.Unlock()
			if hold {
				return nil
			}
			// Flushed outside the job's lock, which the receive loop
			// takes to grant credit.
			if err := o.s.sq.flush(flushLimit); err != nil {
				return fmt.Errorf("%w: %w", ErrJobEnded, err)
			}
			return nil
		}
		moved := o.moved.next()
		o.mu.Unlock()
		select {
		case <-moved:
		case <-o.jctx.Done():
			return o.jobEnded()
		case <-ctx.Done():
			return o.gaveUp(ctx)
		}
	}
}

func (o *Output) jobEnded() error {
	return fmt.Errorf("%w: %w", ErrJobEnded, context.Cause(o.jctx))
}

// gaveUp is the error of a send whose ctx ended first; when that is the
// job's own context (a handler passes it on), the job ended.
func (o *Output) gaveUp(ctx context.Context) error {
	if o.jctx.Err() != nil {
		return o.jobEnded()
	}
	return fmt.Errorf("worker: send output: %w", context.Cause(ctx))
}

// end makes every later send fail with ErrJobEnded. It returns once no send
// is queueing, so nothing of this job can be queued after its end; a send
// waiting for credit is woken and returns ErrJobEnded.
func (o *Output) end() {
	o.mu.Lock()
	o.ended = true
	// No send waits on moved once ended is set, and grant wakes none
	// after: no new channel.
	o.moved.wake()
	o.arena.release()
	o.mu.Unlock()
}

// outputFrame makes one of the job's own messages (Accept, and the end:
// Complete or Fail) in its arena; nil once the job ended.
func outputFrame[T string | []byte](o *Output, field protowire.Number, f3 T, f4 string) *frame {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.ended {
		return nil
	}
	return arenaFrame(&o.arena, field, o.job.ID, o.job.Generation, f3, f4)
}
