package integration_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/grpcapi"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
	"github.com/switchyard/switchyard/worker"
)

// recvBatches reads a batched job stream to its end, pausing for pause
// after its first message; err is nil when the call ended OK.
func recvBatches(st grpc.ServerStreamingClient[pb.JobEventBatch], pause time.Duration) ([]*pb.JobEventBatch, error) {
	var out []*pb.JobEventBatch
	for {
		b, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, b)
		if len(out) == 1 && pause > 0 {
			time.Sleep(pause)
		}
	}
}

// flatten is a batched stream's events, in order.
func flatten(bs []*pb.JobEventBatch) []*pb.JobEvent {
	var evs []*pb.JobEvent
	for _, b := range bs {
		evs = append(evs, b.GetEvents()...)
	}
	return evs
}

// batchedStreamErr is streamErr for a batched stream.
func batchedStreamErr(st grpc.ServerStreamingClient[pb.JobEventBatch], err error) error {
	if err == nil {
		_, err = recvBatches(st, 0)
	}
	return err
}

func submitBatched(tb testing.TB, c pb.JobServiceClient, queue, envelope string, pause time.Duration) []*pb.JobEventBatch {
	tb.Helper()
	st, err := c.SubmitBatched(tb.Context(), &pb.SubmitRequest{Queue: queue, EnvelopeJson: []byte(envelope)})
	if err != nil {
		tb.Fatalf("submit batched: %v", err)
	}
	if hdr, err := st.Header(); err != nil || len(hdr.Get(grpcapi.HeaderJobID)) != 1 {
		tb.Fatalf("header %v, %v: want %s", hdr, err, grpcapi.HeaderJobID)
	}
	bs, err := recvBatches(st, pause)
	if err != nil {
		tb.Fatalf("submit batched stream: %v (after %v)", err, kinds(flatten(bs)))
	}
	checkBatches(tb, bs)
	return bs
}

func resumeBatched(tb testing.TB, c pb.JobServiceClient, req *pb.ResumeRequest) ([]*pb.JobEventBatch, error) {
	tb.Helper()
	st, err := c.ResumeBatched(tb.Context(), req)
	if err != nil {
		return nil, err
	}
	bs, err := recvBatches(st, 0)
	checkBatches(tb, bs)
	return bs, err
}

// checkBatches checks that no batch is empty and no batch of more than one
// event passes the node's bound.
func checkBatches(tb testing.TB, bs []*pb.JobEventBatch) {
	tb.Helper()
	for i, b := range bs {
		if len(b.GetEvents()) == 0 {
			tb.Errorf("batch %d is empty", i)
		}
		if size := proto.Size(b); len(b.GetEvents()) > 1 && size > grpcapi.DefaultMaxBatchBytes {
			tb.Errorf("batch %d: %d events in %d bytes, past the bound of %d", i, len(b.GetEvents()), size, grpcapi.DefaultMaxBatchBytes)
		}
	}
}

// sameEvents checks that got are want's events (kinds, positions, data)
// of another job: the job ids in the data are the only difference.
func sameEvents(tb testing.TB, what string, got, want []*pb.JobEvent) {
	tb.Helper()
	if !slices.Equal(kinds(got), kinds(want)) || !slices.Equal(seqs(got), seqs(want)) {
		tb.Fatalf("%s: events %v %v, want %v %v", what, kinds(got), seqs(got), kinds(want), seqs(want))
	}
	for i := range got {
		g, w := got[i], want[i]
		gd, wd := jobless(tb, g), jobless(tb, w)
		if gd != wd || g.GetGeneration() != w.GetGeneration() || g.GetSnapshot() != w.GetSnapshot() ||
			g.GetAttempt() != w.GetAttempt() || (g.GetResumeToken() == "") != (w.GetResumeToken() == "") {
			tb.Errorf("%s: event %d is %v, want %v", what, i, g, w)
		}
	}
}

// jobless is an event's data with its job's own ids (job_id, trace_id)
// left out.
func jobless(tb testing.TB, ev *pb.JobEvent) string {
	tb.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(ev.GetDataJson(), &m); err != nil {
		tb.Fatalf("%s data %q: %v", ev.GetKind(), ev.GetDataJson(), err)
	}
	if string(m["job_id"]) != `"`+ev.GetJobId()+`"` {
		tb.Errorf("%s data %q: job_id is not %s", ev.GetKind(), ev.GetDataJson(), ev.GetJobId())
	}
	delete(m, "job_id")
	delete(m, "trace_id")
	b, _ := json.Marshal(m)
	return string(b)
}

