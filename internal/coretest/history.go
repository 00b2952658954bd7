package coretest

import (
	"testing"

	"github.com/switchyard/switchyard/core"
)

// Append appends an event of kind with data to j's history, of generation
// 1, and returns it; it fails t when the history refuses it.
func Append(t testing.TB, j *core.Job, kind core.EventKind, data string) core.Event {
	t.Helper()
	ev, ok := j.History.Append(kind, 1, []byte(data))
	if !ok {
		t.Fatalf("Append(%s) refused", kind)
	}
	return ev
}
