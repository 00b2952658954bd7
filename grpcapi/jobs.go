package grpcapi

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/switchyard/switchyard/apierr"
	"github.com/switchyard/switchyard/auth"
	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/resume"
	"github.com/switchyard/switchyard/core/stream"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// HeaderJobID is the response header metadata that names a stream's job
// before its first event.
const HeaderJobID = "x-job-id"

// JobConfig configures the job service. A node passes the HTTP API's stream
// policy, keyring and token TTL, so both transports apply one policy and
// honour each other's resume tokens.
type JobConfig struct {
	// Stream is every job stream's bounds and clocks.
	Stream stream.Policy
	// Keyring signs and verifies resume tokens. Required: it must be the
	// keyring the HTTP API uses.
	Keyring *resume.Keyring
	// TokenTTL is how long a resume token stays valid.
	TokenTTL time.Duration
	// StreamMetrics are the node's client-stream metrics, shared with SSE;
	// nil registers a set of its own.
	StreamMetrics *stream.Metrics
	// Errors are the node's API error metrics, shared with the other
	// transports; nil registers a set of its own.
	Errors *apierr.Metrics
	// Cluster finds the node a relayed Submit goes to (relay.go), and
	// RelayTLS is how to reach its gRPC port (nil: plaintext). A nil
	// Cluster relays nowhere.
	Cluster  core.ClusterView
	RelayTLS *tls.Config
	// Transport labels the errors the service reports: "grpc" (the
	// default), or "http" for the instance behind the HTTP API's gateway,
	// whose refusals an HTTP client receives.
	Transport string
	// MaxBatchBytes bounds a JobEventBatch of SubmitBatched and
	// ResumeBatched (one larger event still goes alone): 0 is
	// DefaultMaxBatchBytes. Keep it well under the clients' receive limit
	// (gRPC's default is 4 MiB) and the server's send limit.
	MaxBatchBytes int
	Logger        *slog.Logger
}

// DefaultMaxBatchBytes is JobConfig.MaxBatchBytes's default: a sixteenth
// of gRPC's default message limit, so any client takes a batch, and far
// past the size (a few KiB) where a message's own cost stops mattering
// next to its bytes'.
const DefaultMaxBatchBytes = 256 << 10

// Validate refuses settings that cannot work.
func (c JobConfig) Validate() error {
	if c.Keyring == nil {
		return &core.ConfigError{Field: "resume-key", Value: nil, Err: errors.New("the job service needs the node's resume keyring")}
	}
	if c.TokenTTL < time.Second || c.TokenTTL > resume.MaxTTL {
		return &core.ConfigError{Field: "resume-token-ttl", Value: c.TokenTTL, Err: errors.New("must be between 1s and 24h")}
	}
	if c.MaxBatchBytes < 0 {
		return &core.ConfigError{Field: "max-batch-bytes", Value: c.MaxBatchBytes, Err: errors.New("must not be negative")}
	}
	return c.Stream.Validate()
}

// JobServer serves the JobService over a core.Engine.
//
// Each stream has two goroutines of this package: a runner, which makes
// the call's checks and the engine's Submit or Resume and then runs
// stream.Run (the stream's one writer and its only Send caller; Run adds
// its lag watcher, which may Abort the sink), and the handler, which
// watches the writer and ends the gRPC stream when a Send is still blocked
// at its write deadline (see sink). The handler returns when the writer is
// done, or when it gave up on it; the writer then ends at once with the
// stream. Runners are kept between streams (runners). JobServer.Wait waits
// for both.
type JobServer struct {
	pb.UnimplementedJobServiceServer
	e    *core.Engine
	cfg  JobConfig
	log  *slog.Logger
	m    *stream.TransportMetrics
	errs *apierr.Reporter
	wg   sync.WaitGroup
	// runners run each stream's work and writer; their goroutines count in wg.
	runners runners
}

var _ pb.JobServiceServer = (*JobServer)(nil)

