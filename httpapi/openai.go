package httpapi

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/switchyard/switchyard/auth"
	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/stream"
)

// This file is the OpenAI-compatible front door: an OpenAI SDK whose base
// URL is http://node:8080/openai/v1 streams chat completions through
// Switchyard unchanged. The routes live in the node's one router, so every
// router-level middleware (access control, once it exists) covers them,
// and every error under /openai/ is answered in OpenAI's shape
// (writeError). docs/openai.md is the whole story.

// OpenAIPrefix is where the front door is mounted: apart from our own
// /v1 routes, so the two can never collide.
const OpenAIPrefix = "/openai/v1"

// DefaultOpenAIQueue is the queue chat completions are posted to unless
// --openai-queue says otherwise.
const DefaultOpenAIQueue = "chat"

// openAIRoutes mounts the front door's routes under OpenAIPrefix.
func (s *Server) openAIRoutes(r chi.Router) {
	r.Post("/chat/completions", s.handleChatCompletions)
	r.Get("/models", s.handleModels)
	// A model name may hold a '/' (org/model), which neither {model} nor a
	// regexp param matches: the OpenAPI document names this route
	// /models/{model}.
	r.Get("/models/*", s.handleModel)
}

// isOpenAIPath reports whether a request is the front door's, whose errors
// are answered in OpenAI's shape.
func isOpenAIPath(path string) bool { return strings.HasPrefix(path, "/openai/") || path == "/openai" }

// handleChatCompletions creates a chat completion.
//
//	@Summary		Create a chat completion (OpenAI-compatible)
//	@Description	A job for a worker declaring model=<model>: one chat.completion, or with stream: true a text/event-stream of chunks, then [DONE]. See docs/openai.md.
//	@Tags			openai
//	@Accept			json
//	@Produce		json
//	@Produce		text/event-stream
//	@Param			X-Switchyard-TTL-Ms	header		int							false	"the job's TTL in milliseconds, 1 to --max-ttl (default --default-ttl)"
//	@Param			X-Switchyard-Affinity-Key	header	string	false	"the job's affinity key, 1-256 bytes: completions with one key go to one worker while it lives and has room (default: the request's user)"
//	@Param			X-Switchyard-Priority	header	int	false	"the job's priority, -5 to 5 (default 0), at most the key's max_priority"
//	@Param			X-Switchyard-On-Worker-Lost	header	string	false	"restart: run the completion again on another worker if its worker is lost after it produced output (default fail: the request fails worker_lost)"	Enums(fail, restart)
//	@Param			request				body		ChatCompletionRequest		true	"an OpenAI chat completion request"
//	@Success		200					{object}	ChatCompletion				"without stream: the completion"
//	@Success		200					{object}	ChatCompletionEventStream	"with stream: true: its chunks as server-sent events"
//	@Failure		400					{object}	apierr.OpenAIErrorResponse	"invalid_field, malformed_json, missing_input, invalid_affinity_key (param names the field)"
//	@Failure		403					{object}	apierr.OpenAIErrorResponse	"priority_not_allowed: above the key's max_priority; permission_denied"
//	@Failure		404					{object}	apierr.OpenAIErrorResponse	"model_not_found: no worker on the queue offers the model"
//	@Failure		413					{object}	apierr.OpenAIErrorResponse	"body_too_large, input_too_large"
//	@Failure		415					{object}	apierr.OpenAIErrorResponse	"unsupported_media_type"
//	@Failure		422					{object}	apierr.OpenAIErrorResponse	"ttl_out_of_range, priority_out_of_range; rejected (every capable worker refused the job)"
//	@Failure		429					{object}	apierr.OpenAIErrorResponse	"queue_full, queue_bytes_full, rate_limited (with Retry-After)"
//	@Failure		502					{object}	apierr.OpenAIErrorResponse	"the worker failed the job (worker_error, worker_lost, bad_output, ...)"
//	@Failure		503					{object}	apierr.OpenAIErrorResponse	"no_capable_worker, draining, dispatcher_unavailable (with Retry-After)"
//	@Failure		504					{object}	apierr.OpenAIErrorResponse	"expired: the job's TTL ran out"
//	@ID				createChatCompletion
//	@Security		BearerKey
//	@Router			/openai/v1/chat/completions [post]
func (s *Server) handleChatCompletions(w http.ResponseWriter, r *http.Request) {
	body, err := s.readJSONBody(w, r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	req, env, err := chatEnvelope(r, body, s.e.Config().Limits.MaxTTL)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	// Streamed, whether or not the client streams: either way it waits on
	// this request for the answer, and its leaving cancels the job.
	j, _, err := auth.FromContext(r.Context()).Submit(r.Context(), s.e, s.cfg.OpenAIQueue, env, core.SubmitOptions{Streamed: true})
	if err != nil {
		s.writeError(w, r, s.chatSubmitError(req.model, err))
		return
	}
	w.Header().Set("X-Job-Id", j.ID)
	meta := newChatMeta(j, req.model)
	if req.stream {
		h := w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-store")
		h.Set("X-Accel-Buffering", "no")
		w.WriteHeader(http.StatusOK)
		s.runChat(r, j, &chatStreamSink{sseConn: s.newSSEConn(w, r), meta: meta, includeUsage: req.includeUsage})
		return
	}
	c := &chatCollector{meta: meta}
	res := s.runChat(r, j, c)
	if r.Context().Err() != nil {
		return // the client left: nobody to answer
	}
	if res.End != stream.EndTerminal && c.err == nil {
		c.err = fmt.Errorf("httpapi: a chat job's collection ended %s without a reason", res.End)
	}
	if c.err != nil {
		s.writeError(w, r, c.err)
		return
	}
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(s.cfg.Stream.WriteTimeout))
	writeJSON(w, http.StatusOK, c.completion())
}

