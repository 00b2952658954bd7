package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/rs/cors"

	"github.com/switchyard/switchyard/core"
)

// CORS: a web app served from its own origin may call a node when its
// origin is listed in --cors-origins. Nothing is cross-origin by default:
// with no origins listed, no response carries CORS headers and a
// preflight answers 405 like any OPTIONS. The middleware (github.com/rs/cors)
// wraps /v1 and the OpenAI-compatible front door, before authentication:
// a preflight carries no credentials, and a refusal must carry the CORS
// headers for the page to read it. Credentials are bearer keys in a
// header, never cookies, so no origin is ever allowed credentials (no
// ambient authority, nothing for CSRF to ride on).

// corsHeaders are the request headers a page may send: the key, the JSON
// body's type, an EventSource's position, a submission's idempotency key,
// and the front door's TTL, affinity key and priority.
var corsHeaders = []string{"Authorization", "Content-Type", "Last-Event-ID", "Idempotency-Key", TTLHeader, AffinityKeyHeader, PriorityHeader}

// corsExposed are the response headers a page may read: the stream's job,
// a 202's document, when to retry, and how to authenticate.
var corsExposed = []string{"X-Job-Id", "Location", "Retry-After", "WWW-Authenticate"}

// validateOrigins checks --cors-origins: exact origins (scheme://host[:port],
// as a browser sends them), or "*" alone.
func validateOrigins(origins []string) error {
	bad := func(o, why string) error {
		return &core.ConfigError{Field: "cors-origins", Value: o, Err: errors.New(why)}
	}
	for _, o := range origins {
		if o == "*" {
			if len(origins) > 1 {
				return bad(o, `"*" stands alone: it already allows every origin`)
			}
			continue
		}
		u, err := url.Parse(o)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
			u.Path != "" || u.RawQuery != "" || u.Fragment != "" || strings.Contains(o, "*") {
			return bad(o, "must be an exact origin, scheme://host[:port] (no path, no wildcard), or * alone")
		}
		if o != strings.ToLower(o) {
			return bad(o, fmt.Sprintf("must be written as a browser sends it: %s", strings.ToLower(o)))
		}
	}
	return nil
}

// corsMiddleware is the CORS handling of the API routes; nil for none.
func corsMiddleware(origins []string) func(http.Handler) http.Handler {
	if len(origins) == 0 {
		return nil
	}
	opts := cors.Options{
		AllowedMethods: []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodDelete},
		AllowedHeaders: corsHeaders,
		ExposedHeaders: corsExposed,
		MaxAge:         600,
	}
	if origins[0] == "*" {
		opts.AllowedOrigins = []string{"*"}
	} else {
		// Exact matches only: rs/cors reads a '*' inside an origin as a
		// wildcard, which validateOrigins refuses anyway.
		opts.AllowOriginFunc = func(origin string) bool { return slices.Contains(origins, origin) }
	}
	return cors.New(opts).Handler
}