// NewJobServer returns a JobService over e; reg (nil: none) receives its
// metrics.
func NewJobServer(e *core.Engine, cfg JobConfig, reg prometheus.Registerer) (*JobServer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	if cfg.StreamMetrics == nil {
		cfg.StreamMetrics = stream.NewMetrics(reg)
	}
	if cfg.Errors == nil {
		cfg.Errors = apierr.NewMetrics(reg)
	}
	if cfg.Transport == "" {
		cfg.Transport = "grpc"
	}
	if cfg.Cluster == nil {
		cfg.Cluster = core.NoCluster{}
	}
	if cfg.MaxBatchBytes == 0 {
		cfg.MaxBatchBytes = DefaultMaxBatchBytes
	}
	s := &JobServer{e: e, cfg: cfg, log: cfg.Logger, m: cfg.StreamMetrics.For("grpc"), errs: cfg.Errors.Reporter(cfg.Transport, cfg.Logger)}
	s.runners.wg = &s.wg
	return s, nil
}

// Wait ends the runners that wait for a stream and blocks until every
// stream handler and its writer goroutine have ended. Call it after the
// gRPC server stopped (grpc.Server.Stop does not wait for handlers): by
// then every stream's context is done, so every stream ends promptly.
func (s *JobServer) Wait() {
	s.runners.close()
	s.wg.Wait()
}

// Submit posts an envelope to a queue and streams the job's events. The
// stream owns the job exactly like an SSE POST's: when it ends, the job is
// cancelled unless its client resumes within the grace window (see
// core.Engine.StreamClosed).
func (s *JobServer) Submit(req *pb.SubmitRequest, gs grpc.ServerStreamingServer[pb.JobEvent]) error {
	return s.serve(gs, 0, func(snk *sink) error { return s.submit(req, gs, snk) })
}

// SubmitBatched is Submit, its events framed in batches (see sink).
func (s *JobServer) SubmitBatched(req *pb.SubmitRequest, gs grpc.ServerStreamingServer[pb.JobEventBatch]) error {
	return s.serve(gs, s.cfg.MaxBatchBytes, func(snk *sink) error { return s.submit(req, gs, snk) })
}

// submit is the work of Submit and SubmitBatched, on a runner (see serve):
// snk frames the events.
func (s *JobServer) submit(req *pb.SubmitRequest, gs grpc.ServerStream, snk *sink) error {
	ctx := gs.Context()
	queue := req.GetQueue()
	if err := core.CheckQueueName(queue); err != nil {
		return s.fail("Submit", err)
	}
	id := auth.FromContext(ctx)
	if err := id.Allow(auth.Submit, queue); err != nil {
		return s.fail("Submit", err)
	}
	env, err := core.ParseEnvelope(req.GetEnvelopeJson())
	if err != nil {
		return s.fail("Submit", err)
	}
	j, existing, err := id.Submit(ctx, s.e, queue, env, core.SubmitOptions{IdempotencyKey: req.GetIdempotencyKey(), Streamed: true})
	if err != nil {
		// Declared here: errors.As moves it to the heap (as in httpapi).
		var elsewhere *core.JobElsewhere
		if errors.As(err, &elsewhere) {
			return s.relaySubmit(gs, snk.maxBatch > 0, req, elsewhere)
		}
		return s.fail("Submit", err)
	}
	// A retried Submit that matched an idempotency key must not take
	// ownership of a job some other call is streaming.
	return s.streamJob(gs, snk, j, 0, nil, stream.Terminate, !existing, nil)
}

// Resume continues a job's stream after the position in a resume token
// (from the start without one). A resume with a valid token owns a job
// streamed from its Submit or POST, as that stream did: it saves the job
// from its grace window, and when it ends the window starts again. One
// without a token just watches.
func (s *JobServer) Resume(req *pb.ResumeRequest, gs grpc.ServerStreamingServer[pb.JobEvent]) error {
	return s.serve(gs, 0, func(snk *sink) error { return s.resume(req, gs, snk) })
}

// ResumeBatched is Resume, its events framed in batches (see sink).
func (s *JobServer) ResumeBatched(req *pb.ResumeRequest, gs grpc.ServerStreamingServer[pb.JobEventBatch]) error {
	return s.serve(gs, s.cfg.MaxBatchBytes, func(snk *sink) error { return s.resume(req, gs, snk) })
}

