package httpapi

import (
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/switchyard/switchyard/auth"
	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/resume"
)

// Read tokens: an EventSource cannot send an Authorization header, so a
// page that reads a job's events (or the live cluster view) with one first
// asks, with its key, for a short-lived token scoped to that one stream,
// and passes it as ?read_token=. The token is signed with the node's resume
// keyring (same HMAC, same key ids: it verifies on every node sharing the
// keys, and survives their rotation); it names its scope ("job:<id>" or
// "cluster:read"), the fingerprint of the subject it was issued to (never
// the key), and an expiry. Its bearer reads that stream, and the job's
// document, and nothing else; resume tokens issued on its stream are bound
// to the subject, so a position from the page's fetch stream resumes in its
// EventSource. The node logs paths, never query strings: a token stays out
// of its logs (docs/web.md, "API keys").

// readTokenFilter marks a read token: the filter fingerprint of a resume
// token is of its event types, so neither kind verifies as the other.
var readTokenFilter = resume.Fingerprint("read-token", "v1")

// ReadToken is the answer of the read-token routes.
type ReadToken struct {
	// Token goes in the stream's URL as ?read_token=.
	Token string `json:"token"`
	// ExpiresAt is when it stops working (RFC 3339); the stream then
	// answers 401, and the page asks for a new one with its key.
	ExpiresAt string `json:"expires_at"`
} // @name ReadToken

// handleJobReadToken is POST /v1/jobs/{id}/read-token.
//
//	@Summary		A read token for a job's stream
//	@Description	A short-lived token that reads this job's events and document, for an EventSource: ?read_token=. See docs/api.md#read-tokens.
//	@Tags			jobs
//	@ID				jobReadToken
//	@Produce		json
//	@Security		BearerKey
//	@Param			id	path		string		true	"job id"
//	@Success		200	{object}	ReadToken	"the token"
//	@Failure		401	{object}	apierr.Problem	"unauthenticated"
//	@Failure		403	{object}	apierr.Problem	"permission_denied"
//	@Failure		404	{object}	apierr.Problem	"job_not_found"
//	@Router			/v1/jobs/{id}/read-token [post]
func (s *Server) handleJobReadToken(w http.ResponseWriter, r *http.Request) {
	j, err := s.visibleJob(r, chi.URLParam(r, "id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	v, err := s.e.View(j.ID)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeReadToken(w, r, auth.JobScope(j.ID), v.Remaining+s.e.Config().Retention)
}

// handleClusterReadToken is POST /v1/cluster/read-token.
//
//	@Summary		A read token for the live cluster view
//	@Description	A short-lived token that reads GET /v1/cluster/events?read_token= and nothing else. See docs/api.md#read-tokens.
//	@Tags			cluster
//	@ID				clusterReadToken
//	@Produce		json
//	@Security		BearerKey
//	@Success		200	{object}	ReadToken	"the token"
//	@Failure		401	{object}	apierr.Problem	"unauthenticated"
//	@Failure		403	{object}	apierr.Problem	"permission_denied"
//	@Router			/v1/cluster/read-token [post]
func (s *Server) handleClusterReadToken(w http.ResponseWriter, r *http.Request) {
	s.writeReadToken(w, r, auth.ClusterScope, s.cfg.TokenTTL)
}

// writeReadToken signs a read token for scope that lives for life, capped
// at the resume token TTL, at least a second. Not capped at the stream max
// duration: the node ends a stream after it, and the EventSource's
// reconnect that follows must still be let in.
func (s *Server) writeReadToken(w http.ResponseWriter, r *http.Request, scope string, life time.Duration) {
	life = max(min(life, s.cfg.TokenTTL), time.Second)
	now := time.Now()
	tok, err := s.cfg.Keyring.Sign(resume.Position{
		Stream: scope, Caller: auth.FromContext(r.Context()).Caller(), Filter: readTokenFilter,
	}, now, life)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	// What Sign wrote: whole seconds from the second it was issued in.
	expires := time.Unix(now.Unix()+int64(life/time.Second), 0).UTC()
	writeJSON(w, http.StatusOK, ReadToken{Token: tok, ExpiresAt: expires.Format(time.RFC3339)})
}

// errReadToken is the one answer to a read token that does not verify.
var errReadToken = &core.Error{Code: core.CodeUnauthenticated, Detail: "the read token is not valid, or has expired: ask for a new one with the key"}

// readTokenIdentity is the identity of a read token's bearer: the stream it
// names, read as the subject it was issued to. A token that does not
// verify, whatever the reason, gets one answer; so does one of a subject
// whose keys a reload changed since it was issued (auth.Store.Revoked).
func (s *Server) readTokenIdentity(_ *http.Request, tok string) (*auth.Identity, error) {
	p, err := s.cfg.Keyring.VerifyGrant(tok, time.Now(), readTokenFilter)
	if err == nil && s.cfg.Keys.Revoked(p.Caller, p.IssuedAt) {
		s.log.Debug("read token refused", "reason", "revoked: its subject's keys changed at a reload")
		return nil, errReadToken
	}
	if err != nil {
		s.log.Debug("read token refused", "reason", string(resume.ReasonOf(err)))
		return nil, errReadToken
	}
	return auth.ReadToken(p.Stream, p.Caller), nil
}
