package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	"github.com/switchyard/switchyard/internal/flowwin"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
	"github.com/switchyard/switchyard/tracing/w3c"
)

// Session end causes.
var (
	errHandshakeTimeout = errors.New("no Registered from the node in time")
	errNodeSilent       = errors.New("node silent")
	errExpired          = errors.New("job deadline passed")
	// errSessionGone: the session ended before the node answered an
	// UpdateCapabilities.
	errSessionGone = errors.New("session ended")
)

// cancelledError is the cause of a job context cancelled by a Cancel from
// the node; it is what tells a cancelled job from an abandoned one.
type cancelledError struct{ reason string }

func (e *cancelledError) Error() string { return "cancelled by the node: " + e.reason }

// Job outcomes as logged on "job ended".
const (
	outcomeCompleted = "completed"
	outcomeFailed    = "failed"
	outcomeCancelled = "cancelled"
	outcomeExpired   = "expired"
	// outcomeAbandoned: the session ended under the job; nothing can be
	// sent, and the node reclaims or fails it by its own rules.
	outcomeAbandoned = "abandoned"
)

type jobKey struct {
	id  string
	gen uint64
}

// session is one Connect stream: register, serve, end. Its goroutines are
// the caller's (the receive loop), one writer and one per running job; all
// have ended when run returns. Every frame goes out through sq.
type session struct {
	r      *runner
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelCauseFunc
	stream grpc.BidiStreamingClient[pb.WorkerMessage, pb.NodeMessage]
	sq     *sendQueue
	hb     time.Duration

	wg sync.WaitGroup // the writer and the job goroutines
	// idle hands an accepted job to a job goroutine waiting for one.
	idle chan jobRun
	mu   sync.Mutex
	jobs map[jobKey]runningJob

	// capSlot holds a token while an UpdateCapabilities is unanswered: one
	// at a time, so the node's in-order answers match without ids and it
	// never sees a pile of them. capPending (under mu) is that update.
	capSlot    chan struct{}
	capPending *capUpdate
}

// runningJob is a job this session accepted, until its end is queued.
type runningJob struct {
	cancel context.CancelCauseFunc
	out    *Output
}

// capUpdate is an UpdateCapabilities waiting for the node's answer.
type capUpdate struct {
	caps []string
	done chan error // buffered: the receive loop never waits on it
}

// session runs one session and returns why it ended. Errors retrying cannot
// fix are wrapped in backoff.Permanent.
func (r *runner) session(ctx context.Context) error {
	// A fresh connection per session: after a silent node the old one may
	// be a black hole that gRPC still believes healthy.
	conn, err := grpc.NewClient(r.cfg.Server, append(flowwin.DialOptions(0), r.cfg.DialOptions...)...)
	if err != nil {
		return backoff.Permanent(fmt.Errorf("dial %s: %w", r.cfg.Server, err))
	}
	defer conn.Close()

	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	s := &session{
		r:       r,
		log:     r.log,
		ctx:     sctx,
		cancel:  cancel,
		jobs:    make(map[jobKey]runningJob),
		idle:    make(chan jobRun),
		capSlot: make(chan struct{}, 1),
	}
	reg, err := s.handshake(pb.NewWorkerServiceClient(conn))
	if err != nil {
		return err
	}
	// Batches only to a node that said it takes them: an older one ends
	// the session on a message it does not know.
	var sendBatch func(*batch) error
	if reg.GetAcceptsBatches() {
		sendBatch = func(b *batch) error { return s.stream.SendMsg(b) }
	}
	s.sq = newSendQueue(r.cfg.Concurrency*4+16, func(f *frame) error { return s.stream.SendMsg(f) }, sendBatch, func(err error) {
		// On io.EOF the stream is over and Recv is about to return the
		// node's status: let that be the session's cause.
		if !errors.Is(err, io.EOF) {
			s.cancel(fmt.Errorf("send: %w", err))
		}
	})
	registeredAt := time.Now()
	defer func() {
		// Only a session that stayed up a while proves the node healthy; one
		// dropped right after registering must keep backing off, or a node
		// that accepts and then fails would be hammered.
		if time.Since(registeredAt) >= r.cfg.MaxBackoff {
			r.healthy.Store(true)
		}
	}()
	s.hb = r.cfg.HeartbeatInterval
	if s.hb == 0 {
		s.hb = time.Duration(reg.GetHeartbeatMs()) * time.Millisecond
	}
	if s.hb <= 0 {
		s.hb = DefaultHeartbeatInterval
	}
	s.log = r.log.With("consumer", reg.GetConsumerId(), "node", reg.GetNode())
	s.log.Info("worker registered", "server", r.cfg.Server, "heartbeat", s.hb, "concurrency", r.cfg.Concurrency)

	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.write()
	}()
	r.setLive(s, false)
	err = s.receive()
	r.setLive(nil, false)
	// Ending the session context cancels every job's context (they derive
	// from it) and stops the writer; wait for all of them before the caller
	// reconnects, so no handler of this session overlaps the next one.
	cancel(err)
	s.wg.Wait()
	return context.Cause(sctx)
}