// resume is the work of Resume and ResumeBatched, on a runner (see serve):
// snk frames the events.
func (s *JobServer) resume(req *pb.ResumeRequest, gs grpc.ServerStream, snk *sink) error {
	j, err := visible(gs.Context(), s.e, req.GetJobId())
	if err != nil {
		return s.fail("Resume", err)
	}
	filter, err := stream.ParseTypes(req.GetTypes())
	if err != nil {
		return s.fail("Resume", err)
	}
	slow := stream.Terminate
	if req.GetDropOldest() {
		slow = stream.DropOldest
	}
	after, resumed, err := s.resumes().Resume(gs.Context(), j, req.GetResumeToken(), callerFingerprint(gs.Context()), filter)
	if err != nil {
		return s.fail("Resume", err)
	}
	if stream.Complete(s.e, j, after) {
		return nil // OK with no events
	}
	// A reader of the job's stream is a span of the job's trace, linked
	// to the call's own.
	ctx, span := s.e.StartResume(gs.Context(), j, after)
	return s.streamJob(ctxStream{gs, ctx}, snk, j, after, filter, slow, resumed, func(res stream.Result) { stream.EndSpan(span, res, after) })
}

// serviceDesc is the JobService as pb.RegisterJobServiceServer registers
// it, but for its streams, whose request is received on the stream's
// runner (serve) rather than on the goroutine gRPC starts for the call:
// receiving grows a fresh goroutine's stack by copying it, which the
// runner already did. Each handler does what the generated one does, in
// the same order.
func (s *JobServer) serviceDesc() *grpc.ServiceDesc {
	d := pb.JobService_ServiceDesc
	d.Streams = slices.Clone(d.Streams)
	for i := range d.Streams {
		switch d.Streams[i].StreamName {
		case "Submit":
			d.Streams[i].Handler = streamHandler(s, 0, s.submit)
		case "Resume":
			d.Streams[i].Handler = streamHandler(s, 0, s.resume)
		case "SubmitBatched":
			d.Streams[i].Handler = streamHandler(s, s.cfg.MaxBatchBytes, s.submit)
		case "ResumeBatched":
			d.Streams[i].Handler = streamHandler(s, s.cfg.MaxBatchBytes, s.resume)
		}
	}
	return &d
}

// streamHandler is a JobService stream's handler: on the stream's runner
// it receives the one request, then runs handle with it, its events
// framed as maxBatch says (newSink).
func streamHandler[Req any](s *JobServer, maxBatch int, handle func(*Req, grpc.ServerStream, *sink) error) grpc.StreamHandler {
	return func(_ any, st grpc.ServerStream) error {
		return s.serve(st, maxBatch, func(snk *sink) error {
			req := new(Req)
			if err := st.RecvMsg(req); err != nil {
				return err
			}
			return handle(req, st, snk)
		})
	}
}

// ctxStream is a job event stream whose context is ctx.
type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s ctxStream) Context() context.Context { return s.ctx }

// Get returns a job's status. Another subject's job is answered as one
// that does not exist.
func (s *JobServer) Get(ctx context.Context, req *pb.GetJobRequest) (*pb.JobStatus, error) {
	if _, err := visible(ctx, s.e, req.GetJobId()); err != nil {
		return nil, s.fail("Get", err)
	}
	v, err := s.e.View(req.GetJobId())
	if err != nil {
		return nil, s.fail("Get", err)
	}
	return jobStatus(v), nil
}

// Cancel ends a job as cancelled (unless it had already ended); its worker
// is told at once. Another subject's job is answered as one that does not
// exist, and nothing changes.
func (s *JobServer) Cancel(ctx context.Context, req *pb.CancelJobRequest) (*pb.JobStatus, error) {
	if _, err := visible(ctx, s.e, req.GetJobId()); err != nil {
		return nil, s.fail("Cancel", err)
	}
	v, err := s.e.Cancel(req.GetJobId(), "cancelled by request")
	if err != nil {
		return nil, s.fail("Cancel", err)
	}
	return jobStatus(v), nil
}

// fail is the status a call ends with for err, logged and counted.
func (s *JobServer) fail(method string, err error) error {
	s.errs.Report(err, "method", method)
	return apierr.Status(err)
}

// serve runs a job stream's call: work (the call's checks, the engine's
// part, and then the stream's writer, which sends on gs itself) runs on a
// runner, and this goroutine, the handler's, watches the writer through
// snk (sink.watch). It returns work's status when work is done, or, when
// a Send of the writer is still blocked at its write deadline, gives up
// on it: returning ends the gRPC stream, and with it that Send. Until
// work ends (or the watch gave up), only work touches gs. maxBatch is the
// stream's framing (newSink).
func (s *JobServer) serve(gs grpc.ServerStream, maxBatch int, work func(snk *sink) error) error {
	s.wg.Add(1)
	defer s.wg.Done()
	snk := newSink(gs, nil, 0, maxBatch)
	done := make(chan struct{})
	var err error
	s.runners.run(func() {
		defer close(done)
		err = work(snk)
	})
	if snk.watch(done) {
		return s.fail("stream", endError(gs.Context(), stream.EndWriteFailed, true))
	}
	return err
}