// SubmitBatched streams the events Submit streams, with the same ids,
// positions, data and tokens, in batches; ResumeBatched and Resume take
// each other's tokens with no gap and no duplicate.
func TestGRPCBatchedSubmitMatchesSubmit(t *testing.T) {
	n := MustStartNode(t, nil)
	MustStartWorker(t, n, worker.Config{Concurrency: 2}, worker.Tokens(0))
	c := jobsClient(t, n)
	const env = `{"input":"one two three four five six seven eight","ttl_ms":5000}`

	per := submitAll(t, t.Context(), c, "demo", env)
	bs := submitBatched(t, c, "demo", env, 0)
	evs := flatten(bs)
	sameEvents(t, "SubmitBatched against Submit", evs, per)
	if evs[len(evs)-1].GetKind() != "done" {
		t.Fatalf("events %v", kinds(evs))
	}
	id := evs[0].GetJobId()
	for i, ev := range evs {
		if ev.GetJobId() != id || ev.GetResumeToken() == "" || dataField[string](t, ev, "job_id") != id {
			t.Errorf("event %d: %v", i, ev)
		}
	}
	// The per-event stream of the same job carries the same events.
	again, err := resumeAll(t, t.Context(), c, &pb.ResumeRequest{JobId: id})
	if err != nil {
		t.Fatal(err)
	}
	sameEvents(t, "Resume of the batched job", again, evs)

	for i, ev := range evs {
		want := seqs(evs[i+1:])
		got, err := resumeBatched(t, c, &pb.ResumeRequest{JobId: id, ResumeToken: ev.GetResumeToken()})
		if err != nil || !slices.Equal(seqs(flatten(got)), want) {
			t.Fatalf("ResumeBatched after %d: %v, %v; want %v", ev.GetSeq(), seqs(flatten(got)), err, want)
		}
		per, err := resumeAll(t, t.Context(), c, &pb.ResumeRequest{JobId: id, ResumeToken: ev.GetResumeToken()})
		if err != nil || !slices.Equal(seqs(per), want) {
			t.Fatalf("Resume after %d with a batched token: %v, %v; want %v", ev.GetSeq(), seqs(per), err, want)
		}
		if len(per) > 0 {
			// A per-event stream's token resumes a batched stream too.
			rest, err := resumeBatched(t, c, &pb.ResumeRequest{JobId: id, ResumeToken: per[0].GetResumeToken()})
			if err != nil || !slices.Equal(seqs(flatten(rest)), want[1:]) {
				t.Fatalf("ResumeBatched after %d with a per-event token: %v, %v", per[0].GetSeq(), seqs(flatten(rest)), err)
			}
		}
	}
	if got := metric(t, n, "switchyard_stream_open", map[string]string{"transport": "grpc"}); got != 0 {
		t.Errorf("grpc job streams open = %v after the streams ended", got)
	}
}

