package httpapi

import (
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/resume"
)

// CodeInvalidResumeToken is the one answer to every resume token that does
// not verify, whatever the reason: a caller probing tokens learns nothing
// from the response. The reason is logged and counted internally.
const CodeInvalidResumeToken core.Code = "invalid_resume_token"

// token signs the position of the event seq for this caller and filter.
// A token that cannot be signed (never for ids this node makes) is sent as
// no id at all: the client then resumes from its previous id.
func (s *Server) token(j *core.Job, seq uint64, caller, filter [16]byte) string {
	tok, err := s.cfg.Keyring.Sign(resume.Position{
		Stream: j.ID, Generation: j.StreamGeneration(), Seq: seq, Snapshot: s.e.Epoch(),
		Caller: caller, Filter: filter,
	}, time.Now(), s.cfg.TokenTTL)
	if err != nil {
		s.log.Warn("sign resume token", "job", j.ID, "err", err)
		return ""
	}
	return tok
}

// resumePosition reads the position a GET stream resumes from: the
// Last-Event-ID header (what EventSource sends by itself) or the
// last_event_id query parameter. No token means from the start.
func (s *Server) resumePosition(r *http.Request, j *core.Job, filter map[core.EventKind]bool) (uint64, error) {
	raw := r.Header.Get("Last-Event-ID")
	if q := r.URL.Query().Get("last_event_id"); q != "" {
		raw = q
	}
	if raw == "" {
		return 0, nil
	}
	pos, err := s.cfg.Keyring.Verify(raw, time.Now(), resume.Expect{
		Stream: j.ID, Caller: callerFingerprint(r), Filter: filterFingerprint(filter),
	})
	if err == nil {
		err = pos.Check(j.StreamGeneration(), s.e.Epoch())
	}
	if err == nil && pos.Seq > j.History.Head() {
		// Signed by us but ahead of the history: only possible across an
		// epoch we failed to notice. Refuse rather than skip.
		err = &resume.InvalidError{Reason: "ahead_of_history"}
	}
	if err != nil {
		reason := string(resume.ReasonOf(err))
		s.m.resumesRefused.WithLabelValues(reason).Inc()
		s.log.Debug("resume refused", "job", j.ID, "reason", reason)
		return 0, errInvalidResumeToken
	}
	s.m.resumesAccepted.Inc()
	return pos.Seq, nil
}

var errInvalidResumeToken = &core.Error{Code: CodeInvalidResumeToken, Detail: "the resume token is not valid for this stream"}

// callerFingerprint identifies who a token is issued to. Until the node
// authenticates callers, the caller is whatever Authorization they present
// (hashed; possibly none): a token issued under one credential does not
// resume under another.
func callerFingerprint(r *http.Request) [16]byte {
	return resume.Fingerprint("authorization", r.Header.Get("Authorization"))
}

// filterFingerprint binds a token to the event types the stream was opened
// with, so a resume cannot widen or narrow what the positions refer to.
func filterFingerprint(filter map[core.EventKind]bool) [16]byte {
	if filter == nil {
		return resume.Fingerprint("types", "*")
	}
	parts := []string{"types"}
	for k := range filter {
		parts = append(parts, string(k))
	}
	slices.Sort(parts[1:])
	return resume.Fingerprint(parts...)
}

// parseFilter reads ?types=output,done. Unknown types are refused rather
// than ignored: a filter that silently matches nothing is a bug report.
func parseFilter(r *http.Request) (map[core.EventKind]bool, error) {
	raw := r.URL.Query().Get("types")
	if raw == "" {
		return nil, nil
	}
	f := map[core.EventKind]bool{}
	for _, t := range strings.Split(raw, ",") {
		k := core.EventKind(strings.TrimSpace(t))
		switch k {
		case core.EventAccepted, core.EventOutput, core.EventDone, core.EventError:
			f[k] = true
		default:
			return nil, &core.Error{Code: core.CodeInvalidField, Field: "types", Detail: "types is a comma-separated list of accepted, output, done, error"}
		}
	}
	return f, nil
}
