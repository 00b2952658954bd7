package httpapi

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	sse "github.com/tmaxmax/go-sse"

	"github.com/switchyard/switchyard/auth"
	"github.com/switchyard/switchyard/core"
)

// Workers over HTTP, for workers not written in Go: a worker opens a
// session with POST /v1/queues/{queue}/workers and reads it as server-sent
// events (registered, then job and cancel as they happen, heartbeat
// comments in the silences, closed when the node ends it); it answers with
// JSON posts under /v1/workers/{session}/. A session is another
// core.WorkerConn, with the gRPC session's semantics: the engine binds jobs
// to it within its credits (its concurrency), a reject releases the job to
// another worker, an offer not answered within the dispatch timeout is a
// stall that drops the session, every post names (job, generation) and is
// fenced, and the session ends when its stream drops (jobs that produced no
// output go back to the queue; the others end worker_lost) or when the
// node hears nothing from the worker for the idle timeout.

// WorkerRequest is the body of POST /v1/queues/{queue}/workers.
type WorkerRequest struct {
	// Name is a human label for logs and the queue view.
	Name string `json:"name,omitempty"`
	// Capabilities the worker can run, "key=value".
	Capabilities []string `json:"capabilities,omitempty"`
	// Concurrency is how many jobs it holds at once (its credits); 0 means 1.
	Concurrency int `json:"concurrency,omitempty"`
} // @name WorkerRequest

// WorkerStream describes a worker session's text/event-stream: each field
// is one SSE event type, its schema the event's data. Heartbeats are
// comment lines (": heartbeat"), sent after a heartbeat interval of
// silence.
type WorkerStream struct {
	Registered RegisteredEvent `json:"registered"`
	Job        JobOffer        `json:"job"`
	Cancel     CancelEvent     `json:"cancel"`
	Closed     ClosedEvent     `json:"closed"`
} // @name WorkerStream

// RegisteredEvent is a session's first event.
type RegisteredEvent struct {
	// Session names the session in every post: /v1/workers/{session}/...
	// On a node that checks keys, each post carries the key too, of the
	// subject that opened the session; another subject's posts are
	// answered session_not_found.
	Session string `json:"session"`
	// ConsumerID is the consumer the node registered (the queue view shows it).
	ConsumerID string `json:"consumer_id"`
	Node       string `json:"node"`
	// HeartbeatMs is how often the worker should post a heartbeat when it
	// has nothing else to post; IdleTimeoutMs is how long the node waits
	// for any post before it ends the session.
	HeartbeatMs   int64 `json:"heartbeat_ms"`
	IdleTimeoutMs int64 `json:"idle_timeout_ms"`
} // @name RegisteredEvent

// JobOffer offers a job: accept or reject it within the dispatch timeout,
// or the session is dropped as stalled.
type JobOffer struct {
	JobID      string `json:"job_id"`
	Generation uint64 `json:"generation"`
	Queue      string `json:"queue"`
	// Input is the envelope's input, a JSON value.
	Input any `json:"input"`
	// Options is the envelope's options object, when it has one.
	Options map[string]any `json:"options,omitempty"`
	// Capabilities the job requires, "key=value".
	Capabilities []string `json:"capabilities"`
	// TTLMs is the TTL left when the node sent the offer: the worker's
	// deadline is its own receive time plus this.
	TTLMs int64 `json:"ttl_ms"`
	// MaxOutputBytes is the most output the job may produce; the node ends
	// the job output_too_large past it.
	MaxOutputBytes int64 `json:"max_output_bytes"`
	// Traceparent is the job's W3C trace context (its parent: the node's
	// offer), for the worker's own spans of the job; Tracestate goes with
	// it when the trace has one (docs/tracing.md).
	Traceparent string `json:"traceparent"`
	Tracestate  string `json:"tracestate,omitempty"`
	// AffinityKey is the envelope's affinity key, when it has one: the
	// jobs with one key come to the same worker while it lives and has
	// room, so a worker may keep a cache or a session under it.
	AffinityKey string `json:"affinity_key,omitempty"`
	// Priority is the envelope's, -5 to 5 (0 when absent); the node
	// already ordered the job by it.
	Priority int `json:"priority,omitempty"`
} // @name JobOffer

