package httpapi

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	sse "github.com/tmaxmax/go-sse"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/resume"
	"github.com/switchyard/switchyard/core/stream"
)

// envelopeKeys are the fields eventData puts before an event's own. No
// event the engine appends uses them (its payloads are fixed maps: queue,
// ttl_ms, data, outcome, result, code, detail), so the fuzzer does not
// either: a collision would be a duplicate JSON key.
var envelopeKeys = map[string]bool{"job_id": true, "gen": true, "seq": true, "snap": true, "attempt": true}

func newRecorderSink(j *core.Job, snap uint64) (*sseSink, *httptest.ResponseRecorder) {
	rec := httptest.NewRecorder()
	return &sseSink{sseConn: sseConn{w: rec, rc: http.NewResponseController(rec)}, job: j, snap: snap, retryHint: time.Second}, rec
}

// readAll parses an SSE byte stream the way a client does.
func readAll(t *testing.T, out string) []sse.Event {
	t.Helper()
	var evs []sse.Event
	for ev, err := range sse.Read(strings.NewReader(out), &sse.ReadConfig{MaxEventSize: len(out) + 1024}) {
		if err != nil {
			t.Fatalf("sse.Read(%q): %v", out, err)
		}
		evs = append(evs, ev)
	}
	return evs
}

// checkFieldLines asserts the wire form of one message: "field: value"
// lines, one blank line at the end, no CR anywhere (a CR would end an id: or
// event: line early for a client), at most one id: line, exactly one event:
// line and one data: line (the data is compact JSON: one line).
func checkFieldLines(t *testing.T, out string, wantID bool) {
	t.Helper()
	if strings.ContainsRune(out, '\r') {
		t.Fatalf("CR in the output: %q", out)
	}
	if !strings.HasSuffix(out, "\n\n") {
		t.Fatalf("message does not end with a blank line: %q", out)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n\n"), "\n")
	count := map[string]int{}
	for _, l := range lines {
		name, _, ok := strings.Cut(l, ": ")
		if !ok || (name != "id" && name != "event" && name != "data" && l != "retry: 1000") {
			t.Fatalf("unexpected line %q in %q", l, out)
		}
		count[name]++
	}
	// Every stream's first message carries the reconnect hint, once.
	if count["retry"] != 1 {
		t.Fatalf("retry lines %d in the first message %q, want 1", count["retry"], out)
	}
	ids := 0
	if wantID {
		ids = 1
	}
	if count["id"] != ids || count["event"] != 1 || count["data"] != 1 {
		t.Fatalf("field lines %v in %q, want id:%d event:1 data:1", count, out, ids)
	}
}

// decodeObject unmarshals a JSON object keeping numbers exact.
func decodeObject(t *testing.T, b []byte) map[string]any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		t.Fatalf("not a JSON object: %v: %q", err, b)
	}
	if d.More() {
		t.Fatalf("trailing data after the JSON object: %q", b)
	}
	return m
}

