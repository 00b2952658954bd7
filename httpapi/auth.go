package httpapi

import (
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/switchyard/switchyard/auth"
	"github.com/switchyard/switchyard/core"
)

// Access control (package auth): authenticate checks the caller's key once
// for every API route — /v1, the OpenAI-compatible front door, /metrics —
// and puts its identity in the request's context; each route then states
// what it needs with a middleware from this file, right where routes
// declares it. The unary routes are served by the gateway's services,
// which find the identity in the request's context and check who owns the
// job. The page, its assets, the OpenAPI document, /docs, /healthz and
// /readyz are open: they are the same for everyone, and the page is where
// a key is entered.

// authenticate answers 401 unauthenticated (WWW-Authenticate: Bearer) to a
// request without a valid credential, and passes the others on with their
// identity. On a node without keys every request is anonymous.
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := s.identify(r)
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="switchyard"`)
			s.writeError(w, r, err)
			return
		}
		next.ServeHTTP(w, r.WithContext(auth.NewContext(r.Context(), id)))
	})
}

// identify is who makes r: the key in its Authorization header or, for a
// request without one, the read token in its query (see readtoken.go).
func (s *Server) identify(r *http.Request) (*auth.Identity, error) {
	credential := r.Header.Get("Authorization")
	if credential == "" && r.URL.RawQuery != "" { // else Query parses nothing into a new map
		if tok := r.URL.Query().Get("read_token"); tok != "" {
			return s.readTokenIdentity(r, tok)
		}
	}
	return s.cfg.Keys.Authenticate(credential)
}

// allow is the middleware of a route that needs one of roles and, with
// queueParam, the use of the queue its path names.
func (s *Server) allow(roles auth.Role, queueParam string) func(http.Handler) http.Handler {
	return s.check(func(r *http.Request, id *auth.Identity) error {
		if err := id.AllowAny(roles); err != nil || queueParam == "" {
			return err
		}
		return id.Allow(roles, chi.URLParam(r, queueParam))
	})
}

// allowOpenAI is the front door's rule: the submit role on its queue.
func (s *Server) allowOpenAI() func(http.Handler) http.Handler {
	return s.check(func(_ *http.Request, id *auth.Identity) error {
		return id.Allow(auth.Submit, s.cfg.OpenAIQueue)
	})
}

// allowRead is the rule of a stream a read token may open: the roles, or a
// read token issued for the stream scope names.
func (s *Server) allowRead(roles auth.Role, scope func(*http.Request) string) func(http.Handler) http.Handler {
	return s.check(func(r *http.Request, id *auth.Identity) error {
		if id.ReadScope() != "" && id.ReadScope() == scope(r) {
			return nil
		}
		return id.AllowAny(roles)
	})
}

// allowMetrics guards /metrics: admin, unless --metrics-open.
func (s *Server) allowMetrics(next http.Handler) http.Handler {
	if s.cfg.MetricsOpen {
		return next
	}
	return s.authenticate(s.allow(auth.Admin, "")(next))
}

func (s *Server) check(rule func(*http.Request, *auth.Identity) error) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if err := rule(r, auth.FromContext(r.Context())); err != nil {
				s.writeError(w, r, err)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// visibleJob returns the job id names when r's caller may see it: its
// owner, an admin, or a read token issued for it. Any other caller gets
// the answer for a job that does not exist.
func (s *Server) visibleJob(r *http.Request, id string) (*core.Job, error) {
	j, err := s.e.Job(id)
	if err != nil {
		return nil, err
	}
	if !auth.FromContext(r.Context()).SeesJob(j.ID, j.Owner) {
		return nil, core.JobNotFound()
	}
	return j, nil
}

func jobScopeOf(r *http.Request) string { return auth.JobScope(chi.URLParam(r, "id")) }

func clusterScopeOf(*http.Request) string { return auth.ClusterScope }

// AdminOnly guards a handler served outside the API (the node's profiling
// server): it needs the admin role, as /metrics does without --metrics-open.
// On a node without API keys every call is anonymous and allowed, which
// the node's config permits on loopback addresses only.
func (s *Server) AdminOnly(next http.Handler) http.Handler {
	return s.authenticate(s.allow(auth.Admin, "")(next))
}
