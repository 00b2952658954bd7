package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/switchyard/switchyard/auth"
	"github.com/switchyard/switchyard/core"
)

// The posts of an HTTP worker session: each names the session in its path
// and a (job, generation) the session holds, and is answered 204 once the
// node took it. A post for a job the session does not hold at that
// generation is refused (job_not_held) and changes nothing; so is one for a
// session that ended (session_not_found). Every post, heartbeats included,
// shows the worker alive.

// JobMessage is the body of accept: the binding it answers.
type JobMessage struct {
	// Generation is the offer's generation: the job's fencing token.
	Generation *uint64 `json:"generation"`
} // @name JobMessage

// RejectMessage is the body of reject.
type RejectMessage struct {
	Generation *uint64 `json:"generation"`
	// Reason is a human-readable why, passed on in the job's error if no
	// other worker takes it.
	Reason string `json:"reason,omitempty"`
} // @name RejectMessage

// OutputMessage is the body of output.
type OutputMessage struct {
	Generation uint64 `json:"generation"`
	// Data is one chunk of output: one JSON value, the data of an output
	// event on the job's stream.
	Data any `json:"data"`
} // @name OutputMessage

// CompleteMessage is the body of complete.
type CompleteMessage struct {
	Generation uint64 `json:"generation"`
	// Result is an optional JSON value, reported in the done event.
	Result any `json:"result,omitempty"`
} // @name CompleteMessage

// outputBody and completeBody are what the node reads of OutputMessage and
// CompleteMessage: the JSON values as the worker wrote them, byte for byte
// (a decoded value would come back with its keys sorted).
type outputBody struct {
	Generation *uint64         `json:"generation"`
	Data       json.RawMessage `json:"data"`
}

type completeBody struct {
	Generation *uint64         `json:"generation"`
	Result     json.RawMessage `json:"result"`
}

