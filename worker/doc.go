// Package worker is the library for writing Switchyard workers in Go.
//
// A worker connects to a node over gRPC (WorkerService.Connect), registers
// the queue it serves and the capabilities it can run, and is then offered
// jobs. For each job it decides (Config.Decide) whether to take it, runs a
// Handler that streams output through an Output, and ends the job with
// exactly one Complete or Fail. Run does all of the protocol work:
//
//   - one writer per stream: every message to the node goes through a single
//     goroutine fed by a bounded queue, so the gRPC stream is never written
//     from two goroutines and a slow node pushes back on the handlers;
//   - output credit: a job's Output.Send waits while the job has sent all
//     the output the node gave it credit for — its reader is behind — so a
//     handler is slowed to its reader's pace, never cut off, and one job
//     waiting holds up no other (a send past the credit would fail the job
//     credit_exceeded; the SDK never makes one);
//   - liveness: a heartbeat goes out whenever nothing else did for the
//     heartbeat interval, and a node that says nothing for three intervals is
//     treated as gone (the session ends and Run reconnects);
//   - deadlines: a job's Deadline is the local receive time plus the TTL the
//     node reported, so clocks are never compared across machines;
//   - cancellation: a Cancel from the node cancels the handler's context and
//     is acknowledged with Fail{code: "cancelled"}, whatever the handler
//     returned;
//   - reconnection with capped exponential backoff when a session ends for
//     any reason but Run's context; errors that retrying cannot fix (the node
//     refusing the registration as invalid) are returned instead.
//
// A worker whose capabilities change while it runs (a model loaded or
// unloaded) is made with New instead: Worker.SetCapabilities replaces the
// declared set on the live session, without dropping running jobs, and
// every later registration declares the new set.
//
// Handlers must honour their context: when a session ends Run cancels every
// running job and waits for its handler before it reconnects or returns, so
// a handler that ignores ctx holds the worker up.
//
// # Example
//
//	h := func(ctx context.Context, job *worker.Job, out *worker.Output) (any, error) {
//		var in struct{ Text string }
//		if err := json.Unmarshal(job.Input, &in); err != nil {
//			return nil, worker.Fail("bad_input", err.Error())
//		}
//		if err := out.Send(ctx, strings.ToUpper(in.Text)); err != nil {
//			return nil, err
//		}
//		return map[string]int{"chars": len(in.Text)}, nil
//	}
//	err := worker.Run(ctx, worker.Config{
//		Server:       "localhost:7070",
//		Queue:        "upper",
//		Capabilities: []string{"lang=en"},
//		Concurrency:  4,
//	}, h)
package worker
