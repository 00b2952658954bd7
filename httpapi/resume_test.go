package httpapi

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/switchyard/switchyard/apierr"
	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/resume"
	"github.com/switchyard/switchyard/core/stream"
)

// resumeFixture is one server, one job and the one request identity the
// fuzzer resumes as; valid records every token the server signed for that
// job, caller and filter, with its seq.
type resumeFixture struct {
	s      *Server
	j      *core.Job
	filter map[core.EventKind]bool

	mu    sync.Mutex
	valid map[string]uint64
}

const (
	fuzzJobID  = "j_resume"
	fuzzCaller = "Bearer alice"
)

func newResumeFixture(tb testing.TB) *resumeFixture {
	tb.Helper()
	fx := &resumeFixture{
		s:      newTestServer(tb),
		j:      &core.Job{ID: fuzzJobID, History: core.NewHistory(100, 1<<20)},
		filter: map[core.EventKind]bool{core.EventOutput: true, core.EventDone: true},
		valid:  map[string]uint64{},
	}
	fx.j.History.Append(core.EventAccepted, 0, []byte(`{"queue":"q"}`))
	for range 4 {
		fx.j.History.Append(core.EventOutput, 1, []byte(`{"data":1}`))
	}
	return fx
}

func (fx *resumeFixture) request(raw string, viaQuery bool) *http.Request {
	r := httptest.NewRequest("GET", "/v1/jobs/"+fuzzJobID+"/events?types=done,output", nil)
	r.Header.Set("Authorization", fuzzCaller)
	if viaQuery {
		q := r.URL.Query()
		q.Set("last_event_id", raw)
		r.URL.RawQuery = q.Encode()
	} else {
		r.Header.Set("Last-Event-ID", raw)
	}
	return r
}

// sign returns a token for seq as the server signs it for a request with
// the given Authorization and filter.
func (fx *resumeFixture) sign(seq uint64, authorization string, filter map[core.EventKind]bool) string {
	sign := fx.s.resumes().Signer(fx.j, resume.Fingerprint("authorization", authorization), stream.FilterFingerprint(filter))
	if sign == nil {
		return ""
	}
	return string(sign(nil, core.Event{Seq: seq, Stream: fx.j.History.GenerationOf(seq)}, time.Now()))
}

// position signs p with the server's own keyring, for positions s.token
// cannot make (another snapshot, generation or clock).
func (fx *resumeFixture) position(tb testing.TB, p resume.Position, now time.Time) string {
	tb.Helper()
	p.Caller = resume.Fingerprint("authorization", fuzzCaller)
	p.Filter = stream.FilterFingerprint(fx.filter)
	tok, err := fx.s.cfg.Keyring.Sign(p, now, time.Hour)
	if err != nil {
		tb.Fatalf("Sign: %v", err)
	}
	return tok
}

// Resume modes: how the fuzzer's candidate token is made.
const (
	modeRaw          = iota // the fuzzer's bytes as they are
	modeValid               // signed by the server for this job, caller and filter
	modeOtherJob            // signed for another job
	modeOtherCaller         // signed for another Authorization
	modeOtherFilter         // signed for another filter
	modeOtherKeySame        // signed by another node's key with the same key id
	modeOtherKeyID          // signed by a key id this node does not have
	modeOtherSnap           // signed in another epoch (a restart)
	modeOtherGen            // signed for another stream generation
	modeExpired             // expired
	modeFuture              // issued in the future
	numModes
)

func (fx *resumeFixture) candidate(tb testing.TB, mode uint8, raw string, seq uint64) string {
	tb.Helper()
	s, j := fx.s, fx.j
	pos := resume.Position{Stream: j.ID, Generation: j.StreamGeneration(), Seq: seq, Snapshot: s.e.Epoch()}
	other := func(kid string) string {
		ring, err := resume.NewKeyring(kid, resume.GenerateKey(kid))
		if err != nil {
			tb.Fatal(err)
		}
		p := pos
		p.Caller = resume.Fingerprint("authorization", fuzzCaller)
		p.Filter = stream.FilterFingerprint(fx.filter)
		tok, err := ring.Sign(p, time.Now(), time.Hour)
		if err != nil {
			tb.Fatal(err)
		}
		return tok
	}
	switch mode % numModes {
	case modeValid:
		tok := fx.sign(seq, fuzzCaller, fx.filter)
		if seq <= j.History.Head() {
			fx.mu.Lock()
			fx.valid[tok] = seq
			fx.mu.Unlock()
		}
		return tok
	case modeOtherJob:
		p := pos
		p.Stream = "j_other"
		return fx.position(tb, p, time.Now())
	case modeOtherCaller:
		return fx.sign(seq, "Bearer mallory", fx.filter)
	case modeOtherFilter:
		if seq%2 == 0 {
			return fx.sign(seq, fuzzCaller, nil)
		}
		return fx.sign(seq, fuzzCaller, map[core.EventKind]bool{core.EventOutput: true})
	case modeOtherKeySame:
		return other(s.cfg.Keyring.SigningKeyID())
	case modeOtherKeyID:
		return other("k9")
	case modeOtherSnap:
		p := pos
		p.Snapshot++
		return fx.position(tb, p, time.Now())
	case modeOtherGen:
		p := pos
		p.Generation++
		return fx.position(tb, p, time.Now())
	case modeExpired:
		return fx.position(tb, pos, time.Now().Add(-2*time.Hour))
	case modeFuture:
		return fx.position(tb, pos, time.Now().Add(2*time.Hour))
	}
	return raw
}