func FuzzSSEEncoder(f *testing.F) {
	ring, err := resume.NewKeyring("k0", resume.GenerateKey("k0"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(uint8(1), "j_01", "", false, "", "hello", uint64(2), uint64(1), uint64(1))
	f.Add(uint8(0), "j_01", "k0.abc.def", false, "queue", "default", uint64(1), uint64(0), uint64(7))
	f.Add(uint8(1), "j_01", "", true, "data", "line1\nline2\r\nline3\rend", uint64(3), uint64(2), uint64(1))
	f.Add(uint8(2), "j\n\"x", "", true, "result", "data: injected\n\nevent: done\nid: 99", uint64(9), uint64(4), uint64(5))
	f.Add(uint8(3), "j_01", " leading space", false, "detail", "ünïcödé \u2028 \u2029 \x00 \xff", uint64(1<<63), uint64(1<<64-1), uint64(1<<64-1))
	f.Add(uint8(1), "j_01", "tok:with:colons", false, "", "", uint64(4), uint64(1), uint64(0))
	f.Fuzz(func(t *testing.T, kindIdx uint8, jobID, token string, signed bool, key, val string, seq, attempt, snap uint64) {
		kind := kinds[int(kindIdx)%len(kinds)]
		j := &core.Job{ID: jobID, History: core.NewHistory(1, 1<<20)}
		if signed {
			stream := jobID
			if len(stream) == 0 || len(stream) > resume.MaxStreamLen {
				stream = "j_fuzz"
			}
			tok, err := ring.Sign(resume.Position{
				Stream: stream, Generation: j.StreamGeneration(), Seq: seq, Snapshot: snap,
				Caller: resume.Fingerprint("authorization", val), Filter: resume.Fingerprint("types", "*"),
			}, time.Now(), time.Hour)
			if err != nil {
				t.Fatalf("Sign: %v", err)
			}
			if strings.ContainsAny(tok, "\r\n\x00") {
				t.Fatalf("a signed token is not a valid SSE id: %q", tok)
			}
			token = tok
		} else if _, err := sse.NewID(token); err != nil || strings.IndexByte(token, 0) >= 0 {
			// Not an id go-sse will write (CR or LF), or one an EventSource
			// ignores (NUL): never a token this node makes.
			t.Skip()
		}

		payload := map[string]any{}
		if key != "" || val != "" {
			payload["data"] = val
			if key != "" && !envelopeKeys[key] {
				payload[key] = val
				payload[key+"_n"] = []any{val, seq, map[string]any{"nested": key}}
			}
		}
		data, err := json.Marshal(payload)
		if err != nil {
			t.Fatalf("json.Marshal: %v", err)
		}
		ev := core.Event{Seq: seq, Kind: kind, Gen: attempt, Stream: j.StreamGeneration(), Data: data}

		sink, rec := newRecorderSink(j, snap)
		if err := sink.Event(ev, []byte(token)); err != nil {
			t.Fatalf("Event: %v", err)
		}
		out := rec.Body.String()
		checkFieldLines(t, out, token != "")

		evs := readAll(t, out)
		if len(evs) != 1 {
			t.Fatalf("%d events parsed from %q, want 1", len(evs), out)
		}
		got := evs[0]
		if got.Type != string(kind) {
			t.Errorf("type %q, want %q", got.Type, kind)
		}
		if got.LastEventID != token {
			t.Errorf("id %q, want %q", got.LastEventID, token)
		}
		want := stream.EventData(j, ev, snap)
		if got.Data != string(want) {
			t.Fatalf("data %q, want eventData %q", got.Data, want)
		}

		// The client sees the envelope and then every original field.
		m := decodeObject(t, []byte(got.Data))
		var wantJobID any
		quoted, _ := json.Marshal(jobID)
		_ = json.Unmarshal(quoted, &wantJobID) // invalid UTF-8 comes back as U+FFFD
		if m["job_id"] != wantJobID {
			t.Errorf("job_id %q, want %q", m["job_id"], wantJobID)
		}
		for k, v := range map[string]uint64{"gen": j.StreamGeneration(), "seq": seq, "snap": snap, "attempt": attempt} {
			if n, ok := m[k].(json.Number); !ok || n.String() != strconv.FormatUint(v, 10) {
				t.Errorf("%s = %v, want %d", k, m[k], v)
			}
		}
		orig := decodeObject(t, data)
		for k, v := range orig {
			gotV, _ := json.Marshal(m[k])
			wantV, _ := json.Marshal(v)
			if !bytes.Equal(gotV, wantV) {
				t.Errorf("field %q = %s, want %s", k, gotV, wantV)
			}
		}
		if len(m) != len(orig)+len(envelopeKeys) {
			t.Errorf("%d fields, want %d envelope + %d original: %s", len(m), len(envelopeKeys), len(orig), got.Data)
		}
	})
}

func TestSSESinkControlAndHeartbeat(t *testing.T) {
	j := &core.Job{ID: "j_ctl", History: core.NewHistory(1, 1<<20)}
	sink, rec := newRecorderSink(j, 1)
	if err := sink.Control(stream.Terminated, map[string]any{
		"job_id": j.ID, "reason": "idle", "resume_after_seq": uint64(4),
		"detail": "multi\nline\r\ndetail",
	}); err != nil {
		t.Fatalf("Control: %v", err)
	}
	out := rec.Body.String()
	checkFieldLines(t, out, false)
	evs := readAll(t, out)
	if len(evs) != 1 || evs[0].Type != "terminated" || evs[0].LastEventID != "" {
		t.Fatalf("parsed %+v from %q, want one terminated event with no id", evs, out)
	}
	m := decodeObject(t, []byte(evs[0].Data))
	if m["reason"] != "idle" || m["detail"] != "multi\nline\r\ndetail" || m["resume_after_seq"].(json.Number).String() != "4" {
		t.Errorf("control data %v", m)
	}

	sink, rec = newRecorderSink(j, 1)
	if err := sink.Heartbeat(); err != nil {
		t.Fatalf("Heartbeat: %v", err)
	}
	out = rec.Body.String()
	if !strings.HasPrefix(out, ":") || strings.Contains(out, "data") {
		t.Errorf("heartbeat %q is not a bare comment", out)
	}
	if evs := readAll(t, out+"\n"); len(evs) != 0 {
		t.Errorf("a heartbeat parsed as %d events: it must never look like one", len(evs))
	}

	// An id on a control would move the client's resume position.
	sink, rec = newRecorderSink(j, 1)
	_ = sink.Event(core.Event{Seq: 1, Kind: core.EventOutput, Data: []byte(`{"data":1}`)}, []byte("tok-1"))
	_ = sink.Control(stream.Gap, map[string]any{"job_id": j.ID, "from_seq": 2, "to_seq": 3})
	evs = readAll(t, rec.Body.String())
	if len(evs) != 2 || evs[1].Type != "gap" || evs[1].LastEventID != "tok-1" {
		t.Fatalf("parsed %+v: the gap must keep the last event's id", evs)
	}
	if strings.Count(rec.Body.String(), "id: ") != 1 {
		t.Errorf("more than one id line: %q", rec.Body.String())
	}
}

func TestEventDataEmptyPayload(t *testing.T) {
	j := &core.Job{ID: "j_e", History: core.NewHistory(1, 1<<20)}
	for _, data := range []string{`{}`, ` {} `, ``, `{ }`, "{\n\t}", ` {"a":1} `} {
		b := stream.EventData(j, core.Event{Seq: 1, Kind: core.EventDone, Gen: 2, Data: []byte(data)}, 3)
		if !json.Valid(b) {
			t.Errorf("eventData with payload %q = %s: not JSON", data, b)
		}
	}
}

// Event writes, byte for byte, what the go-sse encoder writes for the same
// message: the retry hint on the first event only, no id line without a
// token.
func TestSSESinkEventMatchesEncoder(t *testing.T) {
	j := &core.Job{ID: "j_01", History: core.NewHistory(1, 1<<20)}
	for _, tc := range []struct {
		name  string
		token string
		data  string
	}{
		{"with token", "k0.AQEB_abc-def.xyz", `{"data":"hello"}`},
		{"no token", "", `{"data":"hello"}`},
		{"empty payload", "k0.t", `{}`},
		{"newline in data", "k0.t", "{\"data\":\n\"x\"}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sink, rec := newRecorderSink(j, 7)
			var want bytes.Buffer
			for i, retry := range []time.Duration{time.Second, 0} {
				ev := core.Event{Seq: uint64(i + 1), Kind: core.EventOutput, Gen: 1, Data: []byte(tc.data)}
				if err := sink.Event(ev, []byte(tc.token)); err != nil {
					t.Fatal(err)
				}
				m := &sse.Message{Type: sse.Type("output"), Retry: retry}
				if tc.token != "" {
					m.ID = sse.ID(tc.token)
				}
				m.AppendData(string(stream.EventData(j, ev, 7)))
				if _, err := m.WriteTo(&want); err != nil {
					t.Fatal(err)
				}
			}
			if got := rec.Body.String(); got != want.String() {
				t.Fatalf("wrote\n%q\nwant (go-sse)\n%q", got, want.String())
			}
		})
	}
}
