package httpapi

import (
	"net/http"
	"strings"

	"github.com/switchyard/switchyard/auth"
	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/stream"
)

// resumes are this node's resume tokens as the SSE door counts them.
func (s *Server) resumes() stream.Resumes {
	return stream.Resumes{Keyring: s.cfg.Keyring, TTL: s.cfg.TokenTTL, Snapshot: s.e.Epoch, Metrics: s.m, Log: s.log}
}

// resumePosition reads the position a GET stream resumes from: the
// Last-Event-ID header (what EventSource sends by itself) or the
// last_event_id query parameter (what a page can give a new EventSource,
// which cannot set the header). No token means from the start, and resumed
// false: only a verified token is a resume, the one proof that the stream
// is the submitter's (it may then keep a streamed job alive).
//
// With both, the header wins: an EventSource opened with ?last_event_id=
// keeps that URL when it reconnects by itself, and sends the id of the last
// event it got since in the header. The query parameter is the older
// position then; resuming from it would send events twice.
func (s *Server) resumePosition(r *http.Request, j *core.Job, filter map[core.EventKind]bool) (after uint64, resumed bool, err error) {
	raw := r.Header.Get("Last-Event-ID")
	if raw == "" {
		raw = r.URL.Query().Get("last_event_id")
	}
	return s.resumes().Resume(r.Context(), j, raw, callerFingerprint(r), filter)
}

// callerFingerprint is who resume tokens are bound to: the identity
// authenticate found; without one (a handler used alone), the
// Authorization header's anonymous caller (auth.CallerOf).
func callerFingerprint(r *http.Request) [16]byte {
	return auth.CallerOf(r.Context(), r.Header.Get("Authorization"))
}

// parseFilter reads ?types=output,done.
func parseFilter(r *http.Request) (map[core.EventKind]bool, error) {
	raw := r.URL.Query().Get("types")
	if raw == "" {
		return nil, nil
	}
	return stream.ParseTypes(strings.Split(raw, ","))
}