// streamJob serves a job's stream from after on gs through snk, as the
// stream's writer, and returns the status the call ends with. claim marks
// a stream that is the submitter's — the job's own Submit, or a resume
// with a valid token (stream.JobStream.Claim). ended, if set, is told how
// the stream went once it is over, which may be after the call returned
// (see serve).
func (s *JobServer) streamJob(gs grpc.ServerStream, snk *sink, j *core.Job, after uint64, filter map[core.EventKind]bool, slow stream.SlowPolicy, claim bool, ended func(stream.Result)) error {
	ctx := gs.Context()
	_ = gs.SetHeader(metadata.Pairs(HeaderJobID, j.ID))
	snk.job, snk.snap = j, s.e.Epoch()
	door := stream.Door{Engine: s.e, Resumes: s.resumes(), Policy: s.cfg.Stream}
	js := stream.JobStream{Job: j, After: after, Filter: filter, Slow: slow, Claim: claim, Caller: callerFingerprint(ctx)}
	res := door.Serve(ctx, js, snk)
	snk.close()
	if ended != nil {
		ended(res)
	}
	if err := endError(ctx, res.End, snk.lastWriteFailed()); err != nil {
		return s.fail("stream", err)
	}
	return nil
}

// endError is why a stream's call ends. A stream that said why it ended
// in its last event — the job's terminal event, or a "terminated" or
// "resync" control event — ends OK (nil). One the client left ends with
// the context's error (nobody reads its status). One whose last write did
// not get through — a client that stopped reading, the write timeout, a
// slow stream whose terminated event could not be sent — ends with
// write_failed (UNAVAILABLE), so a client that reads what its transport
// still holds learns that the stream did not end by itself and resumes
// from the last token it received.
func endError(ctx context.Context, end stream.End, lastWriteFailed bool) error {
	if !lastWriteFailed && end != stream.EndWriteFailed && end != stream.EndClientGone {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return &core.Error{Code: core.CodeWriteFailed, Detail: fmt.Sprintf("the stream ended (%s) before its last event could be written; resume with the last resume_token received", end)}
}

func jobStatus(v core.JobView) *pb.JobStatus {
	r := &pb.JobStatus{
		JobId: v.ID, Queue: v.Queue, State: string(v.State),
		Outcome: optional(string(v.Outcome)), Code: optional(string(v.Code)), Detail: optional(v.Detail),
		Generation: v.Generation, HandledBy: optional(v.HandledBy), Worker: optional(v.WorkerName),
		CreatedAt: v.Created.UTC().Format(time.RFC3339Nano),
		TtlMs:     v.TTL.Milliseconds(), RemainingMs: v.Remaining.Milliseconds(), Outputs: int64(v.Outputs),
		LastSeq: v.LastSeq, WaitingForReader: v.WaitingForReader, TraceId: v.TraceID,
		Links: &pb.JobLinks{Self: "/v1/jobs/" + v.ID, Events: "/v1/jobs/" + v.ID + "/events"},
	}
	if !v.Ended.IsZero() {
		r.EndedAt = optional(v.Ended.UTC().Format(time.RFC3339Nano))
	}
	r.StreamGeneration, r.OnWorkerLost = v.StreamGeneration, optional(string(v.OnWorkerLost))
	r.Restarts, r.MaxRestarts = int64(v.Restarts), int64(v.MaxRestarts)
	for _, a := range v.Attempts {
		pa := &pb.JobAttempt{
			Attempt: a.Attempt, Gen: a.Gen, Consumer: a.Consumer, Worker: a.Worker, Node: a.Node,
			StartedAt: a.Started.UTC().Format(time.RFC3339Nano), Reason: optional(a.Reason),
		}
		if !a.Ended.IsZero() {
			pa.EndedAt = optional(a.Ended.UTC().Format(time.RFC3339Nano))
		}
		r.Attempts = append(r.Attempts, pa)
	}
	return r
}

// optional is an optional proto field's value: unset for "", which the JSON
// of the HTTP API omits.
func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
