package worker_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
	"github.com/switchyard/switchyard/worker"
)

// A worker batches only for a node whose Registered says it takes
// batches: jobs running at once against one that does not send no batch;
// against one that does, frames go in batches, and each job's messages
// still arrive in order, its accept first, its outputs in sequence and
// one complete last.
func TestBatchesOnlyToANodeThatTakesThem(t *testing.T) {
	const jobs, outputs = 16, 40
	for _, takes := range []bool{false, true} {
		t.Run(fmt.Sprintf("node takes batches %v", takes), func(t *testing.T) {
			f := newFakeNode()
			f.batches = takes
			startWorker(t, f.start(t), worker.Config{Concurrency: jobs}, func(ctx context.Context, _ *worker.Job, out *worker.Output) (any, error) {
				for i := range outputs {
					if err := out.Send(ctx, i); err != nil {
						return nil, err
					}
				}
				return nil, nil
			})
			s := f.nextSession(t)
			// Batches come of frames queued together, which takes a
			// flusher busy while others put theirs: rounds until one
			// did (nearly always the first).
			for round := 0; round < 20 && (round == 0 || takes && s.batches.Load() == 0); round++ {
				for j := range jobs {
					s.sendJob(t, &pb.Job{JobId: fmt.Sprintf("r%d-j%d", round, j), Generation: 1})
				}
				next := map[string]int{} // per job: -1 accepted, then the outputs seen
				for done := 0; done < jobs; {
					m := s.next(t)
					switch x := m.GetMsg().(type) {
					case *pb.WorkerMessage_Accept:
						if _, ok := next[x.Accept.JobId]; ok {
							t.Fatalf("%s accepted twice", x.Accept.JobId)
						}
						next[x.Accept.JobId] = 0
					case *pb.WorkerMessage_Output:
						n, ok := next[x.Output.JobId]
						if !ok || string(x.Output.Data) != strconv.Itoa(n) {
							t.Fatalf("%s: output %s, want %d (accepted: %v)", x.Output.JobId, x.Output.Data, n, ok)
						}
						next[x.Output.JobId] = n + 1
					case *pb.WorkerMessage_Complete:
						if n := next[x.Complete.JobId]; n != outputs {
							t.Fatalf("%s completed after %d outputs", x.Complete.JobId, n)
						}
						next[x.Complete.JobId] = -1
						done++
					default:
						t.Fatalf("unexpected %v", m)
					}
				}
			}
			n, items := s.batches.Load(), s.batched.Load()
			switch {
			case !takes && n != 0:
				t.Fatalf("%d batches sent to a node that takes none", n)
			case takes && n == 0:
				t.Fatal("no batch sent to a node that takes them")
			}
			if takes {
				t.Logf("%d batches, %.1f messages each", n, float64(items)/float64(n))
			}
		})
	}
}
