package stream_test

import (
	"encoding/json"
	"testing"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/stream"
	"github.com/switchyard/switchyard/internal/coretest"
)

// A reader is complete once it has the job's terminal event: not while
// the job runs, not one event short of the end, not at the start.
func TestComplete(t *testing.T) {
	e, err := core.New(core.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if _, err := e.AttachWorker(t.Context(), core.WorkerSpec{Queue: "q", Concurrency: 1}, coretest.IdleConn{}); err != nil {
		t.Fatal(err)
	}
	j, _, err := e.Submit(t.Context(), "q", &core.Envelope{Input: json.RawMessage(`1`)}, core.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	coretest.Append(t, j, core.EventOutput, `{"data":1}`)
	if stream.Complete(e, j, j.History.Head()) {
		t.Error("complete while the job runs")
	}
	if _, err := e.Cancel(j.ID, "test"); err != nil {
		t.Fatal(err)
	}
	head := j.History.Head()
	for after, want := range map[uint64]bool{0: false, head - 1: false, head: true} {
		if got := stream.Complete(e, j, after); got != want {
			t.Errorf("Complete after %d of %d = %v, want %v", after, head, got, want)
		}
	}
}
