package worker_test

import (
	"context"
	"encoding/json"
	"log"
	"os/signal"
	"strings"
	"syscall"

	"github.com/switchyard/switchyard/worker"
)

// A worker that upper-cases text, stopping cleanly on Ctrl-C.
func ExampleRun() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	h := func(ctx context.Context, job *worker.Job, out *worker.Output) (any, error) {
		var in struct{ Text string }
		if err := json.Unmarshal(job.Input, &in); err != nil {
			return nil, worker.Fail("bad_input", err.Error())
		}
		if err := out.Send(ctx, strings.ToUpper(in.Text)); err != nil {
			return nil, err
		}
		return map[string]int{"chars": len(in.Text)}, nil
	}
	err := worker.Run(ctx, worker.Config{Server: "localhost:7070", Queue: "upper", Concurrency: 4}, h)
	if err != nil {
		log.Fatal(err)
	}
}

// A worker that declares the model it has loaded, and switches models
// without reconnecting: from then on it is offered jobs that need the new
// model, and refused jobs that need the old one; jobs already running
// finish.
func ExampleWorker_SetCapabilities() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	h := func(ctx context.Context, job *worker.Job, out *worker.Output) (any, error) {
		return "ran " + string(job.Input), nil
	}
	w, err := worker.New(worker.Config{
		Server: "localhost:7070", Queue: "generate", Capabilities: []string{"model=small"},
	}, h)
	if err != nil {
		log.Fatal(err)
	}
	go func() {
		// ... load the large model, then:
		if err := w.SetCapabilities(ctx, []string{"model=large"}); err != nil {
			log.Printf("still serving model=small: %v", err)
		}
	}()
	if err := w.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