// problemBytes renders an error as the client would receive it.
func problemBytes(err error) []byte {
	var ce *core.Error
	if !errors.As(err, &ce) {
		return nil
	}
	rec := httptest.NewRecorder()
	apierr.WriteProblem(rec, httptest.NewRequest("GET", "/v1/jobs/whatever/events", nil), ce)
	return append([]byte(rec.Result().Status+"\n"), rec.Body.Bytes()...)
}

// FuzzLastEventID drives Server.resumePosition with fuzzed, signed and
// mutated Last-Event-ID values. It must never panic; it may succeed only
// for a token the server itself signed for this job, caller and filter
// (returning that token's seq, as a resume), or for no token at all (from
// the start, not a resume: such a stream may not own the job); every other
// answer is the one identical invalid_resume_token error.
func FuzzLastEventID(f *testing.F) {
	fx := newResumeFixture(f)
	refused := problemBytes(core.ErrInvalidResumeToken)

	f.Add("", uint8(modeRaw), uint64(0), -1, byte(0), false)
	f.Add("k0.AAAA.BBBB", uint8(modeRaw), uint64(0), -1, byte(0), false)
	f.Add("j_resume/3", uint8(modeRaw), uint64(3), -1, byte(0), true)
	f.Add("", uint8(modeValid), uint64(3), -1, byte(0), false)
	f.Add("", uint8(modeValid), uint64(0), -1, byte(0), true)
	f.Add("", uint8(modeValid), uint64(9), -1, byte(0), false) // ahead of the history
	f.Add("", uint8(modeValid), uint64(2), 5, byte('A'), false)
	f.Add("", uint8(modeValid), uint64(2), 100, byte('\n'), true)
	for m := modeOtherJob; m < numModes; m++ {
		f.Add("", uint8(m), uint64(2), -1, byte(0), m%2 == 0)
	}
	f.Fuzz(func(t *testing.T, raw string, mode uint8, seq uint64, at int, b byte, viaQuery bool) {
		cand := fx.candidate(t, mode, raw, seq)
		if at >= 0 && len(cand) > 0 {
			i := at % len(cand)
			cand = cand[:i] + string([]byte{b}) + cand[i+1:]
		}
		r := fx.request(cand, viaQuery)
		got, resumed, err := fx.s.resumePosition(r, fx.j, fx.filter)

		fx.mu.Lock()
		wantSeq, isValid := fx.valid[cand]
		fx.mu.Unlock()
		switch {
		case cand == "":
			if err != nil || got != 0 || resumed {
				t.Fatalf("no token: (%d, %v, %v), want (0, false, nil)", got, resumed, err)
			}
		case err == nil:
			if !isValid {
				t.Fatalf("resumePosition accepted %q (seq %d): not a token the server signed for this job, caller and filter", cand, got)
			}
			if got != wantSeq || !resumed {
				t.Fatalf("resumePosition(%q) = (%d, %v), want the signed seq %d as a resume", cand, got, resumed, wantSeq)
			}
		default:
			if isValid {
				t.Fatalf("resumePosition refused its own token %q: %v", cand, err)
			}
			if err != core.ErrInvalidResumeToken {
				t.Fatalf("refusal %#v is not the one invalid_resume_token error", err)
			}
			if got != 0 || resumed {
				t.Fatalf("refusal returned seq %d, resumed %v", got, resumed)
			}
			if pb := problemBytes(err); !bytes.Equal(pb, refused) {
				t.Fatalf("refusal renders as %q, want the identical %q", pb, refused)
			}
		}
	})
}

