package stream

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/resume"
)

// This file holds what every transport of a job stream must do byte for
// byte the same, so that a resume token from one (an SSE id) resumes on
// another (a gRPC Resume): the event envelope, the fingerprints and the
// token rules.

// EventData is the JSON data of a job event: the stream envelope (job id,
// the stream generation the event belongs to, sequence, snapshot version,
// and the attempt — the binding generation that produced it) followed by
// the event's own fields.
func EventData(j *core.Job, ev core.Event, snap uint64) []byte {
	return AppendEventData(make([]byte, 0, len(ev.Data)+96), j, ev, snap)
}

// AppendEventData appends EventData to dst: a transport that writes the
// data out at once builds it in a buffer it reuses, without reflection or
// an allocation per event.
func AppendEventData(dst []byte, j *core.Job, ev core.Event, snap uint64) []byte {
	dst = append(dst, `{"job_id":`...)
	dst = appendJSONString(dst, j.ID)
	dst = append(dst, `,"gen":`...)
	dst = strconv.AppendUint(dst, ev.Stream, 10)
	dst = append(dst, `,"seq":`...)
	dst = strconv.AppendUint(dst, ev.Seq, 10)
	dst = append(dst, `,"snap":`...)
	dst = strconv.AppendUint(dst, snap, 10)
	dst = append(dst, `,"attempt":`...)
	dst = strconv.AppendUint(dst, ev.Gen, 10)
	// An object with no fields ("{}", "{ }") adds nothing: writing its
	// closing brace after a comma would not be JSON.
	if inner := bytes.TrimSpace(ev.Data); len(inner) > 2 && len(bytes.TrimSpace(inner[1:len(inner)-1])) > 0 {
		dst = append(dst, ',')
		dst = append(dst, inner[1:]...)
	} else {
		dst = append(dst, '}')
	}
	return dst
}

// appendJSONString appends s as a JSON string. Job ids are of a plain
// alphabet, for which this is a copy between quotes; anything else goes
// through encoding/json, whose escaping it then matches.
func appendJSONString(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			b, _ := json.Marshal(s)
			return append(dst, b...)
		}
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"')
}

// ControlData is the JSON data of a control event (gap, resync,
// terminated), the same on every transport. Run builds the maps from
// numbers and strings only, so marshalling cannot fail.
func ControlData(data map[string]any) []byte {
	b, err := json.Marshal(data)
	if err != nil {
		panic("stream: marshal control data: " + err.Error())
	}
	return b
}

// CallerFingerprint identifies who a token is issued to. Until nodes
// authenticate callers, the caller is whatever credential they present
// (the Authorization header, or "authorization" gRPC metadata; possibly
// none), hashed: a token issued under one credential does not resume under
// another, on any transport.
func CallerFingerprint(credential string) [16]byte {
	return resume.Fingerprint("authorization", credential)
}

// FilterFingerprint binds a token to the event types a stream was opened
// with, so a resume cannot widen or narrow what its positions refer to.
func FilterFingerprint(filter map[core.EventKind]bool) [16]byte {
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

// ParseTypes reads a stream's event-type filter. None means every event.
// Unknown types are refused rather than ignored: a filter that silently
// matches nothing is a bug report.
func ParseTypes(types []string) (map[core.EventKind]bool, error) {
	if len(types) == 0 {
		return nil, nil
	}
	f := map[core.EventKind]bool{}
	for _, t := range types {
		k := core.EventKind(strings.TrimSpace(t))
		switch k {
		case core.EventAccepted, core.EventOutput, core.EventRestart, core.EventDone, core.EventError:
			f[k] = true
		default:
			return nil, &core.Error{Code: core.CodeInvalidField, Field: "types", Detail: "types is a list of accepted, output, restart, done, error"}
		}
	}
	return f, nil
}

// Positions signs and verifies the resume tokens of one node's job streams.
type Positions struct {
	Keyring *resume.Keyring
	TTL     time.Duration
	// Snapshot is the snapshot version of every history on this node.
	Snapshot uint64
}

// Token signs the position of the event seq of j for this caller and filter.
func (p Positions) Token(j *core.Job, seq uint64, caller, filter [16]byte) (string, error) {
	return p.Keyring.Sign(resume.Position{
		Stream: j.ID, Generation: j.History.GenerationOf(seq), Seq: seq, Snapshot: p.Snapshot,
		Caller: caller, Filter: filter,
	}, time.Now(), p.TTL)
}

// Signer signs the tokens of one stream of j for this caller and filter:
// its AppendSign(dst, ev.Stream, ev.Seq, now) is Token's for the event
// (ev.Stream is the generation History.GenerationOf(ev.Seq) names),
// appended to dst. It fails as Token does on what is the same for every
// event of the stream: a job id too long to sign, a bad TTL.
func (p Positions) Signer(j *core.Job, caller, filter [16]byte) (resume.Signer, error) {
	return p.Keyring.Signer(j.ID, p.Snapshot, caller, filter, p.TTL)
}

// Verify returns the position a token resumes after. A token names one
// event, (generation, seq): sequence numbers go on across a job's
// restarts, so a token from an earlier stream generation resumes exactly
// after its event (the rest of that generation, the restart event, then
// the new one), and is refused only if its seq is not in its generation.
// Every failure matches
// resume.ErrInvalidToken and carries an internal reason (resume.ReasonOf)
// for logs and counters; transports answer all of them identically.
func (p Positions) Verify(j *core.Job, raw string, caller, filter [16]byte) (uint64, error) {
	pos, err := p.Keyring.Verify(raw, time.Now(), resume.Expect{Stream: j.ID, Caller: caller, Filter: filter})
	if err == nil {
		err = pos.Check(j.History.GenerationOf(pos.Seq), p.Snapshot)
	}
	if err == nil && pos.Seq > j.History.Head() {
		// Signed by us but ahead of the history: only possible across a
		// snapshot we failed to notice. Refuse rather than skip.
		err = &resume.InvalidError{Reason: "ahead_of_history"}
	}
	if err != nil {
		return 0, err
	}
	return pos.Seq, nil
}
