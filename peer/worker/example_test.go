package worker_test

import (
	"context"
	"encoding/json"
	"log"
	"os/signal"
	"strings"
	"syscall"

	"github.com/switchyard/switchyard/peer/worker"
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