// Events ready together share a message: a worker's burst on a stream
// whose client paused (its window full, the writer waits, the history
// grows), and the replay of a finished job. The batches concatenated are
// the per-event stream.
func TestGRPCBatchedBurstSharesMessages(t *testing.T) {
	const outputs = 200
	n := MustStartNode(t, func(c *switchyard.Config) {
		c.HTTP.Stream.WriteTimeout = 5 * time.Second
	})
	MustStartWorker(t, n, worker.Config{}, func(ctx context.Context, _ *worker.Job, out *worker.Output) (any, error) {
		for i := range outputs {
			if err := out.Send(ctx, fmt.Sprintf("%04d%s", i, strings.Repeat("x", 1020))); err != nil {
				return nil, err
			}
		}
		return nil, nil
	})
	// A fixed 64 KiB window: a paused client stops the writer.
	c := jobsClient(t, n, grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))

	bs := submitBatched(t, c, "demo", `{"input":"x","ttl_ms":10000}`, 300*time.Millisecond)
	evs := flatten(bs)
	if len(evs) != outputs+2 {
		t.Fatalf("%d events, want %d", len(evs), outputs+2)
	}
	most := 0
	for _, b := range bs {
		most = max(most, len(b.GetEvents()))
	}
	t.Logf("SubmitBatched: %d events in %d messages, at most %d in one", len(evs), len(bs), most)
	if most < 2 {
		t.Errorf("no message held more than one event (%d messages)", len(bs))
	}
	per, err := resumeAll(t, t.Context(), c, &pb.ResumeRequest{JobId: evs[0].GetJobId()})
	if err != nil {
		t.Fatal(err)
	}
	sameEvents(t, "SubmitBatched's batches concatenated", evs, per)
	for i, ev := range per {
		if ev.GetResumeToken() == "" || evs[i].GetResumeToken() == "" {
			t.Errorf("event %d has no token", i)
		}
	}

	// The replay of the finished job: one read of the history (64 events)
	// a message.
	replay, err := resumeBatched(t, c, &pb.ResumeRequest{JobId: evs[0].GetJobId()})
	if err != nil {
		t.Fatal(err)
	}
	sameEvents(t, "the replay's batches concatenated", flatten(replay), per)
	if want := (outputs + 2 + 63) / 64; len(replay) != want {
		t.Errorf("the replay of %d events came in %d messages, want %d", len(per), len(replay), want)
	}
}

// A batch stays under the node's bound: outputs ready together that would
// pass it go in the next message, and an output larger than the bound goes
// alone, whole.
func TestGRPCBatchedSplitsAtTheBound(t *testing.T) {
	const size = 100 << 10 // two fit under the bound, with their envelopes
	n := MustStartNode(t, func(c *switchyard.Config) {
		c.Engine.Limits.MaxOutputBytes = 64 << 20
	})
	big := strings.Repeat("y", grpcapi.DefaultMaxBatchBytes+1000)
	MustStartWorker(t, n, worker.Config{}, func(ctx context.Context, _ *worker.Job, out *worker.Output) (any, error) {
		for i := range 10 {
			if err := out.Send(ctx, fmt.Sprintf("%02d%s", i, strings.Repeat("x", size))); err != nil {
				return nil, err
			}
		}
		return nil, out.Send(ctx, big)
	})
	c := jobsClient(t, n)
	bs := submitBatched(t, c, "demo", `{"input":"x","ttl_ms":10000}`, 0)
	id := flatten(bs)[0].GetJobId()
	per, err := resumeAll(t, t.Context(), c, &pb.ResumeRequest{JobId: id})
	if err != nil {
		t.Fatal(err)
	}
	sameEvents(t, "SubmitBatched", flatten(bs), per)

	// The replay: 13 events of 1.3 MB, ready together.
	replay, err := resumeBatched(t, c, &pb.ResumeRequest{JobId: id})
	if err != nil {
		t.Fatal(err)
	}
	sameEvents(t, "the replay", flatten(replay), per)
	var sizes []string
	alone := false
	for _, b := range replay {
		sizes = append(sizes, fmt.Sprintf("%d×%d", len(b.GetEvents()), proto.Size(b)))
		for _, ev := range b.GetEvents() {
			if ev.GetKind() == "output" && strings.Contains(string(ev.GetDataJson()), big) {
				alone = len(b.GetEvents()) == 1 && proto.Size(b) > grpcapi.DefaultMaxBatchBytes
			}
		}
	}
	t.Logf("the replay's messages (events × bytes): %v", sizes)
	// 10 outputs of 100 KiB, two a message, and the big one alone: at least 6.
	if len(replay) < 6 || len(replay) >= len(per) {
		t.Errorf("the replay of %d events came in %d messages (%v), want them split at the bound but batched", len(per), len(replay), sizes)
	}
	if !alone {
		t.Errorf("the output larger than the bound did not go alone, whole: %v", sizes)
	}
}

