package grpcapi

import (
	"context"

	"google.golang.org/grpc/metadata"

	"github.com/switchyard/switchyard/auth"
	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/resume"
	"github.com/switchyard/switchyard/core/stream"
)

// The token, fingerprint and envelope rules live in core/stream, shared
// with httpapi, so tokens are interchangeable between the two transports.

// positions are this node's token rules, shared with SSE: a token from
// either transport resumes on the other.
func (s *JobServer) positions() stream.Positions {
	return stream.Positions{Keyring: s.cfg.Keyring, TTL: s.cfg.TokenTTL, Snapshot: s.e.Epoch()}
}

// token signs the position of the event seq for this caller and filter. A
// token that cannot be signed (never for ids this node makes) is sent as no
// token at all: the client then resumes from its previous one.
func (s *JobServer) token(j *core.Job, seq uint64, caller, filter [16]byte) string {
	tok, err := s.positions().Token(j, seq, caller, filter)
	if err != nil {
		s.log.WarnContext(j.WithTrace(context.Background()), "sign resume token", "job", j.ID, "err", err)
		return ""
	}
	return tok
}

// resumePosition verifies a Resume request's token and returns the position
// to continue after; an empty token means from the start, and resumed
// false: only a verified token is a resume, the one proof that the stream
// is the submitter's (it may then keep a Submit's job alive). Every refusal
// is the one identical core.ErrInvalidResumeToken; the reason is only
// logged and counted.
func (s *JobServer) resumePosition(ctx context.Context, j *core.Job, raw string, filter map[core.EventKind]bool) (after uint64, resumed bool, err error) {
	if raw == "" {
		return 0, false, nil
	}
	seq, err := s.positions().Verify(j, raw, callerFingerprint(ctx), filterFingerprint(filter))
	if err != nil {
		reason := string(resume.ReasonOf(err))
		s.m.Refused(reason)
		s.log.DebugContext(j.WithTrace(ctx), "resume refused", "job", j.ID, "reason", reason)
		return 0, false, core.ErrInvalidResumeToken
	}
	s.m.Resumed()
	return seq, true, nil
}

// callerFingerprint is who resume tokens are bound to: the identity the
// guard found (its subject, or on a node without keys the credential
// presented); without one (a service used alone), the "authorization"
// metadata, as on a node without keys.
func callerFingerprint(ctx context.Context) [16]byte {
	if id, ok := auth.Lookup(ctx); ok {
		return id.Caller()
	}
	var credential string
	if v := metadata.ValueFromIncomingContext(ctx, "authorization"); len(v) > 0 {
		credential = v[0]
	}
	return stream.CallerFingerprint(credential)
}

func filterFingerprint(filter map[core.EventKind]bool) [16]byte {
	return stream.FilterFingerprint(filter)
}

func parseTypes(types []string) (map[core.EventKind]bool, error) { return stream.ParseTypes(types) }

func eventData(j *core.Job, ev core.Event, snap uint64) []byte { return stream.EventData(j, ev, snap) }