func TestResumePositionModes(t *testing.T) {
	fx := newResumeFixture(t)
	for m := uint8(modeRaw); m < numModes; m++ {
		for _, viaQuery := range []bool{false, true} {
			cand := fx.candidate(t, m, "garbage", 3)
			got, resumed, err := fx.s.resumePosition(fx.request(cand, viaQuery), fx.j, fx.filter)
			if m == modeValid {
				if err != nil || got != 3 || !resumed {
					t.Errorf("mode %d query=%v: (%d, %v, %v), want (3, true, nil)", m, viaQuery, got, resumed, err)
				}
				continue
			}
			if err != core.ErrInvalidResumeToken || resumed {
				t.Errorf("mode %d query=%v: err %v, resumed %v, want invalid_resume_token", m, viaQuery, err, resumed)
			}
		}
	}
	// No token: from the start, and not a resume (the stream only watches).
	if got, resumed, err := fx.s.resumePosition(fx.request("", false), fx.j, fx.filter); err != nil || got != 0 || resumed {
		t.Errorf("no token: (%d, %v, %v), want (0, false, nil)", got, resumed, err)
	}
	// The header wins over the query parameter: an EventSource opened with
	// ?last_event_id= reconnects with that URL and its newer position in the
	// header.
	r := fx.request(fx.candidate(t, modeValid, "", 4), false)
	q := r.URL.Query()
	q.Set("last_event_id", fx.candidate(t, modeValid, "", 2))
	r.URL.RawQuery = q.Encode()
	if got, _, err := fx.s.resumePosition(r, fx.j, fx.filter); err != nil || got != 4 {
		t.Errorf("query 2, header 4: (%d, %v), want (4, nil)", got, err)
	}
	// Whichever carries it, a bad token is refused, even with a good one in
	// the other place: the header is read alone.
	r = fx.request("garbage", false)
	q = r.URL.Query()
	q.Set("last_event_id", fx.candidate(t, modeValid, "", 2))
	r.URL.RawQuery = q.Encode()
	if _, resumed, err := fx.s.resumePosition(r, fx.j, fx.filter); err != core.ErrInvalidResumeToken || resumed {
		t.Errorf("query good, header garbage: %v, want invalid_resume_token", err)
	}
	// A token is bound to the filter as a set, not to the order in the URL.
	tok := fx.candidate(t, modeValid, "", 1)
	same := map[core.EventKind]bool{core.EventDone: true, core.EventOutput: true}
	if got, _, err := fx.s.resumePosition(fx.request(tok, false), fx.j, same); err != nil || got != 1 {
		t.Errorf("same filter built in another order: (%d, %v)", got, err)
	}
	// Ahead of the history: signed by us, still refused.
	ahead := fx.sign(fx.j.History.Head()+1, fuzzCaller, fx.filter)
	if _, resumed, err := fx.s.resumePosition(fx.request(ahead, false), fx.j, fx.filter); err != core.ErrInvalidResumeToken || resumed {
		t.Errorf("token ahead of the history: %v, want invalid_resume_token", err)
	}
}

func TestParseFilter(t *testing.T) {
	tests := []struct {
		query string
		want  []core.EventKind // nil: no filter
		bad   bool
	}{
		{"", nil, false},
		{"types=output", []core.EventKind{core.EventOutput}, false},
		{"types=output,%20done", []core.EventKind{core.EventOutput, core.EventDone}, false},
		{"types=accepted,output,done,error", kinds, false},
		{"types=output,bogus", nil, true},
		{"types=,", nil, true},
		{"types=OUTPUT", nil, true},
	}
	for _, tt := range tests {
		f, err := parseFilter(httptest.NewRequest("GET", "/v1/jobs/j/events?"+tt.query, nil))
		if tt.bad {
			var ce *core.Error
			if !errors.As(err, &ce) || ce.Code != core.CodeInvalidField || ce.Field != "types" {
				t.Errorf("%q: err %v, want invalid_field on types", tt.query, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tt.query, err)
			continue
		}
		if tt.want == nil {
			if f != nil {
				t.Errorf("%q: filter %v, want none", tt.query, f)
			}
			continue
		}
		if len(f) != len(tt.want) {
			t.Errorf("%q: filter %v, want %v", tt.query, f, tt.want)
		}
		for _, k := range tt.want {
			if !f[k] {
				t.Errorf("%q: filter %v lacks %s", tt.query, f, k)
			}
		}
	}
	// The fingerprint depends on the set, not on the order it was asked in.
	a, _ := parseFilter(httptest.NewRequest("GET", "/x?types=done,output", nil))
	b, _ := parseFilter(httptest.NewRequest("GET", "/x?types=output,done,output", nil))
	if stream.FilterFingerprint(a) != stream.FilterFingerprint(b) || stream.FilterFingerprint(a) == stream.FilterFingerprint(nil) {
		t.Errorf("filter fingerprints do not follow the set")
	}
}
