package auth_test

import (
	"encoding/json"
	"testing"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/internal/coretest"
)

// Identity.Submit holds a slot of the key's max_in_flight for each job it
// made, until the job ends, and none for a submission that made no job: a
// refusal, or an idempotency key that matched.
func TestSubmitHoldsASlotPerJob(t *testing.T) {
	s, _ := MustStore(t, "keys:\n- subject: a\n  key: "+aliceKey+"\n  roles: [submit]\n  queues: ['*']\n  max_in_flight: 1\n")
	id, _ := s.Authenticate("Bearer " + aliceKey)
	e, err := core.New(core.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	env := func() *core.Envelope { return &core.Envelope{Input: json.RawMessage(`"x"`)} }

	// Refused (no worker on the queue): no slot taken.
	if _, _, err := id.Submit(t.Context(), e, "q", env(), core.SubmitOptions{}); codeOf(err) != core.CodeNoCapableWorker {
		t.Fatalf("no worker: %v", err)
	}
	if _, err := e.AttachWorker(t.Context(), core.WorkerSpec{Queue: "q", Concurrency: 1}, coretest.IdleConn{}); err != nil {
		t.Fatal(err)
	}
	j, existing, err := id.Submit(t.Context(), e, "q", env(), core.SubmitOptions{IdempotencyKey: "k"})
	if err != nil || existing {
		t.Fatalf("first job: %v, existing %v", err, existing)
	}
	if v, _ := e.View(j.ID); v.Owner != id.Owner() {
		t.Errorf("the job's owner is %q, want the identity's %q", v.Owner, id.Owner())
	}
	// The one slot is the job's.
	if _, _, err := id.Submit(t.Context(), e, "q", env(), core.SubmitOptions{}); codeOf(err) != core.CodeRateLimited {
		t.Fatalf("a second job in flight: %v", err)
	}
	// Until it ends.
	if _, err := e.Cancel(j.ID, "test"); err != nil {
		t.Fatal(err)
	}
	again, existing, err := id.Submit(t.Context(), e, "q", env(), core.SubmitOptions{IdempotencyKey: "k"})
	if err != nil || !existing || again.ID != j.ID {
		t.Fatalf("the key's retry: %v, existing %v", err, existing)
	}
	// The matched key made no job, so it holds no slot.
	if _, _, err := id.Submit(t.Context(), e, "q", env(), core.SubmitOptions{}); err != nil {
		t.Fatalf("a job after the key's retry: %v", err)
	}
}