// FailMessage is the body of fail.
type FailMessage struct {
	Generation *uint64 `json:"generation"`
	// Code is a short machine-readable word ([A-Za-z0-9._-], at most 64),
	// the error event's code: "cancelled" answers a cancel; empty (or not
	// a valid code) means worker_error.
	Code    string `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
} // @name FailMessage

// handleWorkerAccept is POST /v1/workers/{session}/jobs/{job}/accept.
//
//	@Summary		Accept a job
//	@Description	Takes an offered job; output may follow. An output before the accept counts as one.
//	@Tags			workers
//	@ID				acceptJob
//	@Accept			json
//	@Param			session	path	string		true	"the session, from its registered event"
//	@Param			job		path	string		true	"job id"
//	@Param			message	body	JobMessage	true	"the offer's generation"
//	@Success		204		"taken"
//	@Failure		400		{object}	apierr.Problem	"malformed_json, invalid_field"
//	@Failure		404		{object}	apierr.Problem	"session_not_found"
//	@Failure		409		{object}	apierr.Problem	"job_not_held"
//	@Failure		413		{object}	apierr.Problem	"body_too_large"
//	@Failure		415		{object}	apierr.Problem	"unsupported_media_type"
//	@Security		BearerKey
//	@Router			/v1/workers/{session}/jobs/{job}/accept [post]
func (s *Server) handleWorkerAccept(w http.ResponseWriter, r *http.Request) {
	var m JobMessage
	s.workerPost(w, r, &m, func() *uint64 { return m.Generation }, func(ss *workerSession, job string, gen uint64) error {
		ss.w.Accept(job, gen)
		return nil
	})
}

// handleWorkerReject is POST /v1/workers/{session}/jobs/{job}/reject.
//
//	@Summary		Reject a job
//	@Description	Refuses an offered job: it goes to another worker, never back to this one. See docs/workers.md#same-semantics-as-the-grpc-session.
//	@Tags			workers
//	@ID				rejectJob
//	@Accept			json
//	@Param			session	path	string			true	"the session"
//	@Param			job		path	string			true	"job id"
//	@Param			message	body	RejectMessage	true	"the offer's generation and why"
//	@Success		204		"released"
//	@Failure		400		{object}	apierr.Problem	"malformed_json, invalid_field"
//	@Failure		404		{object}	apierr.Problem	"session_not_found"
//	@Failure		409		{object}	apierr.Problem	"job_not_held"
//	@Failure		413		{object}	apierr.Problem	"body_too_large"
//	@Failure		415		{object}	apierr.Problem	"unsupported_media_type"
//	@Security		BearerKey
//	@Router			/v1/workers/{session}/jobs/{job}/reject [post]
func (s *Server) handleWorkerReject(w http.ResponseWriter, r *http.Request) {
	var m RejectMessage
	s.workerPost(w, r, &m, func() *uint64 { return m.Generation }, func(ss *workerSession, job string, gen uint64) error {
		ss.w.Reject(job, gen, m.Reason)
		return nil
	})
}

// handleWorkerOutput is POST /v1/workers/{session}/jobs/{job}/output.
//
//	@Summary		Send output
//	@Description	One chunk of output, in the order the posts were answered; past the job's output window the answer waits, then may be 429 reader_behind. See docs/workers.md.
//	@Tags			workers
//	@ID				jobOutput
//	@Accept			json
//	@Param			session	path	string			true	"the session"
//	@Param			job		path	string			true	"job id"
//	@Param			message	body	OutputMessage	true	"the generation and one JSON value"
//	@Success		204		"taken"
//	@Failure		400		{object}	apierr.Problem	"malformed_json, invalid_field (data missing)"
//	@Failure		404		{object}	apierr.Problem	"session_not_found"
//	@Failure		409		{object}	apierr.Problem	"job_not_held"
//	@Failure		413		{object}	apierr.Problem	"body_too_large"
//	@Failure		415		{object}	apierr.Problem	"unsupported_media_type"
//	@Security		BearerKey
//	@Failure		429		{object}	apierr.Problem	"reader_behind: not taken; post it again after Retry-After"
//	@Router			/v1/workers/{session}/jobs/{job}/output [post]
func (s *Server) handleWorkerOutput(w http.ResponseWriter, r *http.Request) {
	var m outputBody
	s.workerPost(w, r, &m, func() *uint64 { return m.Generation }, func(ss *workerSession, job string, gen uint64) error {
		if len(m.Data) == 0 {
			return &core.Error{Code: core.CodeInvalidField, Field: "data", Detail: "data is required: one JSON value"}
		}
		return s.outputWithinCredit(r.Context(), ss, job, gen, m.Data)
	})
}

// outputWithinCredit relays an HTTP worker's output once the job has
// output credit for it, waiting for the job's reader at most half the
// session's idle timeout: the post is the worker's only sign of life
// while it waits, and a worker that waits for each answer posts nothing
// else meanwhile. Past that, the answer is reader_behind, and nothing was
// taken.
func (s *Server) outputWithinCredit(ctx context.Context, ss *workerSession, job string, gen uint64, data []byte) error {
	limit := time.NewTimer(s.cfg.Workers.IdleTimeout / 2)
	defer limit.Stop()
	for {
		wait := ss.w.OutputOrWait(job, gen, data)
		if wait == nil {
			return nil
		}
		select {
		case <-wait:
		case <-limit.C:
			return &core.Error{Code: core.CodeReaderBehind, RetryAfter: time.Second,
				Detail: fmt.Sprintf("the job's reader is behind: its output credit did not come within %s; the output was not taken, post it again", s.cfg.Workers.IdleTimeout/2)}
		case <-ss.done:
			return errSessionNotFound
		case <-ctx.Done():
			return nil // the worker left: nobody reads the answer
		}
	}
}

// handleWorkerComplete is POST /v1/workers/{session}/jobs/{job}/complete.
//
//	@Summary		Complete a job
//	@Description	Ends a job successfully (its stream's done event, with the result if given) and frees the worker's credit.
//	@Tags			workers
//	@ID				completeJob
//	@Accept			json
//	@Param			session	path	string			true	"the session"
//	@Param			job		path	string			true	"job id"
//	@Param			message	body	CompleteMessage	true	"the generation and an optional result"
//	@Success		204		"taken"
//	@Failure		400		{object}	apierr.Problem	"malformed_json, invalid_field"
//	@Failure		404		{object}	apierr.Problem	"session_not_found"
//	@Failure		409		{object}	apierr.Problem	"job_not_held"
//	@Failure		413		{object}	apierr.Problem	"body_too_large"
//	@Failure		415		{object}	apierr.Problem	"unsupported_media_type"
//	@Security		BearerKey
//	@Router			/v1/workers/{session}/jobs/{job}/complete [post]
func (s *Server) handleWorkerComplete(w http.ResponseWriter, r *http.Request) {
	var m completeBody
	s.workerPost(w, r, &m, func() *uint64 { return m.Generation }, func(ss *workerSession, job string, gen uint64) error {
		ss.w.End(job, gen, "", "", m.Result)
		return nil
	})
}

// handleWorkerFail is POST /v1/workers/{session}/jobs/{job}/fail.
//
//	@Summary		Fail a job
//	@Description	Ends a job with an error code (its stream's error event) and frees the worker's credit. A worker answers a cancel with code "cancelled".
//	@Tags			workers
//	@ID				failJob
//	@Accept			json
//	@Param			session	path	string		true	"the session"
//	@Param			job		path	string		true	"job id"
//	@Param			message	body	FailMessage	true	"the generation, a code and a message"
//	@Success		204		"taken"
//	@Failure		400		{object}	apierr.Problem	"malformed_json, invalid_field"
//	@Failure		404		{object}	apierr.Problem	"session_not_found"
//	@Failure		409		{object}	apierr.Problem	"job_not_held"
//	@Failure		413		{object}	apierr.Problem	"body_too_large"
//	@Failure		415		{object}	apierr.Problem	"unsupported_media_type"
//	@Security		BearerKey
//	@Router			/v1/workers/{session}/jobs/{job}/fail [post]
func (s *Server) handleWorkerFail(w http.ResponseWriter, r *http.Request) {
	var m FailMessage
	s.workerPost(w, r, &m, func() *uint64 { return m.Generation }, func(ss *workerSession, job string, gen uint64) error {
		code := core.Code(m.Code)
		if code == "" {
			code = core.CodeWorkerError
		}
		ss.w.End(job, gen, code, m.Message, nil)
		return nil
	})
}

// handleWorkerHeartbeat is POST /v1/workers/{session}/heartbeat.
//
//	@Summary		Heartbeat
//	@Description	Shows the worker alive when it has nothing else to post; the body is ignored. A session silent for idle_timeout_ms ends (idle_timeout).
//	@Tags			workers
//	@ID				workerHeartbeat
//	@Param			session	path	string	true	"the session"
//	@Success		204		"alive"
//	@Failure		404		{object}	apierr.Problem	"session_not_found"
//	@Security		BearerKey
//	@Router			/v1/workers/{session}/heartbeat [post]
func (s *Server) handleWorkerHeartbeat(w http.ResponseWriter, r *http.Request) {
	ss := s.sessionOf(r)
	if ss == nil {
		s.writeError(w, r, errSessionNotFound)
		return
	}
	ss.touch()
	w.WriteHeader(http.StatusNoContent)
}

// sessionOf is the session r's path names, if r's caller opened it: the
// session id names the session, the key proves who posts. Another
// subject's session is answered as one that does not exist.
func (s *Server) sessionOf(r *http.Request) *workerSession {
	ss := s.workers.get(chi.URLParam(r, "session"))
	if ss == nil {
		return nil
	}
	if who := auth.FromContext(r.Context()); !who.IsAnonymous() && who.Subject() != ss.owner {
		return nil
	}
	return ss
}

var errSessionNotFound = &core.Error{Code: core.CodeSessionNotFound, Detail: "no worker session by this id on this node: it ended, or never existed; open a new one"}

// workerPost is the common path of a worker's job posts: find the session
// (which the post shows alive), read the body into m, check that the
// session holds (job, generation), then apply.
func (s *Server) workerPost(w http.ResponseWriter, r *http.Request, m any, gen func() *uint64, apply func(ss *workerSession, job string, gen uint64) error) {
	ss := s.sessionOf(r)
	if ss == nil {
		s.writeError(w, r, errSessionNotFound)
		return
	}
	ss.touch()
	if err := s.readJSON(w, r, m); err != nil {
		s.writeError(w, r, err)
		return
	}
	g := gen()
	if g == nil {
		s.writeError(w, r, &core.Error{Code: core.CodeInvalidField, Field: "generation", Detail: "generation is required: the generation of the job's offer"})
		return
	}
	job := chi.URLParam(r, "job")
	if !ss.w.Holds(job, *g) {
		s.writeError(w, r, &core.Error{Code: core.CodeJobNotHeld, Detail: "this session does not hold the job at this generation: it was never offered here, it ended, or it was bound again since"})
		return
	}
	err := apply(ss, job, *g)
	// A post that waited (an output for a reader that is behind) showed
	// the worker alive all along.
	ss.touch()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// readJSON reads a JSON object body into v: Content-Type must be JSON, the
// body is read through the node's byte limit and deadline (readBody)
// before it is parsed, and the body must be one JSON object under the
// strict rules (core.DecodeJSON: valid UTF-8, no member named twice, names
// matched exactly); unknown members are ignored, as in an envelope.
func (s *Server) readJSON(w http.ResponseWriter, r *http.Request, v any) error {
	body, err := s.readJSONBody(w, r)
	if err != nil {
		return err
	}
	return core.DecodeJSON(body, v)
}
