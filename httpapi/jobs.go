package httpapi

import (
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/stream"
)

// JobLinks are where a job can be read, streamed and cancelled.
type JobLinks struct {
	Self   string `json:"self"`
	Events string `json:"events"`
}

// JobResponse is a job as GET /v1/jobs/{id} and a 202 from POST show it.
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
}

func jobResponse(v core.JobView) JobResponse {
	r := JobResponse{
		JobID: v.ID, Queue: v.Queue, State: string(v.State), Outcome: string(v.Outcome),
		Code: string(v.Code), Detail: v.Detail, Generation: v.Generation, HandledBy: v.HandledBy,
		Worker: v.WorkerName, CreatedAt: v.Created.UTC().Format(time.RFC3339Nano),
		TTLMs: v.TTL.Milliseconds(), RemainingMs: v.Remaining.Milliseconds(), Outputs: v.Outputs,
		LastSeq: v.LastSeq, Links: links(v.ID),
	}
	if !v.Ended.IsZero() {
		r.EndedAt = v.Ended.UTC().Format(time.RFC3339Nano)
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
func (s *Server) handleSubmit(w http.ResponseWriter, r *http.Request) {
	queue := chi.URLParam(r, "queue")
	if err := core.CheckQueueName(queue); err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := requireJSON(r); err != nil {
		s.writeError(w, r, err)
		return
	}
	// Read through the byte limit before anything is parsed.
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			s.writeError(w, r, &core.Error{Code: core.CodeBodyTooLarge, Detail: "the body is larger than the node accepts"})
			return
		}
		s.writeError(w, r, &core.Error{Code: core.CodeMalformedJSON, Detail: "could not read the body: " + err.Error()})
		return
	}
	env, err := core.ParseEnvelope(body)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	streamed := wantsEventStream(r)
	j, existing, err := s.e.Submit(r.Context(), queue, env, core.SubmitOptions{
		IdempotencyKey: r.Header.Get("Idempotency-Key"),
		Streamed:       streamed,
	})
	if err != nil {
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
func (s *Server) handleGetJob(w http.ResponseWriter, r *http.Request) { s.gateway.ServeHTTP(w, r) }

// handleCancel is DELETE /v1/jobs/{id}: JobService.Cancel through the
// gateway. The job ends as cancelled (unless it had already ended) and its
// worker is told at once.
func (s *Server) handleCancel(w http.ResponseWriter, r *http.Request) { s.gateway.ServeHTTP(w, r) }

// handleEvents is GET /v1/jobs/{id}/events: the job's stream from the
// start, or after the position in Last-Event-ID (or ?last_event_id=).
// ?types=output,done filters event kinds (terminal events always come);
// ?slow=drop-oldest asks for drop-oldest instead of termination when the
// stream falls behind. Only a stream resumed with a valid token may own a
// job streamed from its POST (and save it from its grace window); one
// without a token just watches.
func (s *Server) handleEvents(w http.ResponseWriter, r *http.Request) {
	j, err := s.e.Job(chi.URLParam(r, "id"))
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
	if after > 0 && after >= j.History.Head() {
		if v, _ := s.e.View(j.ID); v.State.Terminal() {
			// The client has everything, terminal event included. 204 is
			// the one answer that stops an EventSource from reconnecting.
			w.WriteHeader(http.StatusNoContent)
			return
		}
	}
	s.streamJob(w, r, j, after, filter, slow, resumed)
}

func requireJSON(r *http.Request) error {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return &core.Error{Code: core.CodeUnsupportedMediaType, Detail: "Content-Type: application/json is required"}
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
		return &core.Error{Code: core.CodeUnsupportedMediaType, Detail: "Content-Type must be application/json, not " + ct}
	}
	return nil
}

func wantsEventStream(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept"), ",") {
		mt, _, err := mime.ParseMediaType(strings.TrimSpace(part))
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
