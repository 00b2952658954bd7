package worker

import (
	"context"
	"errors"
	"testing"
)

// A credit may reach a job's Output after the job ended (the receive loop
// found the job, then the job ended): it is ignored, and a send after the
// end still fails with ErrJobEnded.
func TestGrantAfterEnd(t *testing.T) {
	o := &Output{job: &Job{ID: "j", Generation: 1}, jctx: context.Background(), credit: credit{1, 1}}
	o.moved.next() // a send waits for credit
	o.end()
	o.grant(credit{10, 100})
	if err := o.send(context.Background(), []byte(`"x"`)); !errors.Is(err, ErrJobEnded) {
		t.Fatalf("send after end: %v, want ErrJobEnded", err)
	}
}
