package jobapi

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/resume"
)

// The functions in this file are the gRPC side of rules httpapi applies to
// SSE (httpapi/resume.go and httpapi/sse.go). Tokens are interchangeable
// between the two transports only while these stay byte-for-byte in step:
// the same Position, the same caller and filter fingerprints, the same
// event data. They are copies until they move to a shared package.

// token signs the position of the event seq for this caller and filter. A
// token that cannot be signed (never for ids this node makes) is sent as no
// token at all: the client then resumes from its previous one.
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

// resumePosition verifies a Resume request's token and returns the position
// to continue after; an empty token means from the start. Every refusal is
// the one identical invalid_resume_token status; the reason is only logged
// and counted.
func (s *Server) resumePosition(ctx context.Context, j *core.Job, raw string, filter map[core.EventKind]bool) (uint64, error) {
	if raw == "" {
		return 0, nil
	}
	pos, err := s.cfg.Keyring.Verify(raw, time.Now(), resume.Expect{
		Stream: j.ID, Caller: callerFingerprint(ctx), Filter: filterFingerprint(filter),
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
		return 0, invalidResumeToken()
	}
	s.m.resumesAccepted.Inc()
	return pos.Seq, nil
}

// callerFingerprint identifies who a token is issued to: whatever
// "authorization" metadata the caller presents (hashed; possibly none), as
// httpapi does with the Authorization header — so a token issued to one
// credential does not resume under another, on either transport.
func callerFingerprint(ctx context.Context) [16]byte {
	var auth string
	if v := metadata.ValueFromIncomingContext(ctx, "authorization"); len(v) > 0 {
		auth = v[0]
	}
	return resume.Fingerprint("authorization", auth)
}

// filterFingerprint binds a token to the event types the stream was opened
// with, so a resume cannot widen or narrow what the positions refer to.
// Identical to httpapi's.
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

// parseTypes reads ResumeRequest.types. No types means every event. Unknown
// types are refused rather than ignored, as on HTTP: a filter that silently
// matches nothing is a bug report.
func parseTypes(types []string) (map[core.EventKind]bool, error) {
	if len(types) == 0 {
		return nil, nil
	}
	f := map[core.EventKind]bool{}
	for _, t := range types {
		k := core.EventKind(strings.TrimSpace(t))
		switch k {
		case core.EventAccepted, core.EventOutput, core.EventDone, core.EventError:
			f[k] = true
		default:
			return nil, &core.Error{Code: core.CodeInvalidField, Field: "types", Detail: "types is a list of accepted, output, done, error"}
		}
	}
	return f, nil
}

// eventData is the JSON data of an event, byte for byte what the SSE event
// carries: the stream envelope (job id, stream generation, sequence,
// snapshot version, and the attempt — the binding generation that produced
// it) followed by the event's own fields.
func eventData(j *core.Job, ev core.Event, snap uint64) []byte {
	var b bytes.Buffer
	b.Grow(len(ev.Data) + 96)
	b.WriteString(`{"job_id":`)
	b.Write(mustJSON(j.ID))
	b.WriteString(`,"gen":`)
	b.WriteString(strconv.FormatUint(j.StreamGeneration(), 10))
	b.WriteString(`,"seq":`)
	b.WriteString(strconv.FormatUint(ev.Seq, 10))
	b.WriteString(`,"snap":`)
	b.WriteString(strconv.FormatUint(snap, 10))
	b.WriteString(`,"attempt":`)
	b.WriteString(strconv.FormatUint(ev.Gen, 10))
	// An object with no fields ("{}", "{ }") adds nothing: writing its
	// closing brace after a comma would not be JSON.
	if inner := bytes.TrimSpace(ev.Data); len(inner) > 2 && len(bytes.TrimSpace(inner[1:len(inner)-1])) > 0 {
		b.WriteByte(',')
		b.Write(inner[1:])
	} else {
		b.WriteByte('}')
	}
	return b.Bytes()
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic("jobapi: marshal: " + err.Error())
	}
	return b
}