// handshake opens the stream, sends Register and waits for Registered.
func (s *session) handshake(c pb.WorkerServiceClient) (*pb.Registered, error) {
	t := time.AfterFunc(handshakeTimeout, func() { s.cancel(errHandshakeTimeout) })
	defer t.Stop()
	stream, err := c.Connect(s.ctx, withFrames())
	if err != nil {
		return nil, s.handshakeErr("connect", err)
	}
	s.stream = stream
	cfg := s.r.cfg
	err = stream.Send(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Register{Register: &pb.Register{
		Queue: cfg.Queue, Capabilities: s.r.declared(), Concurrency: uint32(cfg.Concurrency), Name: cfg.Name,
	}}})
	// io.EOF from Send means the node ended the stream; Recv below returns
	// its status, which is the error worth reporting.
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, s.handshakeErr("send register", err)
	}
	m, err := stream.Recv()
	if err != nil {
		return nil, s.handshakeErr("register", err)
	}
	reg := m.GetRegistered()
	if reg == nil {
		return nil, fmt.Errorf("register: node answered %T, not Registered", m.GetMsg())
	}
	return reg, nil
}

func (s *session) handshakeErr(step string, err error) error {
	if cause := context.Cause(s.ctx); cause != nil {
		// Our own cancellation (timeout or shutdown) says more than the
		// Canceled status it produced.
		return fmt.Errorf("%s: %w", step, cause)
	}
	err = fmt.Errorf("%s: %w", step, err)
	switch status.Code(err) {
	case codes.InvalidArgument, codes.Unimplemented, codes.PermissionDenied, codes.Unauthenticated:
		// The node read the registration and refused it, or this is not a
		// node we may talk to: another attempt gets the same answer.
		return backoff.Permanent(err)
	}
	return err
}

// write is the writer goroutine: it sends what a flusher left (the queue
// kicks it) and, after an interval in which nothing was sent, a heartbeat.
func (s *session) write() {
	t := time.NewTimer(s.hb)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.sq.kick:
		case <-t.C:
			if !s.sq.sent.Swap(false) {
				if _, ok := s.sq.put(heartbeatFrame, s.ctx.Done(), nil); !ok {
					return
				}
			}
			t.Reset(s.hb)
		}
		if s.sq.flush(0) != nil {
			return
		}
	}
}

// enqueue queues f, waiting while the queue is full, and flushes (or
// leaves f to a job about to start: sendQueue.put).
func (s *session) enqueue(f *frame) error {
	hold, ok := s.sq.put(f, s.ctx.Done(), nil)
	if !ok {
		return fmt.Errorf("session ended: %w", context.Cause(s.ctx))
	}
	if hold {
		return nil
	}
	if err := s.sq.flush(flushLimit); err != nil {
		return fmt.Errorf("session ended: %w", err)
	}
	return nil
}

