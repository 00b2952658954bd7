package benchkit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	sse "github.com/tmaxmax/go-sse"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

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

// The opaque relay floor carries a job's envelope to the frame worker and
// streams back the frames of the job's shape as SSE events, ids in order,
// the response ending after the last, and as the messages of a gRPC edge
// call; a job with no worker ends with an error event (a failed call); the
// load generator counts jobs right; nothing is left running.
func TestFrameRelay(t *testing.T) {
	defer goleak.VerifyNone(t)
	n, err := benchkit.StartFrameNode("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	in, err := benchkit.StartFrameIngress("127.0.0.1:0", "127.0.0.1:0", n.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	client := benchkit.NewClient()
	defer client.CloseIdleConnections()
	body, _ := json.Marshal(map[string]any{"input": "ignored", "options": benchkit.BareShape{Outputs: 5, Bytes: 7}})

	// No worker yet: the job fails at once.
	res, err := client.Post(in.URL(), "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	types, _, data := readEvents(t, res)
	if strings.Join(types, ",") != "error" || data[0] != "no worker" {
		t.Fatalf("without a worker: events %q %q", types, data)
	}
	edge, err := grpc.NewClient(in.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer edge.Close()
	if r := benchkit.RunJobs(t.Context(), benchkit.FrameEdgeJob(edge, body, 0), 1, 1); r.Failed != 1 {
		t.Fatalf("without a worker, the gRPC edge's call did not fail: %+v", r)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- benchkit.RunFrameWorker(ctx, n.Addr()) }()
	defer func() { cancel(); <-done }()
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	defer wcancel()
	if err := n.WaitWorker(wctx); err != nil {
		t.Fatal(err)
	}

	res, err = client.Post(in.URL(), "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if ct := res.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	types, ids, data := readEvents(t, res)
	if got := strings.Join(ids, ","); got != "0,1,2,3,4" {
		t.Fatalf("ids %s (types %q)", got, types)
	}
	for i, d := range data {
		if types[i] != "" || d != "abcdefg" {
			t.Fatalf("event %d: type %q data %q", i, types[i], d)
		}
	}

	// Two shapes at once, as the bench's warm-up and rounds do.
	other, _ := json.Marshal(map[string]any{"options": benchkit.BareShape{Outputs: 16, Bytes: 32}})
	for _, c := range []struct {
		body   []byte
		frames int
	}{{body, 5}, {other, 16}} {
		for via, job := range map[string]benchkit.JobFunc{
			"HTTP": benchkit.FrameJob(client, in.URL(), c.body, c.frames),
			"gRPC": benchkit.FrameEdgeJob(edge, c.body, c.frames),
		} {
			r := benchkit.RunJobs(ctx, job, 50, 8)
			if r.Failed != 0 || len(r.Last) != 50 || r.First[0] <= 0 || r.Last[0] < r.First[0] {
				t.Fatalf("%s edge, %d frames: %d failed, %d done, first %v last %v", via, c.frames, r.Failed, len(r.Last), r.First[:1], r.Last[:1])
			}
		}
	}
	// The wrong count is a failure, not a job done.
	if r := benchkit.RunJobs(ctx, benchkit.FrameJob(client, in.URL(), body, 6), 1, 1); r.Failed != 1 {
		t.Fatalf("6 frames expected, 5 sent: %d failed", r.Failed)
	}
	for _, frames := range []int{4, 6} {
		if r := benchkit.RunJobs(ctx, benchkit.FrameEdgeJob(edge, body, frames), 1, 1); r.Failed != 1 {
			t.Fatalf("gRPC edge: %d frames expected, 5 sent: %d failed", frames, r.Failed)
		}
	}
}

// readEvents reads an SSE response to its end: each event's type, id and
// data.
func readEvents(t *testing.T, res *http.Response) (types, ids, data []string) {
	t.Helper()
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("status %d", res.StatusCode)
	}
	for ev, err := range sse.Read(res.Body, nil) {
		if err != nil {
			t.Fatal(err)
		}
		types, ids, data = append(types, ev.Type), append(ids, ev.LastEventID), append(data, ev.Data)
	}
	return types, ids, data
}
