package grpcapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchyard/switchyard/internal/chans"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/switchyard/switchyard/apierr"
	"github.com/switchyard/switchyard/auth"
	"github.com/switchyard/switchyard/core"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// WorkerConfig are the session clocks.
type WorkerConfig struct {
	// SetupTimeout bounds the wait for the first (Register) message.
	SetupTimeout time.Duration
	// HeartbeatInterval is how often each side speaks when it has nothing
	// to say. IdleTimeout ends a session that heard nothing for that long;
	// it must allow several missed heartbeats.
	HeartbeatInterval time.Duration
	IdleTimeout       time.Duration
	Logger            *slog.Logger
	// Errors are the node's API error metrics, shared with the other
	// transports; nil keeps a set registered nowhere.
	Errors *apierr.Metrics
	// Registerer registers the sessions' own metrics (batches); nil
	// registers them nowhere.
	Registerer prometheus.Registerer
}

// DefaultWorkerConfig returns the clocks a node uses unless told otherwise.
func DefaultWorkerConfig() WorkerConfig {
	return WorkerConfig{SetupTimeout: 5 * time.Second, HeartbeatInterval: 2 * time.Second, IdleTimeout: 6 * time.Second}
}

// Validate refuses clocks where one could never fire.
func (c WorkerConfig) Validate() error {
	switch {
	case c.SetupTimeout <= 0:
		return &core.ConfigError{Field: "worker-setup-timeout", Value: c.SetupTimeout, Err: errors.New("must be positive")}
	case c.HeartbeatInterval <= 0:
		return &core.ConfigError{Field: "heartbeat-interval", Value: c.HeartbeatInterval, Err: errors.New("must be positive")}
	case c.IdleTimeout < 2*c.HeartbeatInterval:
		return &core.ConfigError{Field: "worker-idle-timeout", Value: c.IdleTimeout, Err: errors.New("must be at least twice heartbeat-interval, or one late heartbeat ends a healthy session")}
	}
	return nil
}

// maxPendingUpdates is how many UpdateCapabilities a session may have
// queued behind the one being applied. A worker waits for each answer
// before sending the next, so more is a worker ignoring the protocol.
const maxPendingUpdates = 4

// WorkerServer serves the WorkerService: it turns a worker's bidirectional
// stream into calls on a core.Engine.
//
// Each session has four goroutines, all ended by the stream: the handler
// (setup, liveness), a reader (the stream's only Recv caller, which hands
// the first message to the handler and handles every later one itself, as
// it reads it: no hand-off per output), a writer (its only Send caller,
// fed by a queue bounded by count and by bytes) and an updater (capability
// updates, which write to the catalog and so must not hold up the reader's
// accepts and ends). The
// engine never blocks on a worker: it queues, and a full queue drops the
// session exactly as a stall would. Nor does the node ever stop reading a
// worker: its output is paced per job by output credit, so one job whose
// reader is behind never holds up another job's output.
type WorkerServer struct {
	pb.UnimplementedWorkerServiceServer
	e    *core.Engine
	cfg  WorkerConfig
	log  *slog.Logger
	errs *apierr.Reporter
	wg   sync.WaitGroup
	// batches and batched count the Batch messages the sessions read and
	// the messages those held.
	batches, batched prometheus.Counter
}

var _ pb.WorkerServiceServer = (*WorkerServer)(nil)

// NewWorkerServer returns a WorkerService over e, to be served on
// NewServer's server: its sessions read through that server's codec.
func NewWorkerServer(e *core.Engine, cfg WorkerConfig) (*WorkerServer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Errors == nil {
		cfg.Errors = apierr.NewMetrics(nil)
	}
	s := &WorkerServer{e: e, cfg: cfg, log: cfg.Logger, errs: cfg.Errors.Reporter("grpc", cfg.Logger),
		batches: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "switchyard", Subsystem: "worker", Name: "batches_total",
			Help: "Batch messages worker sessions sent this node (several worker messages in one)."}),
		batched: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "switchyard", Subsystem: "worker", Name: "batched_messages_total",
			Help: "Worker messages that came in a batch; divided by switchyard_worker_batches_total, the messages a batch carries."}),
	}
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(s.batches, s.batched)
	}
	return s, nil
}

// Wait blocks until every session goroutine has ended. Call it after the
// gRPC server stopped.
func (s *WorkerServer) Wait() { s.wg.Wait() }