// runChat serves a chat job to sink with the one stream writer, as the
// job's owner stream. An OpenAI client cannot resume, so a stream that
// ends before the job does, for any reason, leaves nobody to read it: the
// job is cancelled at once, as when the client leaves our own routes.
func (s *Server) runChat(r *http.Request, j *core.Job, sink stream.Sink) stream.Result {
	owner := s.e.StreamOpened(j.ID, true)
	s.om.Opened()
	res := stream.Run(r.Context(), stream.Request{Job: j, Policy: s.chatPolicy(j), Sent: s.e.Pacer(j.ID, owner)}, sink)
	if res.End != stream.EndTerminal && r.Context().Err() == nil {
		// The node ended it (an output it cannot translate, a client too
		// slow): say so in the job's outcome rather than "disconnected".
		_, _ = s.e.Cancel(j.ID, "the OpenAI-compatible stream ended before the job did: "+string(res.End))
	}
	s.e.StreamClosed(j.ID, owner, res.End != stream.EndTerminal)
	s.om.Closed(res)
	return res
}

// chatPolicy is the node's stream policy with its idle and max-duration
// clocks moved past the job's TTL. Those clocks end a stream so that its
// client resumes; an OpenAI client cannot, so on this stream they would
// only kill a healthy job early. The job's TTL bounds the stream instead,
// and heartbeats keep it open while a model thinks.
func (s *Server) chatPolicy(j *core.Job) stream.Policy {
	p := s.cfg.Stream
	p.Slow = stream.Terminate
	p.Idle = max(p.Idle, j.Limits.TTL+time.Minute)
	p.MaxDuration = max(p.MaxDuration, p.Idle+time.Minute)
	return p
}

