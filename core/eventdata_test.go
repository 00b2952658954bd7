package core

import (
	"bytes"
	"encoding/json"
	"testing"
)

// The engine's own events are encoded from structs; their bytes must stay
// those of a map of the same entries, which is what clients have seen.
func TestEventDataMatchesMaps(t *testing.T) {
	odd := "a<b>&c \"q\" \\ é \u2028\u2029 \x01"
	results := []json.RawMessage{
		json.RawMessage(`{"b": [1, 2.5e3, "<&>"],  "a": null}`),
		json.RawMessage(`"\u2028 ` + "\u2029" + ` é"`),
		json.RawMessage(`  true `),
	}
	for _, c := range []struct {
		name string
		got  any
		want map[string]any
	}{
		{"accepted", acceptedData{Queue: "demo", TraceID: "0af7651916cd43dd8448eb211c80319c", TTLMs: 300000},
			map[string]any{"queue": "demo", "ttl_ms": int64(300000), "trace_id": "0af7651916cd43dd8448eb211c80319c"}},
		{"accepted, odd", acceptedData{Queue: odd, TraceID: odd, TTLMs: -1},
			map[string]any{"queue": odd, "ttl_ms": int64(-1), "trace_id": odd}},
		{"done", doneData{Outcome: OutcomeCompleted}, map[string]any{"outcome": OutcomeCompleted}},
		{"done, result 0", doneData{Outcome: OutcomeCompleted, Result: results[0]},
			map[string]any{"outcome": OutcomeCompleted, "result": results[0]}},
		{"done, result 1", doneData{Outcome: OutcomeCompleted, Result: results[1]},
			map[string]any{"outcome": OutcomeCompleted, "result": results[1]}},
		{"done, result 2", doneData{Outcome: OutcomeCompleted, Result: results[2]},
			map[string]any{"outcome": OutcomeCompleted, "result": results[2]}},
		{"error", errorData{Code: CodeWorkerLost, Detail: odd, Outcome: OutcomeFailed},
			map[string]any{"outcome": OutcomeFailed, "code": CodeWorkerLost, "detail": odd}},
		{"error, empty", errorData{}, map[string]any{"outcome": Outcome(""), "code": Code(""), "detail": ""}},
	} {
		got, want := mustJSON(c.got), mustJSON(c.want)
		if !bytes.Equal(got, want) {
			t.Errorf("%s: got %s, want %s", c.name, got, want)
		}
	}
}

// The engine's own events are encoded by hand when their strings need no
// escaping (encode): the bytes must be encoding/json's, both when they do
// and when they do not.
func TestEventDataEncodeMatchesJSON(t *testing.T) {
	odd := "a<b>&c \"q\" \\ é \u2028\u2029 \x01"
	results := []json.RawMessage{
		nil,
		{},
		json.RawMessage(`{"b": [1, 2.5e3, "x y"],  "a": null}`),
		json.RawMessage(`{"b": [1, 2.5e3, "<&>"],  "a": null}`),
		json.RawMessage(`"\u2028 ` + "\u2029" + ` é"`),
		json.RawMessage(`"\u00e9 \" \\ \/"`),
		json.RawMessage("\t true \n"),
		json.RawMessage(`-0.5E+10`),
	}
	type encoder interface{ encode() []byte }
	cases := []encoder{
		acceptedData{Queue: "demo", TraceID: "0af7651916cd43dd8448eb211c80319c", TTLMs: 300000},
		acceptedData{Queue: "", TraceID: "", TTLMs: -1 << 63},
		acceptedData{Queue: odd, TraceID: "t", TTLMs: 1},
		acceptedData{Queue: "q", TraceID: odd, TTLMs: 1},
		doneData{Outcome: OutcomeCompleted},
		doneData{Outcome: Outcome(odd), Result: results[2]},
		errorData{Code: CodeWorkerLost, Detail: "the worker's node left the cluster (2 of 3)", Outcome: OutcomeFailed},
		errorData{Code: CodeWorkerLost, Detail: odd, Outcome: OutcomeFailed},
		errorData{Code: Code(odd), Detail: "d", Outcome: OutcomeFailed},
		errorData{Code: "c", Detail: "d", Outcome: Outcome(odd)},
		errorData{},
	}
	for _, r := range results {
		cases = append(cases, doneData{Outcome: OutcomeCompleted, Result: r})
	}
	// Each thing encoding/json escapes, alone in a string.
	for _, ch := range []string{`"`, `\`, "<", ">", "&", "\x00", "\x1f", "\x7f", "é", "\u2028", "\xff"} {
		s := "a" + ch + "b"
		cases = append(cases, acceptedData{Queue: s, TraceID: s}, errorData{Code: "c", Detail: s, Outcome: OutcomeFailed})
	}
	for _, c := range cases {
		if got, want := c.encode(), mustJSON(c); !bytes.Equal(got, want) {
			t.Errorf("%#v: encoded %s, encoding/json %s", c, got, want)
		}
	}
}