// Connect serves one worker session.
func (s *WorkerServer) Connect(stream pb.WorkerService_ConnectServer) error {
	ctx := stream.Context()
	sess := &session{
		s:       s,
		stream:  stream,
		in:      make(chan *pb.WorkerMessage),
		worker:  make(chan *core.Worker, 1),
		recvErr: make(chan error, 1),
		updates: make(chan []string, maxPendingUpdates),
		credits: map[creditKey]core.OutputCredit{},
		creditc: make(chan struct{}, 1),
		closing: make(chan struct{}),
		done:    make(chan struct{}),
	}
	sess.touch()
	s.wg.Add(1)
	go func() { defer s.wg.Done(); sess.read(ctx) }()
	// The writer starts only once the session is registered; until then the
	// handler is the only sender. After that it is the only one.
	defer close(sess.done)

	reg, err := sess.awaitRegister(ctx)
	if err != nil {
		return s.end(err)
	}
	if err := auth.FromContext(ctx).Allow(auth.Work, reg.GetQueue()); err != nil {
		return s.fail(err)
	}
	// Bounded by count and bytes, as every WorkerConn's queue is.
	count, bytes := core.WorkerSendQueue(int(reg.Concurrency), s.e.Config().Limits.MaxInputBytes)
	sess.out = core.NewOutbox[*pb.NodeMessage](count, bytes, sess.done)
	w, err := s.e.AttachWorker(ctx, core.WorkerSpec{
		Queue: reg.Queue, Name: reg.Name, Capabilities: reg.Capabilities, Concurrency: int(reg.Concurrency),
	}, sess)
	if err != nil {
		return s.fail(err)
	}
	// Detach must run even though the stream's context is done by then:
	// withdrawing the consumer record is cleanup, not request work.
	defer w.Detach(context.WithoutCancel(ctx))
	if err := stream.Send(&pb.NodeMessage{Msg: &pb.NodeMessage_Registered{Registered: &pb.Registered{
		ConsumerId: w.ID, Node: s.e.Config().Node, HeartbeatMs: s.cfg.HeartbeatInterval.Milliseconds(),
		AcceptsBatches: true,
	}}}); err != nil {
		return err
	}
	s.wg.Add(1)
	go func() { defer s.wg.Done(); sess.write() }()
	s.wg.Add(1)
	go func() { defer s.wg.Done(); sess.applyUpdates(ctx, w) }()
	return s.end(sess.serve(ctx, w))
}

// fail is the status a session ends with for err, an engine's refusal or
// fault, logged and counted.
func (s *WorkerServer) fail(err error) error {
	s.errs.Report(err, "method", "Connect")
	return apierr.Status(err)
}

// end is what a session's handler returns for err: the node's own reason
// to end it (a *core.Error) as fail answers it; a failure of the stream
// itself (the worker went away) or the context's end as it is, since
// nobody is left to read a status, and neither is the node's fault.
func (s *WorkerServer) end(err error) error {
	if _, ok := core.CodeOf(err); ok {
		return s.fail(err)
	}
	return err
}

// session is one worker stream; it implements core.WorkerConn.
type session struct {
	s      *WorkerServer
	stream pb.WorkerService_ConnectServer
	// in hands the first message (the register) to the handler; worker
	// hands the registered worker to the reader, which then handles every
	// later message itself.
	in     chan *pb.WorkerMessage
	worker chan *core.Worker
	// recvErr is why the reader stopped: the stream's error, or a message
	// that ends the session (handle's error).
	recvErr chan error
	// ended is set once serve returned: the reader handles nothing more
	// (the worker is being detached).
	ended atomic.Bool
	// out is the writer's queue.
	out *core.Outbox[*pb.NodeMessage]
	// updates feeds the updater: capability lists in the order received.
	updates chan []string
	// credits are the output credits waiting for the writer, the newest
	// per binding: a credit is cumulative, so one not sent yet is
	// replaced rather than queued behind (a fast job makes one per half
	// window, and none can fill out). creditc says there are some.
	creditMu sync.Mutex
	credits  map[creditKey]core.OutputCredit
	creditc  chan struct{}
	closing  chan struct{}
	done     chan struct{}

	lastRecv  atomic.Int64
	closeOnce sync.Once
	cause     error
}

var _ core.WorkerConn = (*session)(nil)

type creditKey struct {
	job string
	gen uint64
}

