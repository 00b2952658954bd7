package httpapi

import (
	"encoding/json"
	"errors"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/switchyard/switchyard/auth"
	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/stream"
)

// JobLinks are where a job can be read, streamed and cancelled.
type JobLinks struct {
	// Self is the job's document: GET (status) and DELETE (cancel).
	Self string `json:"self"`
	// Events is the job's event stream (GET, SSE).
	Events string `json:"events"`
} // @name JobLinks

// JobResponse is a job as GET /v1/jobs/{id} and a 202 from POST show it:
// JobService's JobStatus as JSON (the gateway writes it for GET and
// DELETE; this type for the 202, and for the OpenAPI document).
type JobResponse struct {
	JobID       string   `json:"job_id"`
	Queue       string   `json:"queue"`
	State       string   `json:"state"`
	Outcome     string   `json:"outcome,omitempty"`
	Code        string   `json:"code,omitempty"`
	Detail      string   `json:"detail,omitempty"`
	Generation  uint64   `json:"generation"`
	HandledBy   string   `json:"handled_by,omitempty"`
	Worker      string   `json:"worker,omitempty"`
	CreatedAt   string   `json:"created_at"`
	EndedAt     string   `json:"ended_at,omitempty"`
	TTLMs       int64    `json:"ttl_ms"`
	RemainingMs int64    `json:"remaining_ms"`
	Outputs     int      `json:"outputs"`
	LastSeq     uint64   `json:"last_seq"`
	Links       JobLinks `json:"links"`
	// WaitingForReader is true while the job's worker has used all its
	// output credit: the job goes on as its reader takes its output.
	WaitingForReader bool `json:"waiting_for_reader"`
	// TraceID is the job's W3C trace id (32 hex digits): the caller's
	// traceparent's, or a new trace's (docs/tracing.md).
	TraceID string `json:"trace_id"`
	// StreamGeneration is the job's stream generation now: 1 plus its
	// restarts (the "gen" of its newest events).
	StreamGeneration uint64 `json:"stream_generation"`
	// OnWorkerLost is the job's policy for a worker lost after output;
	// absent once the job ended.
	OnWorkerLost string `json:"on_worker_lost,omitempty" enums:"fail,restart"`
	// Restarts is how many times the job restarted; MaxRestarts how many
	// times it may (on_worker_lost: restart).
	Restarts    int64 `json:"restarts"`
	MaxRestarts int64 `json:"max_restarts"`
	// Attempts are the job's runs on workers, oldest first.
	Attempts []JobAttempt `json:"attempts"`
} // @name Job

// JobAttempt is one run of a job on a worker, as its ingress saw it: from
// the worker's accept to the end of its binding.
type JobAttempt struct {
	// Attempt is the binding generation (the "attempt" of the events it
	// produced); Gen the stream generation they belong to.
	Attempt uint64 `json:"attempt"`
	Gen     uint64 `json:"gen"`
	// Consumer is the worker's consumer id, Worker its label, Node the
	// node it is connected to.
	Consumer string `json:"consumer"`
	Worker   string `json:"worker"`
	Node     string `json:"node"`
	// StartedAt is when the worker took the job; EndedAt when its binding
	// ended (absent while it runs).
	StartedAt string `json:"started_at"`
	EndedAt   string `json:"ended_at,omitempty"`
	// Reason is how the attempt ended: "completed", the job's code, or
	// "worker_lost: " and what was lost. Absent while it runs.
	Reason string `json:"reason,omitempty"`
} // @name JobAttempt

func jobResponse(v core.JobView) JobResponse {
	r := JobResponse{
		JobID: v.ID, Queue: v.Queue, State: string(v.State), Outcome: string(v.Outcome),
		Code: string(v.Code), Detail: v.Detail, Generation: v.Generation, HandledBy: v.HandledBy,
		Worker: v.WorkerName, CreatedAt: v.Created.UTC().Format(time.RFC3339Nano),
		TTLMs: v.TTL.Milliseconds(), RemainingMs: v.Remaining.Milliseconds(), Outputs: v.Outputs,
		LastSeq: v.LastSeq, Links: links(v.ID), WaitingForReader: v.WaitingForReader, TraceID: v.TraceID,
	}
	if !v.Ended.IsZero() {
		r.EndedAt = v.Ended.UTC().Format(time.RFC3339Nano)
	}
	r.StreamGeneration, r.OnWorkerLost = v.StreamGeneration, string(v.OnWorkerLost)
	r.Restarts, r.MaxRestarts = int64(v.Restarts), int64(v.MaxRestarts)
	r.Attempts = []JobAttempt{}
	for _, a := range v.Attempts {
		ja := JobAttempt{
			Attempt: a.Attempt, Gen: a.Gen, Consumer: a.Consumer, Worker: a.Worker, Node: a.Node,
			StartedAt: a.Started.UTC().Format(time.RFC3339Nano), Reason: a.Reason,
		}
		if !a.Ended.IsZero() {
			ja.EndedAt = a.Ended.UTC().Format(time.RFC3339Nano)
		}
		r.Attempts = append(r.Attempts, ja)
	}
	return r
}

