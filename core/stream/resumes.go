package stream

import (
	"context"
	"log/slog"
	"time"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/resume"
)

// Resumes are one door's resume tokens: the node's rules (Positions) with
// the door's metrics and log. Every door signs with the node's keyring, so
// a token from one transport resumes on the other; only where the token
// and the caller come from (a header, a query parameter, gRPC metadata)
// is the door's own.
type Resumes struct {
	Keyring *resume.Keyring
	TTL     time.Duration
	// Snapshot is the snapshot version of every history on this node
	// (core.Engine.Epoch).
	Snapshot func() uint64
	Metrics  *TransportMetrics
	Log      *slog.Logger
}

func (r Resumes) positions() Positions {
	return Positions{Keyring: r.Keyring, TTL: r.TTL, Snapshot: r.Snapshot()}
}

// Signer returns what signs the resume tokens of one stream of j for
// this caller and filter (Request.Token): what is the same for every
// event (the keyring's key, the snapshot version, the checks on the job
// id and the ttl) is looked up and checked once, here, and each token is
// appended to the writer's buffer, with no allocation. The snapshot
// version is read once, as the transports read it once for their
// envelopes. A stream whose tokens cannot be signed (never for ids this
// node makes) is logged and sent without ids: the client then resumes
// from its previous token.
func (r Resumes) Signer(j *core.Job, caller, filter [16]byte) func(dst []byte, ev core.Event, now time.Time) []byte {
	s, err := r.positions().Signer(j, caller, filter)
	if err != nil {
		r.Log.WarnContext(j.WithTrace(context.Background()), "sign resume tokens", "job", j.ID, "err", err)
		return nil
	}
	return func(dst []byte, ev core.Event, now time.Time) []byte {
		tok, err := s.AppendSign(dst, ev.Stream, ev.Seq, now)
		if err != nil {
			r.Log.WarnContext(j.WithTrace(context.Background()), "sign resume token", "job", j.ID, "err", err)
		}
		return tok
	}
}

// Resume verifies a token and returns the position to continue after; an
// empty token means from the start, and resumed false: only a verified
// token is a resume, the one proof that the stream is the submitter's (it
// may then keep a streamed job alive). Every refusal is the one identical
// core.ErrInvalidResumeToken; the reason is only logged and counted.
func (r Resumes) Resume(ctx context.Context, j *core.Job, raw string, caller [16]byte, filter map[core.EventKind]bool) (after uint64, resumed bool, err error) {
	if raw == "" {
		return 0, false, nil
	}
	seq, err := r.positions().Verify(j, raw, caller, FilterFingerprint(filter))
	if err != nil {
		reason := string(resume.ReasonOf(err))
		r.Metrics.Refused(reason)
		r.Log.DebugContext(j.WithTrace(ctx), "resume refused", "job", j.ID, "reason", reason)
		return 0, false, core.ErrInvalidResumeToken
	}
	r.Metrics.Resumed()
	return seq, true, nil
}
