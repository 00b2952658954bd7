package coretest

import (
	"encoding/json"
	"testing"

	"github.com/switchyard/switchyard/core"
)

// A queue with an IdleConn attached takes a job, which stays open.
func TestIdleConn(t *testing.T) {
	e, err := core.New(core.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if _, err := e.AttachWorker(t.Context(), core.WorkerSpec{Queue: "q", Concurrency: 1}, IdleConn{}); err != nil {
		t.Fatal(err)
	}
	j, _, err := e.Submit(t.Context(), "q", &core.Envelope{Input: json.RawMessage(`1`)}, core.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := e.View(j.ID); v.State.Terminal() {
		t.Errorf("the job ended: %+v", v)
	}
}