// CancelEvent tells the worker to stop a job at once; the worker answers
// with a fail (code "cancelled"), which frees its credit.
type CancelEvent struct {
	JobID      string `json:"job_id"`
	Generation uint64 `json:"generation"`
	// Reason is the job's end: cancelled, expired, node_shutdown,
	// output_too_large, ...
	Reason string `json:"reason"`
} // @name CancelEvent

// ClosedEvent is the last event of a session the node ended: the code and
// detail a problem would carry (session_closed, idle_timeout).
type ClosedEvent struct {
	Code   string `json:"code"`
	Detail string `json:"detail"`
} // @name ClosedEvent

// workerSessions are the HTTP worker sessions of a node, by session id.
type workerSessions struct {
	mu sync.Mutex
	m  map[string]*workerSession
}

func (ws *workerSessions) add(sess *workerSession) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.m == nil {
		ws.m = map[string]*workerSession{}
	}
	ws.m[sess.id] = sess
}

func (ws *workerSessions) remove(id string) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	delete(ws.m, id)
}

func (ws *workerSessions) get(id string) *workerSession {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.m[id]
}

// workerSession is one worker's event stream; it implements
// core.WorkerConn. Its handler is the stream's one writer, fed by a queue
// bounded by count and bytes; the engine never blocks on it: a full queue
// drops the session, exactly as a stall would.
type workerSession struct {
	id string
	// owner is the subject that opened the session: only its key may post
	// for it.
	owner string
	w     *core.Worker
	// out is the writer's queue.
	out *core.Outbox[workerEvent]
	// lastRecv is when the worker last posted (unix nanoseconds).
	lastRecv  atomic.Int64
	closing   chan struct{}
	closeOnce sync.Once
	cause     error
	done      chan struct{}
}

var _ core.WorkerConn = (*workerSession)(nil)

type workerEvent struct {
	kind string
	data []byte
}

func (ss *workerSession) touch() { ss.lastRecv.Store(time.Now().UnixNano()) }

// enqueue queues an event for the writer without blocking (the engine
// calls it with its lock held), or fails at either bound.
func (ss *workerSession) enqueue(kind string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s: %w", kind, err)
	}
	return ss.out.Offer(workerEvent{kind, data}, int64(len(data)))
}

// SendOffer implements core.WorkerConn.
func (ss *workerSession) SendOffer(o core.Offer) error {
	traceparent, tracestate := core.FormatTrace(o.Trace)
	offer := map[string]any{
		"job_id": o.JobID, "generation": o.Gen, "queue": o.Queue, "input": o.Input,
		"capabilities": nonNil(o.Capabilities), "ttl_ms": max(o.TTL.Milliseconds(), 1), "max_output_bytes": o.MaxOutputBytes,
		"traceparent": traceparent,
	}
	if len(o.Options) > 0 {
		offer["options"] = o.Options
	}
	if tracestate != "" {
		offer["tracestate"] = tracestate
	}
	if o.AffinityKey != "" {
		offer["affinity_key"] = o.AffinityKey
	}
	if o.Priority != 0 {
		offer["priority"] = o.Priority
	}
	return ss.enqueue("job", offer)
}

// SendCredit implements core.WorkerConn. An HTTP worker does not see its
// output credit: its output post waits for it (handleWorkerOutput).
func (ss *workerSession) SendCredit(string, uint64, core.OutputCredit) error { return nil }

// SendCancel implements core.WorkerConn.
func (ss *workerSession) SendCancel(id string, gen uint64, reason core.Code) error {
	return ss.enqueue("cancel", CancelEvent{JobID: id, Generation: gen, Reason: string(reason)})
}

// Close implements core.WorkerConn.
func (ss *workerSession) Close(cause error) {
	ss.closeOnce.Do(func() {
		ss.cause = cause
		close(ss.closing)
	})
}

