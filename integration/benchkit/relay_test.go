package benchkit_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	sse "github.com/tmaxmax/go-sse"
	"go.uber.org/goleak"

	"github.com/switchyard/switchyard/integration/benchkit"
	"github.com/switchyard/switchyard/worker"
)

// The bare relay carries a job to a real SDK worker and streams back the
// events a Switchyard job stream has for it, through both of its modes, and
// stops without leaving a goroutine behind.
func TestRelay(t *testing.T) {
	defer goleak.VerifyNone(t)
	r, err := benchkit.StartRelay(time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = worker.Run(ctx, worker.Config{Server: r.WorkerAddr(), Queue: "q", Concurrency: 4}, worker.Tokens(0))
	}()
	defer func() { cancel(); <-done }()
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	defer wcancel()
	if err := r.WaitWorker(wctx); err != nil {
		t.Fatal(err)
	}

	client := benchkit.NewClient()
	defer client.CloseIdleConnections()
	for _, mode := range []string{benchkit.ModeStreamPerJob, benchkit.ModeSharedStream} {
		res, err := client.Post(r.Target(mode, "q"), "application/json", strings.NewReader(`{"input":"one two three four"}`))
		if err != nil {
			t.Fatal(err)
		}
		if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("%s: %d %s", mode, res.StatusCode, res.Header.Get("Content-Type"))
		}
		var types, data []string
		for ev, err := range sse.Read(res.Body, nil) {
			if err != nil {
				t.Fatalf("%s: %v", mode, err)
			}
			types = append(types, ev.Type)
			data = append(data, ev.Data)
		}
		_ = res.Body.Close()
		if got := strings.Join(types, ","); got != "accepted,output,output,output,output,done" {
			t.Fatalf("%s: events %s", mode, got)
		}
		if !strings.Contains(data[1], `"data":"one "`) || !strings.Contains(data[5], `"result":{"words":4}`) {
			t.Fatalf("%s: data %q", mode, data)
		}

		r1 := benchkit.Run(ctx, client, r.Target(mode, "q"), []byte(`{"input":"a b"}`), 20, 4)
		if r1.Failed != 0 || len(r1.Last) != 20 {
			t.Fatalf("%s: %d failed, %d done", mode, r1.Failed, len(r1.Last))
		}
	}
}