// receive is the stream's only receiver; it returns when the stream ends.
func (s *session) receive() error {
	silence := silenceFactor * s.hb
	watchdog := time.AfterFunc(silence, func() {
		s.cancel(fmt.Errorf("%w: nothing received for %s", errNodeSilent, silence))
	})
	defer watchdog.Stop()
	for {
		m, err := s.stream.Recv()
		if err != nil {
			return fmt.Errorf("receive: %w", err)
		}
		// The deadline counts from here, on this machine's clock.
		now := time.Now()
		watchdog.Reset(silence)
		switch msg := m.GetMsg().(type) {
		case *pb.NodeMessage_Job:
			s.offer(msg.Job, now)
		case *pb.NodeMessage_Cancel:
			s.cancelJob(msg.Cancel)
		case *pb.NodeMessage_OutputCredit:
			s.credit(msg.OutputCredit)
		case *pb.NodeMessage_Heartbeat:
		case *pb.NodeMessage_CapabilitiesUpdated:
			s.capabilitiesUpdated(msg.CapabilitiesUpdated)
		case *pb.NodeMessage_Registered:
			s.log.Warn("unexpected Registered in an established session; ignored")
		default:
			// A newer node may send messages this worker does not know;
			// unknown is never fatal.
			s.log.Debug("unknown node message ignored", "type", fmt.Sprintf("%T", msg))
		}
	}
}

// setCapabilities sends an UpdateCapabilities and waits for the node's
// answer. It returns errSessionGone when the session ended first.
func (s *session) setCapabilities(ctx context.Context, caps []string) error {
	select {
	case s.capSlot <- struct{}{}:
	case <-s.ctx.Done():
		return errSessionGone
	case <-ctx.Done():
		return fmt.Errorf("worker: set capabilities: %w", context.Cause(ctx))
	}
	done := make(chan error, 1)
	s.mu.Lock()
	s.capPending = &capUpdate{caps: caps, done: done}
	s.mu.Unlock()
	f, err := messageFrame(&pb.WorkerMessage{Msg: &pb.WorkerMessage_UpdateCapabilities{
		UpdateCapabilities: &pb.UpdateCapabilities{Capabilities: caps},
	}})
	if err != nil {
		return fmt.Errorf("worker: set capabilities: %w", err)
	}
	if err := s.enqueue(f); err != nil {
		return errSessionGone
	}
	select {
	case err := <-done:
		return err
	case <-s.ctx.Done():
		select {
		case err := <-done:
			return err
		default:
			return errSessionGone
		}
	case <-ctx.Done():
		// The answer, when it comes, still updates what the worker declares.
		return fmt.Errorf("worker: set capabilities: %w", context.Cause(ctx))
	}
}

// capabilitiesUpdated takes the node's answer to the unanswered update. On
// success the set becomes what every later registration declares; that
// happens here, on the receive loop, so it precedes the next session.
func (s *session) capabilitiesUpdated(a *pb.CapabilitiesUpdated) {
	s.mu.Lock()
	p := s.capPending
	s.capPending = nil
	s.mu.Unlock()
	if p == nil {
		s.log.Warn("CapabilitiesUpdated without an update; ignored")
		return
	}
	var err error
	if a.GetCode() == "" {
		s.r.setDeclared(p.caps)
		s.log.Info("capabilities updated", "capabilities", a.GetCapabilities())
	} else {
		err = &CapabilitiesError{Code: a.GetCode(), Message: a.GetMessage()}
		s.log.Warn("capability update refused", "capabilities", p.caps, "code", a.GetCode(), "message", a.GetMessage())
	}
	p.done <- err
	<-s.capSlot
}