func links(id string) JobLinks {
	return JobLinks{Self: "/v1/jobs/" + id, Events: "/v1/jobs/" + id + "/events"}
}

// handleSubmit is POST /v1/queues/{queue}/jobs. With Accept:
// text/event-stream the response is the job's stream, and the client
// leaving it cancels the job; otherwise 202 and the job lives until its TTL
// or a DELETE.
//
//	@Summary		Submit a job
//	@Description	Posts an envelope: with `Accept: text/event-stream` the answer is the job's event stream, else 202 and the job's links. See docs/api.md#submitting-a-job.
//	@Tags			jobs
//	@ID				submitJob
//	@Accept			json
//	@Produce		json
//	@Produce		text/event-stream
//	@Param			queue			path		string		true	"queue name: 1-128 of [A-Za-z0-9._-], not starting with '.'"
//	@Param			envelope		body		Envelope	true	"the job"
//	@Param			Idempotency-Key	header		string		false	"makes a retried POST return the job the first one created (200 instead of 202); at most 255 bytes"
//	@Param			Accept			header		string		false	"text/event-stream for the job's stream"
//	@Success		200				{object}	JobResponse	"the job an Idempotency-Key matched (without Accept: text/event-stream)"
//	@Success		200				{object}	EventStream	"Accept: text/event-stream: the job's events (X-Job-Id: its id)"
//	@Success		202				{object}	JobResponse	"the job was taken; its links say where to read, stream and cancel it"
//	@Header			202				{string}	Location	"the job's document, /v1/jobs/{id}"
//	@Failure		400				{object}	apierr.Problem	"malformed_json (not one strict JSON object: invalid UTF-8, a member named twice), invalid_field, unsupported_version, missing_input, invalid_queue_name, invalid_idempotency_key (longer than 255 bytes), invalid_affinity_key"
//	@Failure		403				{object}	apierr.Problem	"permission_denied: the key lacks the role or the queue; priority_not_allowed: the priority is above the key's max_priority"
//	@Failure		409				{object}	apierr.Problem	"idempotency_key_reused"
//	@Failure		413				{object}	apierr.Problem	"body_too_large, input_too_large"
//	@Failure		415				{object}	apierr.Problem	"unsupported_media_type"
//	@Failure		422				{object}	apierr.Problem	"ttl_out_of_range, limit_above_ceiling, priority_out_of_range"
//	@Failure		429				{object}	apierr.Problem	"queue_full, queue_bytes_full, rate_limited: the key is over its rate or its jobs in flight (Retry-After)"
//	@Failure		503				{object}	apierr.Problem	"no_capable_worker, draining, dispatcher_unavailable (Retry-After)"
//	@Failure		504				{object}	apierr.Problem	"expired: the TTL ran out before the job reached its dispatcher"
//	@Security		BearerKey
//	@Router			/v1/queues/{queue}/jobs [post]
func (s *Server) handleSubmit(w http.ResponseWriter, r *http.Request) {
	queue := chi.URLParam(r, "queue")
	if err := core.CheckQueueName(queue); err != nil {
		s.writeError(w, r, err)
		return
	}
	body, err := s.readJSONBody(w, r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	env, err := core.ParseEnvelope(body)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	streamed := wantsEventStream(r)
	j, existing, err := auth.FromContext(r.Context()).Submit(r.Context(), s.e, queue, env, core.SubmitOptions{
		IdempotencyKey: r.Header.Get("Idempotency-Key"),
		Streamed:       streamed,
	})
	if err != nil {
		// Declared here, not above: errors.As takes its address, which
		// moves it to the heap, and a job submitted is the usual case.
		var elsewhere *core.JobElsewhere
		if errors.As(err, &elsewhere) {
			s.relaySubmit(w, r, elsewhere, body)
			return
		}
		s.writeError(w, r, err)
		return
	}
	// A retried POST that matched an idempotency key must not take
	// ownership of a job some other request is streaming.
	if streamed {
		s.streamJob(w, r, j, 0, nil, stream.Terminate, !existing)
		return
	}
	v, err := s.e.View(j.ID)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("Location", "/v1/jobs/"+j.ID)
	status := http.StatusAccepted
	if existing {
		status = http.StatusOK
	}
	writeJSON(w, status, jobResponse(v))
}

// handleGetJob is GET /v1/jobs/{id}: JobService.Get through the gateway.
//
//	@Summary		Get a job
//	@Description	The job's state and, once it ended, its outcome; kept for the node's --retention. See docs/api.md#a-jobs-document-and-its-cancel.
//	@Tags			jobs
//	@ID				getJob
//	@Produce		json
//	@Param			id	path		string		true	"job id"
//	@Success		200	{object}	JobResponse	"the job"
//	@Failure		404	{object}	apierr.Problem	"job_not_found"
//	@Security		BearerKey
//	@Security		ReadTokenQuery
//	@Router			/v1/jobs/{id} [get]
func (s *Server) handleGetJob(w http.ResponseWriter, r *http.Request) { s.gateway.ServeHTTP(w, r) }

// handleCancel is DELETE /v1/jobs/{id}: JobService.Cancel through the
// gateway. The job ends as cancelled (unless it had already ended) and its
// worker is told at once.
//
//	@Summary		Cancel a job
//	@Description	Ends the job as cancelled unless it already ended, tells its worker and answers the job's document. See docs/api.md#a-jobs-document-and-its-cancel.
//	@Tags			jobs
//	@ID				cancelJob
//	@Produce		json
//	@Param			id	path		string		true	"job id"
//	@Success		200	{object}	JobResponse	"the job after the cancel"
//	@Failure		404	{object}	apierr.Problem	"job_not_found"
//	@Security		BearerKey
//	@Router			/v1/jobs/{id} [delete]
func (s *Server) handleCancel(w http.ResponseWriter, r *http.Request) { s.gateway.ServeHTTP(w, r) }

// handleEvents is GET /v1/jobs/{id}/events: the job's stream from the
// start, or after the position in Last-Event-ID (or ?last_event_id=).
// ?types=output,done filters event kinds (terminal events always come);
// ?slow=drop-oldest asks for drop-oldest instead of termination when the
// stream falls behind. Only a stream resumed with a valid token may own a
// job streamed from its POST (and save it from its grace window); one
// without a token just watches.
//
//	@Summary		Stream a job's events
//	@Description	The job's events from the first, or after a resume token (Last-Event-ID or ?last_event_id=): no duplicate, no gap. See docs/api.md#a-jobs-event-stream.
//	@Tags			jobs
//	@ID				jobEvents
//	@Produce		text/event-stream
//	@Param			id				path		string		true	"job id"
//	@Param			Last-Event-ID	header		string		false	"resume after this event (its id)"
//	@Param			last_event_id	query		string		false	"the same, for clients that cannot set headers (a new EventSource); the header wins when both are set, since an EventSource keeps its URL when it reconnects"
//	@Param			types			query		string		false	"comma-separated event kinds to send: accepted, output, done, error (terminal events always come); a token is bound to the types it was issued with"
//	@Param			slow			query		string		false	"terminate (default) or drop-oldest: skip the oldest events, announced by a gap event, instead of ending the stream"	Enums(terminate, drop-oldest)
//	@Success		200				{object}	EventStream	"the job's events (X-Job-Id: its id)"
//	@Success		204				"the position is the end of a finished job: nothing left to send"
//	@Failure		400				{object}	apierr.Problem	"invalid_resume_token, invalid_field (types, slow)"
//	@Failure		404				{object}	apierr.Problem	"job_not_found"
//	@Security		BearerKey
//	@Security		ReadTokenQuery
//	@Router			/v1/jobs/{id}/events [get]
func (s *Server) handleEvents(w http.ResponseWriter, r *http.Request) {
	j, err := s.visibleJob(r, chi.URLParam(r, "id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	filter, err := parseFilter(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	slow := stream.Terminate
	switch r.URL.Query().Get("slow") {
	case "", "terminate":
	case "drop-oldest":
		slow = stream.DropOldest
	default:
		s.writeError(w, r, &core.Error{Code: core.CodeInvalidField, Field: "slow", Detail: "slow is terminate or drop-oldest"})
		return
	}
	after, resumed, err := s.resumePosition(r, j, filter)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if stream.Complete(s.e, j, after) {
		// 204 is the one answer that stops an EventSource from
		// reconnecting. It names the stream's media type all the same: a
		// client generated for a streaming operation (ogen's) reads the
		// Content-Type of every answer, bodiless or not.
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusNoContent)
		return
	}
	// A reader of the job's stream is a span of the job's trace, linked
	// to the request's own.
	ctx, span := s.e.StartResume(r.Context(), j, after)
	res := s.streamJob(w, r.WithContext(ctx), j, after, filter, slow, resumed)
	stream.EndSpan(span, res, after)
}

func requireJSON(r *http.Request) error {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return &core.Error{Code: core.CodeUnsupportedMediaType, Detail: "Content-Type: application/json is required"}
	}
	if strings.EqualFold(ct, "application/json") {
		// What nearly every client sends, and all ParseMediaType would
		// make of it; it allocates a map of parameters for every call.
		return nil
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
		return &core.Error{Code: core.CodeUnsupportedMediaType, Detail: "Content-Type must be application/json, not " + ct}
	}
	return nil
}

func wantsEventStream(r *http.Request) bool {
	for part := range strings.SplitSeq(r.Header.Get("Accept"), ",") {
		part = strings.TrimSpace(part)
		if strings.EqualFold(part, "text/event-stream") {
			// Bare, as nearly every client sends it: what ParseMediaType
			// would make of it, without its map of parameters.
			return true
		}
		mt, _, err := mime.ParseMediaType(part)
		if err == nil && mt == "text/event-stream" {
			return true
		}
	}
	return false
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