// handleWorkerSession is POST /v1/queues/{queue}/workers.
//
//	@Summary		Open a worker session
//	@Description	Registers a worker on a queue and streams its session: registered, then job offers and cancels, closed when the node ends it. See docs/workers.md#the-session.
//	@Tags			workers
//	@ID				openWorkerSession
//	@Accept			json
//	@Produce		text/event-stream
//	@Param			queue	path		string			true	"queue name"
//	@Param			worker	body		WorkerRequest	true	"what the worker can run"
//	@Success		200		{object}	WorkerStream	"the session's events"
//	@Failure		400		{object}	apierr.Problem	"malformed_json, invalid_field, invalid_queue_name, invalid_worker"
//	@Failure		413		{object}	apierr.Problem	"body_too_large"
//	@Failure		415		{object}	apierr.Problem	"unsupported_media_type"
//	@Failure		503		{object}	apierr.Problem	"draining, catalog_unavailable (Retry-After)"
//	@Security		BearerKey
//	@Router			/v1/queues/{queue}/workers [post]
func (s *Server) handleWorkerSession(w http.ResponseWriter, r *http.Request) {
	queue := chi.URLParam(r, "queue")
	if err := core.CheckQueueName(queue); err != nil {
		s.writeError(w, r, err)
		return
	}
	var req WorkerRequest
	if err := s.readJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	count, bytes := core.WorkerSendQueue(req.Concurrency, s.e.Config().Limits.MaxInputBytes)
	ss := &workerSession{
		id: "ws_" + rand.Text(), owner: auth.FromContext(r.Context()).Subject(),
		closing: make(chan struct{}), done: make(chan struct{}),
	}
	ss.out = core.NewOutbox[workerEvent](count, bytes, ss.done)
	ss.touch()
	defer close(ss.done)
	wk, err := s.e.AttachWorker(r.Context(), core.WorkerSpec{
		Queue: queue, Name: req.Name, Capabilities: req.Capabilities, Concurrency: req.Concurrency,
	}, ss)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ss.w = wk
	// Detach must run even though the request's context is done by then:
	// withdrawing the consumer record is cleanup, not request work.
	defer wk.Detach(context.WithoutCancel(r.Context()))
	s.workers.add(ss)
	defer s.workers.remove(ss.id)

	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	hb := s.cfg.Workers.HeartbeatInterval
	write := func(kind string, data []byte) error {
		_ = rc.SetWriteDeadline(time.Now().Add(s.cfg.Stream.WriteTimeout))
		m := &sse.Message{Type: sse.Type(kind)}
		m.AppendData(string(data))
		if _, err := m.WriteTo(w); err != nil {
			return err
		}
		return rc.Flush()
	}
	reg, _ := json.Marshal(RegisteredEvent{
		Session: ss.id, ConsumerID: wk.ID, Node: s.e.Config().Node,
		HeartbeatMs: hb.Milliseconds(), IdleTimeoutMs: s.cfg.Workers.IdleTimeout.Milliseconds(),
	})
	if write("registered", reg) != nil {
		return
	}
	end := ss.serve(r.Context(), s.cfg.Workers.HeartbeatInterval, s.cfg.Workers.IdleTimeout, write, func() error {
		_ = rc.SetWriteDeadline(time.Now().Add(s.cfg.Stream.WriteTimeout))
		m := &sse.Message{}
		m.AppendComment("heartbeat")
		if _, err := m.WriteTo(w); err != nil {
			return err
		}
		return rc.Flush()
	})
	if end != nil {
		s.errs.Report(end, "path", r.URL.Path, "consumer", wk.ID)
		data, _ := json.Marshal(ClosedEvent{Code: string(end.Code), Detail: end.Detail})
		_ = write("closed", data)
	}
}

// serve writes the session until it ends: the stream failed or the client
// left (nil), or the node ended it (the reason, as a *core.Error).
func (ss *workerSession) serve(ctx context.Context, heartbeat, idleTimeout time.Duration, write func(string, []byte) error, beat func() error) *core.Error {
	hb := time.NewTicker(heartbeat)
	defer hb.Stop()
	// Idle is checked twice per heartbeat interval, as the gRPC session
	// does: a silent worker ends within half an interval of its timeout.
	idle := time.NewTicker(heartbeat / 2)
	defer idle.Stop()
	sent := false
	for {
		select {
		case q := <-ss.out.C():
			if ev := ss.out.Take(q); write(ev.kind, ev.data) != nil {
				return nil
			}
			sent = true
		case <-idle.C:
			if time.Since(time.Unix(0, ss.lastRecv.Load())) > idleTimeout {
				return &core.Error{Code: core.CodeIdleTimeout, Detail: fmt.Sprintf("no post from the worker for %s", idleTimeout)}
			}
		case <-hb.C:
			if !sent && beat() != nil {
				return nil
			}
			sent = false
		case <-ss.closing:
			return &core.Error{Code: core.CodeSessionClosed, Detail: fmt.Sprintf("the node ended the session: %v", ss.cause)}
		case <-ctx.Done():
			return nil
		}
	}
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