// SubmitBatched and ResumeBatched refuse what Submit and Resume refuse,
// with the same statuses.
func TestGRPCBatchedRefusals(t *testing.T) {
	n := MustStartNode(t, nil)
	MustStartWorker(t, n, worker.Config{}, worker.Tokens(time.Millisecond))
	c := jobsClient(t, n)
	for _, tc := range []struct {
		name, queue, envelope string
		grpc                  codes.Code
		code                  string
	}{
		{"bad queue name", "no spaces!", `{"input":"x"}`, codes.InvalidArgument, "invalid_queue_name"},
		{"malformed json", "demo", `{"input":`, codes.InvalidArgument, "malformed_json"},
		{"missing input", "demo", `{"ttl_ms":1000}`, codes.InvalidArgument, "missing_input"},
		{"ttl out of range", "demo", `{"input":"x","ttl_ms":999999999}`, codes.OutOfRange, "ttl_out_of_range"},
		{"no worker on the queue", "nobody", `{"input":"x"}`, codes.Unavailable, "no_capable_worker"},
	} {
		req := &pb.SubmitRequest{Queue: tc.queue, EnvelopeJson: []byte(tc.envelope)}
		perErr := streamErr(c.Submit(t.Context(), req))
		st, err := c.SubmitBatched(t.Context(), req)
		var bs []*pb.JobEventBatch
		if err == nil {
			bs, err = recvBatches(st, 0)
		}
		if len(bs) != 0 {
			t.Errorf("%s: batches %v before the refusal", tc.name, bs)
		}
		wantStatus(t, perErr, tc.grpc, tc.code)
		wantStatus(t, err, tc.grpc, tc.code)
		if perErr.Error() != err.Error() {
			t.Errorf("%s: SubmitBatched %v, Submit %v", tc.name, err, perErr)
		}
	}

	evs := submitAll(t, t.Context(), c, "demo", `{"input":"a b","ttl_ms":5000}`)
	id := evs[0].GetJobId()
	for _, tc := range []struct {
		name string
		req  *pb.ResumeRequest
		grpc codes.Code
		code string
	}{
		{"forged token", &pb.ResumeRequest{JobId: id, ResumeToken: "v1.forged"}, codes.InvalidArgument, "invalid_resume_token"},
		{"token of another filter", &pb.ResumeRequest{JobId: id, ResumeToken: evs[0].GetResumeToken(), Types: []string{"output"}}, codes.InvalidArgument, "invalid_resume_token"},
		{"unknown type", &pb.ResumeRequest{JobId: id, Types: []string{"nope"}}, codes.InvalidArgument, "invalid_field"},
		{"unknown job", &pb.ResumeRequest{JobId: "no-such-job"}, codes.NotFound, "job_not_found"},
	} {
		_, perErr := resumeAll(t, t.Context(), c, tc.req)
		_, err := resumeBatched(t, c, tc.req)
		wantStatus(t, perErr, tc.grpc, tc.code)
		wantStatus(t, err, tc.grpc, tc.code)
	}
	// The end of a finished job: OK and nothing, as Resume.
	if bs, err := resumeBatched(t, c, &pb.ResumeRequest{JobId: id, ResumeToken: evs[len(evs)-1].GetResumeToken()}); err != nil || len(bs) != 0 {
		t.Errorf("ResumeBatched after the terminal event: %v, %v", bs, err)
	}
}

// A SubmitBatched client leaving cancels the job, as a Submit's does.
func TestGRPCBatchedClientLeavingCancelsJob(t *testing.T) {
	n := MustStartNode(t, nil)
	started, stopped := make(chan string, 1), make(chan error, 1)
	MustStartWorker(t, n, worker.Config{}, blockingWorker(started, stopped))
	c := jobsClient(t, n)
	ctx, cancel := context.WithCancel(t.Context())
	st, err := c.SubmitBatched(ctx, &pb.SubmitRequest{Queue: "demo", EnvelopeJson: []byte(`{"input":"x","ttl_ms":30000}`)})
	if err != nil {
		t.Fatal(err)
	}
	var got []*pb.JobEvent
	for !slices.Contains(kinds(got), "output") {
		b, err := st.Recv()
		if err != nil {
			t.Fatalf("recv: %v after %v", err, kinds(got))
		}
		got = append(got, b.GetEvents()...)
	}
	id := recvWithin(t, started, 5*time.Second, "the job to start")
	cancel()
	recvWithin(t, stopped, 5*time.Second, "the worker's job to be cancelled")
	waitFor(t, 5*time.Second, "the job cancelled", func() bool {
		js, err := c.Get(t.Context(), &pb.GetJobRequest{JobId: id})
		return err == nil && js.GetState() == "cancelled"
	})
}
