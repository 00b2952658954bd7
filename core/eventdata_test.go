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
