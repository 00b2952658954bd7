package coretest

import (
	"testing"

	"github.com/switchyard/switchyard/core"
)

// Append returns the event it appended.
func TestAppend(t *testing.T) {
	j := &core.Job{ID: "j", History: core.NewHistory(10, 1<<10)}
	ev := Append(t, j, core.EventOutput, `{"data":1}`)
	if ev.Kind != core.EventOutput || string(ev.Data) != `{"data":1}` {
		t.Errorf("Append = %+v", ev)
	}
}