// offer decides on a job and, if taken, starts it.
func (s *session) offer(pj *pb.Job, received time.Time) {
	// The job lives in its Output: one allocation for both (a rejected
	// job's Output is never used).
	out := &Output{s: s, arena: arena{pool: mem.DefaultBufferPool()}}
	job := &out.jobv
	out.job = job
	*job = Job{
		ID:             pj.GetJobId(),
		Generation:     pj.GetGeneration(),
		Queue:          pj.GetQueue(),
		Input:          json.RawMessage(pj.GetInput()),
		Options:        json.RawMessage(pj.GetOptions()),
		Capabilities:   pj.GetCapabilities(),
		Deadline:       received.Add(time.Duration(pj.GetTtlMs()) * time.Millisecond),
		MaxOutputBytes: pj.GetMaxOutputBytes(),
		AffinityKey:    pj.GetAffinityKey(),
		Priority:       int(pj.GetPriority()),
		Traceparent:    pj.GetTraceparent(),
		Tracestate:     pj.GetTracestate(),
	}
	// The offer's trace context; with none, or one that does not parse,
	// the worker's span starts a trace of its own.
	sc := w3c.Parse(job.Traceparent, job.Tracestate)
	if sc.IsValid() {
		job.TraceID = sc.TraceID().String()
	}
	key := jobKey{job.ID, job.Generation}
	log := jobLog{s.log, job}

	s.mu.Lock()
	_, dup := s.jobs[key]
	running := len(s.jobs)
	s.mu.Unlock()
	if dup {
		// Already accepted and running: answering again would contradict
		// the first answer.
		log.Warn("duplicate job offer ignored")
		return
	}
	reason := ""
	if running >= s.r.cfg.Concurrency {
		// The node tracks our credits and should never do this; refusing
		// keeps Concurrency a promise to the handler whatever it does.
		reason = "over concurrency"
	} else if s.r.cfg.Decide != nil {
		if err := s.r.cfg.Decide(job); err != nil {
			reason = err.Error()
		}
	}
	if reason != "" {
		log.Info("job rejected", "reason", reason)
		_ = s.enqueue(jobFrame(fieldReject, job.ID, job.Generation, reason, ""))
		return
	}

	jctx, cancel := context.WithCancelCause(trace.ContextWithRemoteSpanContext(s.ctx, sc))
	jctx, cancelDeadline := context.WithDeadlineCause(jctx, job.Deadline, errExpired)
	out.jctx = jctx
	if c := pj.GetOutputCredit(); c != nil {
		out.credit = credit{c.GetEvents(), c.GetBytes()}
	}
	s.mu.Lock()
	s.jobs[key] = runningJob{cancel: cancel, out: out}
	s.mu.Unlock()
	// Accept is queued before the handler starts, so it precedes every
	// output of the job on the stream.
	if err := s.enqueue(outputFrame(out, fieldAccept, "", "")); err != nil {
		out.end()
		s.forget(key)
		cancelDeadline()
		cancel(err)
		return
	}
	if log.enabled(slog.LevelInfo) {
		log.Info("job accepted", "ttl", job.Deadline.Sub(received))
	}
	s.start(jobRun{jctx, cancel, cancelDeadline, job, out, log})
}

// jobRun is an accepted job, for a job goroutine to run.
type jobRun struct {
	ctx            context.Context
	cancel         context.CancelCauseFunc
	cancelDeadline context.CancelFunc
	job            *Job
	out            *Output
	log            jobLog
}

// start runs j on an idle job goroutine, or on a new one. A job goroutine
// outlives its job and waits for the next one until the session ends: the
// stack the first job grew serves the next ones, where a new goroutine's
// would grow, by copying, on every job. There are never more of them
// than jobs ran at once.
func (s *session) start(j jobRun) {
	s.sq.readied()
	select {
	case s.idle <- j:
		return
	default:
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			s.sq.started()
			s.runJob(j)
			select {
			case j = <-s.idle:
			case <-s.ctx.Done():
				return
			}
		}
	}()
}

func (s *session) runJob(j jobRun) {
	defer j.cancel(nil)
	defer j.cancelDeadline()
	s.run(j.ctx, j.job, j.out, j.log)
}

// credit raises a running job's output credit. A credit for a job not
// running here (it ended, or an older generation) is old news.
func (s *session) credit(c *pb.OutputCredit) {
	s.mu.Lock()
	r, ok := s.jobs[jobKey{c.GetJobId(), c.GetGeneration()}]
	s.mu.Unlock()
	if ok {
		r.out.grant(credit{c.GetEvents(), c.GetBytes()})
	}
}

// cancelJob cancels a running job's context on the node's word.
func (s *session) cancelJob(c *pb.Cancel) {
	key := jobKey{c.GetJobId(), c.GetGeneration()}
	s.mu.Lock()
	r, ok := s.jobs[key]
	s.mu.Unlock()
	log := s.log.With("job", key.id, "generation", key.gen)
	if !ok {
		// It ended already and its end is on the way, or it is a stale
		// generation: either way there is nothing to stop.
		log.Debug("cancel for a job not running ignored", "reason", c.GetReason())
		return
	}
	log.Info("job cancelled", "reason", c.GetReason())
	r.cancel(&cancelledError{reason: c.GetReason()})
}