func (ss *session) touch() { ss.lastRecv.Store(time.Now().UnixNano()) }

// read is the stream's only Recv caller. It ends when the stream does, or
// when a message ends the session. It hands the first message to the
// handler (awaitRegister) and, once the session is registered, handles
// each later one in the order read, on this goroutine: the worker's
// outputs go to the engine without a goroutine hop each.
func (ss *session) read(ctx context.Context) {
	// The first message too is read into a sessionIn, the only decoder of
	// a batch (codec.Unmarshal); the handler refuses anything but a lone
	// Register.
	var first sessionIn
	if err := ss.stream.RecvMsg(&first); err != nil {
		ss.recvErr <- err
		return
	}
	ss.touch()
	m := &first.msg
	if first.batched || first.items[0].kind != itemMessage {
		m = &pb.WorkerMessage{}
	}
	select {
	case ss.in <- m:
	case <-ss.done:
		return
	case <-ctx.Done():
		return
	}
	var w *core.Worker
	select {
	case w = <-ss.worker:
	case <-ss.done:
		return
	case <-ctx.Done():
		return
	}
	ss.readIn(w)
}

// readIn is read's loop after the register: each message is decoded into
// one reused sessionIn, an output without a message around it, and its
// worker messages (one, or a batch's) are handled in order, as if each
// had come alone: a batch's outputs count against their jobs' credit one
// by one, and an item that ends the session ends it where it stands, the
// items before it handled and those after it not. Only the server's codec
// (newCodec, which NewServer sets) decodes a sessionIn: under any other
// codec the first read fails and the session ends.
func (ss *session) readIn(w *core.Worker) {
	var in sessionIn
	for {
		if err := ss.stream.RecvMsg(&in); err != nil {
			ss.recvErr <- err
			return
		}
		ss.touch()
		if ss.ended.Load() {
			return
		}
		if in.batched {
			ss.s.batches.Inc()
			ss.s.batched.Add(float64(len(in.items)))
		}
		for i := range in.items {
			if err := ss.handleItem(w, &in.items[i]); err != nil {
				ss.recvErr <- err
				return
			}
		}
	}
}

// handleItem acts on one worker message read.
func (ss *session) handleItem(w *core.Worker, it *item) error {
	switch it.kind {
	case itemOutput:
		// Never waits: the worker sends within the job's output credit.
		if w.Output(it.jobID, it.gen, it.data) {
			yieldToSender()
		}
	case itemAccept:
		w.Accept(it.jobID, it.gen)
	case itemComplete:
		w.End(it.jobID, it.gen, "", "", it.data)
	case itemRefused:
		return &core.Error{Code: core.CodeUnexpectedMessage, Detail: it.detail}
	default:
		return ss.handle(w, it.msg)
	}
	return nil
}