// chatSubmitError tells an unknown model from a known one no worker can
// take now: no_capable_worker for a model the queue's workers do not offer
// at all becomes model_not_found (404, what OpenAI's SDKs expect for an
// unknown model), while one they offer on nodes not routable now stays
// no_capable_worker (503, retry). A limit on the input names messages,
// the OpenAI field it comes from.
func (s *Server) chatSubmitError(model string, err error) error {
	code, _ := core.CodeOf(err)
	switch {
	case code == core.CodeNoCapableWorker && !slices.Contains(s.openAIModels(), model):
		return &core.Error{Code: core.CodeModelNotFound, Field: "model", Detail: fmt.Sprintf(
			"the model %q does not exist here: no worker on queue %q offers model=%s (GET %s/models lists those that do)", model, s.cfg.OpenAIQueue, model, OpenAIPrefix)}
	case code == core.CodeInputTooLarge:
		var ce *core.Error
		errors.As(err, &ce)
		moved := *ce
		moved.Field = "messages"
		return &moved
	}
	return err
}

// openAIModels is every model a worker on the front door's queue offers
// right now: the values of the model capability of its consumers on
// online nodes, from the catalog view, deduplicated and sorted. Only that
// queue: the front door posts nowhere else, so a model offered on another
// queue would be listed and then refused.
func (s *Server) openAIModels() []string {
	online := map[string]bool{}
	for _, n := range s.cfg.Cluster.Nodes() {
		online[n.ID] = n.State == core.StateOnline
	}
	models := map[string]bool{}
	for _, c := range s.cfg.Cluster.Consumers(s.cfg.OpenAIQueue) {
		if online[c.Node] {
			for _, m := range c.Capabilities["model"] {
				models[m] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(models))
}

// OpenAIModel is a model some worker offers.
type OpenAIModel struct {
	ID      string `json:"id" example:"demo"`
	Object  string `json:"object" example:"model"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by" example:"switchyard"`
} // @name OpenAIModel

// OpenAIModelList is the answer of GET /openai/v1/models.
type OpenAIModelList struct {
	Object string        `json:"object" example:"list"`
	Data   []OpenAIModel `json:"data"`
} // @name OpenAIModelList

// openAIModel is the listing's entry of name. The catalog keeps no date:
// created is 0.
func openAIModel(name string) OpenAIModel {
	return OpenAIModel{ID: name, Object: "model", OwnedBy: "switchyard"}
}

// handleModels lists the models workers offer right now.
//
//	@Summary		List models (OpenAI-compatible)
//	@Description	Every model declared by a worker on the front door's queue whose node is online, deduplicated and sorted. See docs/openai.md#models.
//	@Tags			openai
//	@Produce		json
//	@ID				listModels
//	@Success		200	{object}	OpenAIModelList
//	@Security		BearerKey
//	@Router			/openai/v1/models [get]
func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	list := OpenAIModelList{Object: "list", Data: []OpenAIModel{}}
	for _, m := range s.openAIModels() {
		list.Data = append(list.Data, openAIModel(m))
	}
	writeJSON(w, http.StatusOK, list)
}

// handleModel answers for one model.
//
//	@Summary		Retrieve a model (OpenAI-compatible)
//	@Description	The model as GET /openai/v1/models lists it, or 404 model_not_found.
//	@Tags			openai
//	@Produce		json
//	@Param			model	path		string	true	"the model's name (it may contain /)"
//	@Success		200		{object}	OpenAIModel
//	@Failure		404		{object}	apierr.OpenAIErrorResponse	"model_not_found"
//	@ID				retrieveModel
//	@Security		BearerKey
//	@Router			/openai/v1/models/{model} [get]
func (s *Server) handleModel(w http.ResponseWriter, r *http.Request) {
	// chi matches the escaped path when there is one: an SDK escapes the
	// '/' of org/model.
	name, err := url.PathUnescape(chi.URLParam(r, "*"))
	if err != nil || !slices.Contains(s.openAIModels(), name) {
		s.writeError(w, r, &core.Error{Code: core.CodeModelNotFound, Field: "model", Detail: fmt.Sprintf("no worker on queue %q offers model=%s", s.cfg.OpenAIQueue, name)})
		return
	}
	writeJSON(w, http.StatusOK, openAIModel(name))
}