func (s *session) forget(key jobKey) {
	s.mu.Lock()
	delete(s.jobs, key)
	s.mu.Unlock()
}

// run runs the handler and sends the job's one terminal message.
func (s *session) run(jctx context.Context, job *Job, out *Output, log jobLog) {
	started := time.Now()
	// The worker's span of the job, the node's offer's child; the handler
	// runs in it. Its context is jctx's: it ends with the job.
	jctx, span := startRunSpan(jctx, s.r.tracer, job, s.r.cfg.Name)
	result, herr := s.callHandler(jctx, job, out, log)

	// Decide the outcome from why the context ended before looking at what
	// the handler returned: a cancelled job is acknowledged as cancelled
	// whatever the handler said, because that acknowledgement is what
	// releases this worker's credit on the node.
	var end *frame
	outcome, code := outcomeCompleted, ""
	cause := context.Cause(jctx)
	var ce *cancelledError
	switch {
	case errors.As(cause, &ce):
		outcome, code = outcomeCancelled, "cancelled"
		end = outputFrame(out, fieldFail, code, ce.reason)
	case s.ctx.Err() != nil:
		outcome = outcomeAbandoned
	case errors.Is(cause, errExpired):
		outcome, code = outcomeExpired, "expired"
		end = outputFrame(out, fieldFail, code, "the job's deadline passed on the worker")
	case herr != nil:
		outcome, code = outcomeFailed, codeWorkerError
		msg := herr.Error()
		var fe *FailError
		if errors.As(herr, &fe) {
			code, msg = fe.Code, fe.Message
		}
		end = outputFrame(out, fieldFail, code, msg)
	default:
		var data []byte
		if result != nil {
			var err error
			if data, err = json.Marshal(result); err != nil {
				outcome, code = outcomeFailed, codeWorkerError
				end = outputFrame(out, fieldFail, code, fmt.Sprintf("marshal result: %v", err))
				break
			}
		}
		end = outputFrame(out, fieldComplete, data, "")
	}

	out.end()
	// Free the slot before the end is queued: the node may offer the next
	// job as soon as it reads the end, and must not find us still full.
	s.forget(jobKey{job.ID, job.Generation})
	if end != nil {
		if err := s.enqueue(end); err != nil {
			outcome = outcomeAbandoned
		}
	}
	endRunSpan(span, outcome, code, out)
	if !log.enabled(slog.LevelInfo) {
		return
	}
	attrs := []any{"outcome", outcome, "elapsed", time.Since(started).Round(time.Millisecond)}
	if code != "" {
		attrs = append(attrs, "code", code)
	}
	if herr != nil {
		attrs = append(attrs, "err", herr)
	}
	log.Info("job ended", attrs...)
}

func (s *session) callHandler(ctx context.Context, job *Job, out *Output, log jobLog) (result any, err error) {
	defer func() {
		if p := recover(); p != nil {
			log.Error("handler panicked", "panic", p, "stack", string(debug.Stack()))
			result, err = nil, fmt.Errorf("handler panicked: %v", p)
		}
	}()
	return s.r.h(ctx, job, out)
}

// jobLog logs about one job: the session's logger with the job's id,
// generation and trace id, added only when a line is written (a logger
// With them costs a job its attributes' formatting even when the level
// writes nothing).
type jobLog struct {
	l   *slog.Logger
	job *Job
}

func (j jobLog) enabled(level slog.Level) bool { return j.l.Enabled(context.Background(), level) }

func (j jobLog) log(level slog.Level, msg string, args []any) {
	if !j.enabled(level) {
		return
	}
	j.l.With("job", j.job.ID, "generation", j.job.Generation, "trace_id", j.job.TraceID).Log(context.Background(), level, msg, args...)
}

func (j jobLog) Info(msg string, args ...any)  { j.log(slog.LevelInfo, msg, args) }
func (j jobLog) Warn(msg string, args ...any)  { j.log(slog.LevelWarn, msg, args) }
func (j jobLog) Error(msg string, args ...any) { j.log(slog.LevelError, msg, args) }