func (ss *session) awaitRegister(ctx context.Context) (*pb.Register, error) {
	t := time.NewTimer(ss.s.cfg.SetupTimeout)
	defer t.Stop()
	select {
	case m := <-ss.in:
		reg := m.GetRegister()
		if reg == nil {
			return nil, &core.Error{Code: core.CodeUnexpectedMessage, Detail: "the first message of a worker session must be register"}
		}
		return reg, nil
	case err := <-ss.recvErr:
		return nil, err
	case <-t.C:
		return nil, &core.Error{Code: core.CodeSetupTimeout, Detail: fmt.Sprintf("no register within %s", ss.s.cfg.SetupTimeout)}
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// serve hands w to the reader, which handles the inbound messages, and
// watches liveness until the session ends. It returns nil when the worker
// closed its side, a *core.Error when the node ends the session or a
// message does, and otherwise the stream's or the context's error.
func (ss *session) serve(ctx context.Context, w *core.Worker) error {
	defer ss.ended.Store(true)
	ss.worker <- w
	tick := time.NewTicker(ss.s.cfg.HeartbeatInterval / 2)
	defer tick.Stop()
	for {
		select {
		case err := <-ss.recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-ss.closing:
			return &core.Error{Code: core.CodeSessionClosed, Detail: fmt.Sprintf("the node ended the session: %v", ss.cause)}
		case <-tick.C:
			if idle := time.Since(time.Unix(0, ss.lastRecv.Load())); idle > ss.s.cfg.IdleTimeout {
				ss.s.log.Warn("worker silent; ending session", "consumer", w.ID, "idle", idle)
				return &core.Error{Code: core.CodeIdleTimeout, Detail: fmt.Sprintf("no message from the worker for %s", ss.s.cfg.IdleTimeout)}
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (ss *session) handle(w *core.Worker, m *pb.WorkerMessage) error {
	switch msg := m.Msg.(type) {
	case *pb.WorkerMessage_Accept:
		w.Accept(msg.Accept.JobId, msg.Accept.Generation)
	case *pb.WorkerMessage_Reject:
		w.Reject(msg.Reject.JobId, msg.Reject.Generation, msg.Reject.Reason)
	case *pb.WorkerMessage_Output:
		// Never waits: the worker sends within the job's output credit.
		if w.Output(msg.Output.JobId, msg.Output.Generation, msg.Output.Data) {
			yieldToSender()
		}
	case *pb.WorkerMessage_Complete:
		w.End(msg.Complete.JobId, msg.Complete.Generation, "", "", nilIfEmpty(msg.Complete.Result))
	case *pb.WorkerMessage_Fail:
		code := core.Code(msg.Fail.Code)
		if code == "" {
			code = core.CodeWorkerError
		}
		w.End(msg.Fail.JobId, msg.Fail.Generation, code, msg.Fail.Message, nil)
	case *pb.WorkerMessage_Heartbeat:
	case *pb.WorkerMessage_UpdateCapabilities:
		select {
		case ss.updates <- msg.UpdateCapabilities.GetCapabilities():
		default:
			return &core.Error{Code: core.CodeTooManyUpdates,
				Detail: "too many capability updates unanswered; wait for capabilities_updated before sending another"}
		}
	case *pb.WorkerMessage_Register:
		return &core.Error{Code: core.CodeUnexpectedMessage, Detail: "register is only valid as the first message; reconnect to change the declaration"}
	case *pb.WorkerMessage_Batch:
		// sessionIn decodes every batch into its items: one here was
		// inside another.
		return &core.Error{Code: core.CodeUnexpectedMessage, Detail: detailNestedBatch}
	default:
		return &core.Error{Code: core.CodeUnexpectedMessage, Detail: "unknown worker message"}
	}
	return nil
}

// applyUpdates applies capability updates one at a time, in the order the
// worker sent them, and answers each: the answers go out in that order too.
// An update the engine refuses is answered with its code and the session
// goes on with the previous set; bound jobs are never touched.
func (ss *session) applyUpdates(ctx context.Context, w *core.Worker) {
	for {
		select {
		case caps := <-ss.updates:
			err := w.UpdateCapabilities(ctx, caps)
			if err != nil {
				ss.s.errs.Report(err, "method", "UpdateCapabilities", "consumer", w.ID, "capabilities", caps)
			}
			ans := capabilitiesAnswer(caps, err)
			// An answer waits for room rather than failing: the worker
			// sends no other update before it, so these are few.
			m := &pb.NodeMessage{Msg: &pb.NodeMessage_CapabilitiesUpdated{CapabilitiesUpdated: ans}}
			if !ss.out.Put(m, int64(proto.Size(m))) {
				return
			}
		case <-ss.done:
			return
		}
	}
}

// write is the stream's only Send caller once the session is registered.
// Heartbeats go out only when nothing else did for an interval.
func (ss *session) write() {
	hb := time.NewTicker(ss.s.cfg.HeartbeatInterval)
	defer hb.Stop()
	heartbeat := &pb.NodeMessage{Msg: &pb.NodeMessage_Heartbeat{Heartbeat: &pb.Heartbeat{}}}
	sent := false
	for {
		select {
		case q := <-ss.out.C():
			if err := ss.stream.Send(ss.out.Take(q)); err != nil {
				return
			}
			sent = true
		case <-ss.creditc:
			for _, m := range ss.takeCredits() {
				if err := ss.stream.Send(m); err != nil {
					return
				}
			}
			sent = true
		case <-hb.C:
			if !sent {
				if err := ss.stream.Send(heartbeat); err != nil {
					return
				}
			}
			sent = false
		case <-ss.done:
			return
		}
	}
}

// enqueue queues m for the writer without blocking (the engine calls it
// with its lock held), or fails when the queue is at either bound.
func (ss *session) enqueue(m *pb.NodeMessage) error {
	// SizeVT: the size proto.Size gives, from generated code rather than
	// reflection (one offer per job goes through here).
	return ss.out.Offer(m, int64(m.SizeVT()))
}

// SendOffer implements core.WorkerConn.
func (ss *session) SendOffer(o core.Offer) error {
	traceparent, tracestate := core.FormatTrace(o.Trace)
	return ss.enqueue(&pb.NodeMessage{Msg: &pb.NodeMessage_Job{Job: &pb.Job{
		JobId: o.JobID, Generation: o.Gen, Queue: o.Queue, Input: o.Input, Options: o.Options,
		Capabilities: o.Capabilities, TtlMs: max(o.TTL.Milliseconds(), 1), MaxOutputBytes: o.MaxOutputBytes,
		OutputCredit: outputCredit(o.JobID, o.Gen, o.Credit),
		Traceparent:  traceparent, Tracestate: tracestate,
		AffinityKey: o.AffinityKey, Priority: int32(o.Priority),
	}}})
}

// SendCredit implements core.WorkerConn: the credit replaces any of the
// same binding the writer has not sent yet.
func (ss *session) SendCredit(id string, gen uint64, c core.OutputCredit) error {
	ss.creditMu.Lock()
	ss.credits[creditKey{id, gen}] = c
	ss.creditMu.Unlock()
	chans.Notify(ss.creditc)
	return nil
}

// takeCredits returns the credits waiting for the writer as messages.
func (ss *session) takeCredits() []*pb.NodeMessage {
	ss.creditMu.Lock()
	defer ss.creditMu.Unlock()
	ms := make([]*pb.NodeMessage, 0, len(ss.credits))
	for k, c := range ss.credits {
		ms = append(ms, &pb.NodeMessage{Msg: &pb.NodeMessage_OutputCredit{OutputCredit: outputCredit(k.job, k.gen, c)}})
	}
	clear(ss.credits)
	return ms
}

// outputCredit is c's wire form for binding (job, gen); nil for the zero
// credit (a job that is not paced).
func outputCredit(job string, gen uint64, c core.OutputCredit) *pb.OutputCredit {
	if c.IsZero() {
		return nil
	}
	return &pb.OutputCredit{JobId: job, Generation: gen, Events: uint64(c.Events), Bytes: uint64(c.Bytes)}
}

// SendCancel implements core.WorkerConn.
func (ss *session) SendCancel(id string, gen uint64, reason core.Code) error {
	return ss.enqueue(&pb.NodeMessage{Msg: &pb.NodeMessage_Cancel{Cancel: &pb.Cancel{JobId: id, Generation: gen, Reason: string(reason)}}})
}

// Close implements core.WorkerConn.
func (ss *session) Close(cause error) {
	ss.closeOnce.Do(func() {
		ss.cause = cause
		close(ss.closing)
	})
}

// capabilitiesAnswer is the CapabilitiesUpdated for an update of caps that
// ended with err: the set now in effect, or the refusal's code and detail,
// exactly as a status would carry them (a server fault shows only as
// internal).
func capabilitiesAnswer(caps []string, err error) *pb.CapabilitiesUpdated {
	if err == nil {
		// UpdateCapabilities parsed the same list successfully.
		parsed, _ := core.ParseCapabilities(caps)
		return &pb.CapabilitiesUpdated{Capabilities: parsed.Strings()}
	}
	ce := apierr.ErrorOf(err)
	return &pb.CapabilitiesUpdated{Code: string(ce.Code), Message: ce.Detail}
}

func nilIfEmpty(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return b
}

// yieldToSender lets the goroutines woken for a lone job's first output
// (core.Worker.Output) run before the session reader handles the job's
// next messages, which a worker that answers at once sent right behind it.
// It yields twice: once for the peer's response-leg sender, which queues
// the output on its reply stream and parks; once more for gRPC's
// connection writer, which the sender woke and which itself yields the
// processor once, while it holds under 1,000 bytes, before it writes
// (grpc-go's loopyWriter, as of v1.85: its minBatchSize) — with one yield
// the reader would run again in that gap and the output would still wait
// for the rest of the job. This leans on how the runtime and grpc-go
// schedule, not on any contract of theirs: if either changes, the yields
// cost two trips through the run queue for one job in flight and nothing
// else. Other jobs' outputs are never held up: Output reports a first
// output only when its job is the only one the node hosts and its ingress
// sent it latency first (core.Delivery.LatencyFirst: no other job in
// flight there).
func yieldToSender() {
	runtime.Gosched()
	runtime.Gosched()
}
