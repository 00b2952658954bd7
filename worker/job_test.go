package worker_test

import (
	"context"
	"testing"

	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
	"github.com/switchyard/switchyard/worker"
)

// A handler sees the offer's affinity key and priority.
func TestJobAffinityKeyAndPriority(t *testing.T) {
	seen := make(chan *worker.Job, 1)
	_, _, s := startOnFake(t, worker.Config{}, func(_ context.Context, job *worker.Job, _ *worker.Output) (any, error) {
		seen <- job
		return nil, nil
	})
	s.sendJob(t, &pb.Job{JobId: "k", Generation: 1, Input: []byte(`1`), AffinityKey: "session-42", Priority: -3})
	s.expectAccept(t, "k", 1)
	if job := <-seen; job.AffinityKey != "session-42" || job.Priority != -3 {
		t.Errorf("job key %q priority %d, want session-42 and -3", job.AffinityKey, job.Priority)
	}
}
