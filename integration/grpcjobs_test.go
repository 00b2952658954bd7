package integration_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/core/resume"
	"github.com/switchyard/switchyard/internal/grpctest"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
	"github.com/switchyard/switchyard/worker"
)

// jobsClient is a generated JobService client on its own connection, closed
// when the test ends (before the node, which was started earlier).
func jobsClient(tb testing.TB, n *switchyard.Node, opts ...grpc.DialOption) pb.JobServiceClient {
	tb.Helper()
	return pb.NewJobServiceClient(grpcConn(tb, n, opts...))
}

// recvAll reads a job stream to its end; err is nil when the call ended OK.
func recvAll(st grpc.ServerStreamingClient[pb.JobEvent]) ([]*pb.JobEvent, error) {
	return recvPaced(st, 0)
}

// streamErr is a job stream's first error: opening it (err), or reading
// it to its end; nil when the call ended OK. Called as
// streamErr(c.Submit(ctx, req)).
func streamErr(st grpc.ServerStreamingClient[pb.JobEvent], err error) error {
	if err == nil {
		_, err = recvAll(st)
	}
	return err
}

// recvPaced is recvAll reading one event per pace.
func recvPaced(st grpc.ServerStreamingClient[pb.JobEvent], pace time.Duration) ([]*pb.JobEvent, error) {
	var evs []*pb.JobEvent
	for {
		ev, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return evs, nil
		}
		if err != nil {
			return evs, err
		}
		evs = append(evs, ev)
		if pace > 0 {
			time.Sleep(pace)
		}
	}
}

func mustRecv(tb testing.TB, st grpc.ServerStreamingClient[pb.JobEvent]) *pb.JobEvent {
	tb.Helper()
	ev, err := st.Recv()
	if err != nil {
		tb.Fatalf("recv: %v", err)
	}
	return ev
}

func submitAll(tb testing.TB, ctx context.Context, c pb.JobServiceClient, queue, envelope string) []*pb.JobEvent {
	tb.Helper()
	st, err := c.Submit(ctx, &pb.SubmitRequest{Queue: queue, EnvelopeJson: []byte(envelope)})
	if err != nil {
		tb.Fatalf("submit: %v", err)
	}
	evs, err := recvAll(st)
	if err != nil {
		tb.Fatalf("submit stream: %v (after %v)", err, kinds(evs))
	}
	return evs
}

func resumeAll(tb testing.TB, ctx context.Context, c pb.JobServiceClient, req *pb.ResumeRequest) ([]*pb.JobEvent, error) {
	tb.Helper()
	st, err := c.Resume(ctx, req)
	if err != nil {
		return nil, err
	}
	return recvAll(st)
}

func kinds(evs []*pb.JobEvent) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.GetKind())
	}
	return out
}

func seqs(evs []*pb.JobEvent) []uint64 {
	var out []uint64
	for _, e := range evs {
		out = append(out, e.GetSeq())
	}
	return out
}

func dataField[T any](tb testing.TB, ev *pb.JobEvent, name string) T {
	tb.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(ev.GetDataJson(), &m); err != nil {
		tb.Fatalf("%s data %q: %v", ev.GetKind(), ev.GetDataJson(), err)
	}
	var v T
	if raw, ok := m[name]; ok {
		if err := json.Unmarshal(raw, &v); err != nil {
			tb.Fatalf("field %s of %q: %v", name, ev.GetDataJson(), err)
		}
	}
	return v
}

// wantStatus checks a refusal's gRPC code, its "<code>: " message prefix
// and its ErrorInfo reason.
func wantStatus(tb testing.TB, err error, c codes.Code, code string) *status.Status {
	tb.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != c || !strings.HasPrefix(st.Message(), code+": ") {
		tb.Fatalf("error %v, want %s with message %q...", err, c, code+": ")
	}
	var reason string
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			reason = info.GetReason()
		}
	}
	if reason != code {
		tb.Errorf("ErrorInfo reason %q, want %q", reason, code)
	}
	return st
}

// blockingWorker sends one output, then waits for its job to be cancelled
// and reports the cancellation.
func blockingWorker(started chan<- string, stopped chan<- error) worker.Handler {
	return func(ctx context.Context, job *worker.Job, out *worker.Output) (any, error) {
		if err := out.Send(ctx, "first"); err != nil {
			return nil, err
		}
		started <- job.ID
		<-ctx.Done()
		stopped <- context.Cause(ctx)
		return nil, ctx.Err()
	}
}

func recvWithin[T any](tb testing.TB, ch <-chan T, d time.Duration, what string) T {
	tb.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		tb.Fatalf("timed out after %s waiting for %s", d, what)
	}
	var zero T
	return zero
}

func TestGRPCSubmitStreamsInOrder(t *testing.T) {
	n := MustStartNode(t, nil)
	MustStartWorker(t, n, worker.Config{Concurrency: 2}, worker.Tokens(time.Millisecond))
	c := jobsClient(t, n)

	st, err := c.Submit(t.Context(), &pb.SubmitRequest{Queue: "demo", EnvelopeJson: []byte(`{"input":"the quick brown fox","ttl_ms":5000}`)})
	if err != nil {
		t.Fatal(err)
	}
	hdr, err := st.Header()
	if err != nil || len(hdr.Get("x-job-id")) != 1 {
		t.Fatalf("header %v, %v: want x-job-id", hdr, err)
	}
	id := hdr.Get("x-job-id")[0]
	evs, err := recvAll(st)
	if err != nil {
		t.Fatalf("stream ended with %v", err)
	}
	if got, want := kinds(evs), []string{"accepted", "output", "output", "output", "output", "done"}; !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	var words string
	for i, ev := range evs {
		if ev.GetSeq() != uint64(i+1) || ev.GetJobId() != id || ev.GetGeneration() != 1 || ev.GetSnapshot() == 0 ||
			ev.GetSnapshot() != evs[0].GetSnapshot() || ev.GetResumeToken() == "" {
			t.Errorf("event %d: %v", i, ev)
		}
		// The fields are the envelope of the JSON data, not a second story.
		if dataField[string](t, ev, "job_id") != id || dataField[uint64](t, ev, "seq") != ev.GetSeq() ||
			dataField[uint64](t, ev, "gen") != ev.GetGeneration() || dataField[uint64](t, ev, "snap") != ev.GetSnapshot() ||
			dataField[uint64](t, ev, "attempt") != ev.GetAttempt() {
			t.Errorf("event %d: data %s does not match %v", i, ev.GetDataJson(), ev)
		}
		if ev.GetKind() == "output" {
			words += dataField[string](t, ev, "data")
			if ev.GetAttempt() == 0 {
				t.Errorf("output %d has attempt 0", i)
			}
		}
	}
	if words != "the quick brown fox" {
		t.Errorf("outputs %q", words)
	}
	if o := dataField[string](t, evs[5], "outcome"); o != "completed" {
		t.Errorf("outcome %q", o)
	}

	// Byte for byte the data the SSE stream of the same job carries.
	res, err := http.Get(baseURL(n) + "/v1/jobs/" + id + "/events")
	if err != nil {
		t.Fatal(err)
	}
	sseEvs := readAll(t, res.Body)
	res.Body.Close()
	if len(sseEvs) != len(evs) {
		t.Fatalf("SSE has %d events, gRPC %d", len(sseEvs), len(evs))
	}
	for i := range evs {
		if sseEvs[i].Type != evs[i].GetKind() || sseEvs[i].Data != string(evs[i].GetDataJson()) {
			t.Errorf("event %d: SSE %s %s, gRPC %s %s", i, sseEvs[i].Type, sseEvs[i].Data, evs[i].GetKind(), evs[i].GetDataJson())
		}
	}

	js, err := c.Get(t.Context(), &pb.GetJobRequest{JobId: id})
	if err != nil {
		t.Fatal(err)
	}
	if js.GetState() != "completed" || js.GetOutcome() != "completed" || js.GetOutputs() != 4 || js.GetLastSeq() != 6 ||
		js.GetQueue() != "demo" || js.GetTtlMs() != 5000 || js.GetHandledBy() == "" || js.GetEndedAt() == "" ||
		js.GetLinks().GetSelf() != "/v1/jobs/"+id || js.GetLinks().GetEvents() != "/v1/jobs/"+id+"/events" {
		t.Errorf("Get: %v", js)
	}
	if _, err := time.Parse(time.RFC3339Nano, js.GetCreatedAt()); err != nil {
		t.Errorf("created_at %q: %v", js.GetCreatedAt(), err)
	}
	if got := metric(t, n, "switchyard_stream_ended_total", map[string]string{"transport": "grpc", "reason": "terminal"}); got != 1 {
		t.Errorf("grpc streams ended terminal = %v, want 1", got)
	}
	if got := metric(t, n, "switchyard_stream_open", map[string]string{"transport": "grpc"}); got != 0 {
		t.Errorf("grpc job streams open = %v after the stream ended", got)
	}
}

// The client leaving its Submit stream cancels the job: the worker's
// context is cancelled and the job ends cancelled, as when an SSE POST's
// client disconnects.
func TestGRPCClientLeavingCancelsJob(t *testing.T) {
	n := MustStartNode(t, nil)
	started, stopped := make(chan string, 1), make(chan error, 1)
	MustStartWorker(t, n, worker.Config{}, blockingWorker(started, stopped))
	c := jobsClient(t, n)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	st, err := c.Submit(ctx, &pb.SubmitRequest{Queue: "demo", EnvelopeJson: []byte(`{"input":"x","ttl_ms":20000}`)})
	if err != nil {
		t.Fatal(err)
	}
	acc, out := mustRecv(t, st), mustRecv(t, st)
	if acc.GetKind() != "accepted" || out.GetKind() != "output" {
		t.Fatalf("first events %s, %s", acc.GetKind(), out.GetKind())
	}
	id := recvWithin(t, started, 5*time.Second, "the worker to start")
	if id != acc.GetJobId() {
		t.Fatalf("worker ran %s, stream is %s", id, acc.GetJobId())
	}
	cancel()
	if cause := recvWithin(t, stopped, 5*time.Second, "the worker's context to be cancelled"); cause == nil {
		t.Fatal("worker context ended without a cause")
	}
	var js *pb.JobStatus
	waitFor(t, 5*time.Second, "job cancelled", func() bool {
		js, err = jobsClient(t, n).Get(t.Context(), &pb.GetJobRequest{JobId: id})
		return err == nil && js.GetState() == "cancelled"
	})
	if js.GetOutcome() != "cancelled" || js.GetCode() != "cancelled" || !strings.Contains(js.GetDetail(), "disconnected") {
		t.Errorf("job %v", js)
	}
	waitFor(t, 5*time.Second, "stream counted as client_gone", func() bool {
		return metric(t, n, "switchyard_stream_ended_total", map[string]string{"transport": "grpc", "reason": "client_gone"}) == 1
	})
}

// The gRPC twin of TestGraceWindow: a Submit stream with a grace window
// whose client leaves. A Resume with a valid token inside the window saves
// the job, which goes on to the end; without a resume the job is cancelled
// once the window has passed, not before; and a Resume without a token
// only watches — it does not save the job, and sees it cancelled when the
// window ends.
func TestGRPCGraceWindow(t *testing.T) {
	const grace = time.Second
	n := MustStartNode(t, nil)
	g := newGatedWorker()
	MustStartWorker(t, n, worker.Config{Concurrency: 3}, g.handler(50*time.Millisecond))
	c := jobsClient(t, n)
	gone := 0
	// submit starts a job with a grace window, reads up to its first output
	// and leaves; it returns once the node has seen the client go (the
	// metric moves after the window started).
	submit := func() (id string, out *pb.JobEvent, left time.Time) {
		t.Helper()
		ctx, cancel := context.WithCancel(t.Context())
		st, err := c.Submit(ctx, &pb.SubmitRequest{Queue: "demo", EnvelopeJson: []byte(`{"input":"x","ttl_ms":30000,"grace_ms":1000}`)}) // grace
		if err != nil {
			t.Fatal(err)
		}
		acc := mustRecv(t, st)
		if out = mustRecv(t, st); acc.GetKind() != "accepted" || out.GetKind() != "output" {
			t.Fatalf("first events %s, %s", acc.GetKind(), out.GetKind())
		}
		left = time.Now()
		cancel()
		gone++
		waitFor(t, 5*time.Second, "the node to see the client go", func() bool {
			return metric(t, n, "switchyard_stream_ended_total", map[string]string{"transport": "grpc", "reason": "client_gone"}) == float64(gone)
		})
		return out.GetJobId(), out, left
	}
	state := func(id string) *pb.JobStatus {
		t.Helper()
		js, err := c.Get(t.Context(), &pb.GetJobRequest{JobId: id})
		if err != nil {
			t.Fatal(err)
		}
		return js
	}

	t.Run("resumed inside the window", func(t *testing.T) {
		id, out, _ := submit()
		st, err := c.Resume(t.Context(), &pb.ResumeRequest{JobId: id, ResumeToken: out.GetResumeToken()})
		if err != nil {
			t.Fatal(err)
		}
		first := mustRecv(t, st)
		g.release(id)
		rest, err := recvAll(st)
		if err != nil {
			t.Fatalf("resumed stream: %v", err)
		}
		if end := checkContiguous(t, append([]*pb.JobEvent{first}, rest...), out.GetSeq()+1); end == nil || end.GetKind() != "done" {
			t.Fatalf("resumed stream ended with %v", end)
		}
		if js := state(id); js.GetState() != "completed" {
			t.Fatalf("job %v, want completed", js)
		}
		if got := metric(t, n, "switchyard_stream_grace_saves_total", nil); got != 1 {
			t.Errorf("grace saves = %v, want 1", got)
		}
	})

	t.Run("not resumed", func(t *testing.T) {
		id, _, left := submit()
		var js *pb.JobStatus
		waitFor(t, 10*time.Second, "the job to end", func() bool {
			js = state(id)
			return js.GetEndedAt() != ""
		})
		if waited := time.Since(left); waited < grace {
			t.Fatalf("ended %s after its client left, inside its %s grace window: %v", waited, grace, js)
		}
		if js.GetState() != "cancelled" || !strings.Contains(js.GetDetail(), "grace") {
			t.Fatalf("job %v, want cancelled for not resuming within the grace window", js)
		}
	})

	t.Run("resume without a token only watches", func(t *testing.T) {
		saves := metric(t, n, "switchyard_stream_grace_saves_total", nil)
		id, _, left := submit()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		evs, err := resumeAll(t, ctx, c, &pb.ResumeRequest{JobId: id})
		waited := time.Since(left)
		if err != nil || len(evs) == 0 {
			t.Fatalf("watcher: %v after %d events (the job was not cancelled)", err, len(evs))
		}
		if last := evs[len(evs)-1]; last.GetKind() != "error" || dataField[string](t, last, "code") != "cancelled" {
			t.Fatalf("the watcher's stream ended with %s %s, want the job's cancellation", last.GetKind(), last.GetDataJson())
		}
		if waited < grace {
			t.Fatalf("cancelled %s after its client left, inside its %s grace window", waited, grace)
		}
		if got := metric(t, n, "switchyard_stream_grace_saves_total", nil); got != saves {
			t.Errorf("grace saves = %v, want still %v: a watcher saved the job", got, saves)
		}
	})
}

// Resume with the token of event n yields n+1 to the end, for every n; the
// token of the terminal event yields OK and nothing.
func TestGRPCResumeFromEveryEvent(t *testing.T) {
	n := MustStartNode(t, nil)
	MustStartWorker(t, n, worker.Config{}, worker.Tokens(time.Millisecond))
	c := jobsClient(t, n)
	evs := submitAll(t, t.Context(), c, "demo", `{"input":"a b c d e","ttl_ms":5000}`)
	if len(evs) != 7 || evs[6].GetKind() != "done" {
		t.Fatalf("events %v", kinds(evs))
	}
	id := evs[0].GetJobId()

	all, err := resumeAll(t, t.Context(), c, &pb.ResumeRequest{JobId: id})
	if err != nil || !slices.Equal(seqs(all), []uint64{1, 2, 3, 4, 5, 6, 7}) {
		t.Fatalf("resume without a token: %v, %v", seqs(all), err)
	}
	for i, ev := range evs {
		got, err := resumeAll(t, t.Context(), c, &pb.ResumeRequest{JobId: id, ResumeToken: ev.GetResumeToken()})
		if err != nil {
			t.Fatalf("resume after %d: %v", ev.GetSeq(), err)
		}
		if want := seqs(evs[i+1:]); !slices.Equal(seqs(got), want) {
			t.Fatalf("resume after %d: seqs %v, want %v", ev.GetSeq(), seqs(got), want)
		}
		for k, g := range got {
			if w := evs[i+1+k]; g.GetKind() != w.GetKind() || string(g.GetDataJson()) != string(w.GetDataJson()) {
				t.Errorf("resume after %d: event %d is %s %s, was %s %s", ev.GetSeq(), g.GetSeq(), g.GetKind(), g.GetDataJson(), w.GetKind(), w.GetDataJson())
			}
		}
	}
	// The resumed streams' own tokens resume too.
	mid, err := resumeAll(t, t.Context(), c, &pb.ResumeRequest{JobId: id, ResumeToken: evs[1].GetResumeToken()})
	if err != nil {
		t.Fatal(err)
	}
	rest, err := resumeAll(t, t.Context(), c, &pb.ResumeRequest{JobId: id, ResumeToken: mid[1].GetResumeToken()})
	if err != nil || !slices.Equal(seqs(rest), []uint64{5, 6, 7}) {
		t.Fatalf("resume from a resumed stream's token: %v, %v", seqs(rest), err)
	}
	// Seven tokens, then two more: the empty token is not a resume.
	if got := metric(t, n, "switchyard_stream_resumes_accepted_total", map[string]string{"transport": "grpc"}); got != 9 {
		t.Errorf("resumes accepted = %v, want 9", got)
	}
}

// Every token that does not verify gets INVALID_ARGUMENT with one identical
// message and identical details, whatever the reason.
func TestGRPCInvalidResumeTokens(t *testing.T) {
	n := MustStartNode(t, nil)
	MustStartWorker(t, n, worker.Config{Concurrency: 2}, worker.Tokens(time.Millisecond))
	c := jobsClient(t, n)
	alice := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer alice")
	mallory := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer mallory")

	evsA := submitAll(t, alice, c, "demo", `{"input":"one two three","ttl_ms":5000}`)
	evsB := submitAll(t, t.Context(), c, "demo", `{"input":"other job","ttl_ms":5000}`)
	jobA, tokA := evsA[0].GetJobId(), evsA[1].GetResumeToken()
	filtered, err := resumeAll(t, alice, c, &pb.ResumeRequest{JobId: jobA, Types: []string{"output", "done"}})
	if err != nil || !slices.Equal(kinds(filtered), []string{"output", "output", "output", "done"}) {
		t.Fatalf("filtered stream: %v, %v", kinds(filtered), err)
	}
	// The one valid use of tokA: same job, caller and filter.
	if got, err := resumeAll(t, alice, c, &pb.ResumeRequest{JobId: jobA, ResumeToken: tokA}); err != nil || !slices.Equal(seqs(got), []uint64{3, 4, 5}) {
		t.Fatalf("valid token: %v, %v", seqs(got), err)
	}
	// Same key id, same position, every binding right — but not our secret.
	forger, err := resume.NewKeyring("k0", resume.GenerateKey("k0"))
	if err != nil {
		t.Fatal(err)
	}
	forged, err := forger.Sign(resume.Position{
		Stream: jobA, Generation: 1, Seq: 1, Snapshot: evsA[0].GetSnapshot(),
		Caller: resume.Fingerprint("authorization", "Bearer alice"), Filter: resume.Fingerprint("types", "*"),
	}, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	kid, rest, _ := strings.Cut(tokA, ".")
	payload, mac, _ := strings.Cut(rest, ".")

	cases := []struct {
		name  string
		ctx   context.Context
		token string
		types []string
		job   string
	}{
		{"tampered mac", alice, kid + "." + payload + "." + flipByte(mac, 3), nil, jobA},
		{"tampered payload", alice, kid + "." + flipByte(payload, len(payload)/2) + "." + mac, nil, jobA},
		{"truncated", alice, tokA[:len(tokA)-4], nil, jobA},
		{"garbage", alice, "not-a-token", nil, jobA},
		{"empty segments", alice, "..", nil, jobA},
		{"unknown key", alice, "k9." + rest, nil, jobA},
		{"oversized", alice, strings.Repeat("a", 300), nil, jobA},
		{"forged with another secret", alice, forged, nil, jobA},
		{"another job's token", alice, evsB[1].GetResumeToken(), nil, jobA},
		{"token for another job id", t.Context(), evsB[1].GetResumeToken(), nil, jobA},
		{"another caller", mallory, tokA, nil, jobA},
		{"no caller", t.Context(), tokA, nil, jobA},
		{"another filter", alice, tokA, []string{"output"}, jobA},
		{"filtered token unfiltered", alice, filtered[0].GetResumeToken(), nil, jobA},
		{"token on another job", alice, tokA, nil, evsB[0].GetJobId()},
	}
	var first *status.Status
	for _, tc := range cases {
		evs, err := resumeAll(t, tc.ctx, c, &pb.ResumeRequest{JobId: tc.job, ResumeToken: tc.token, Types: tc.types})
		if len(evs) != 0 {
			t.Errorf("%s: got events %v", tc.name, kinds(evs))
		}
		st := wantStatus(t, err, codes.InvalidArgument, "invalid_resume_token")
		if st.Message() != "invalid_resume_token: the resume token is not valid for this stream" {
			t.Errorf("%s: message %q", tc.name, st.Message())
		}
		if first == nil {
			first = st
		} else if !proto.Equal(st.Proto(), first.Proto()) {
			t.Errorf("%s: status %v differs from %v", tc.name, st.Proto(), first.Proto())
		}
	}
	var refused float64
	for _, r := range append([]string{"ahead_of_history"}, reasonsOf()...) {
		refused += metric(t, n, "switchyard_stream_resumes_refused_total", map[string]string{"transport": "grpc", "reason": r})
	}
	if refused != float64(len(cases)) {
		t.Errorf("refused resumes counted %v, want %d", refused, len(cases))
	}
}

func reasonsOf() []string {
	var out []string
	for _, r := range resume.Reasons() {
		out = append(out, string(r))
	}
	return out
}

func TestGRPCGetAndCancel(t *testing.T) {
	n := MustStartNode(t, nil)
	started, stopped := make(chan string, 1), make(chan error, 1)
	MustStartWorker(t, n, worker.Config{}, blockingWorker(started, stopped))
	c := jobsClient(t, n)

	st, err := c.Submit(t.Context(), &pb.SubmitRequest{Queue: "demo", EnvelopeJson: []byte(`{"input":"x","ttl_ms":20000}`)})
	if err != nil {
		t.Fatal(err)
	}
	id := mustRecv(t, st).GetJobId()
	recvWithin(t, started, 5*time.Second, "the worker to start")
	var js *pb.JobStatus
	waitFor(t, 5*time.Second, "the job running with its output", func() bool {
		js, err = c.Get(t.Context(), &pb.GetJobRequest{JobId: id})
		return err == nil && js.GetState() == "running" && js.GetOutputs() == 1
	})
	if js.GetJobId() != id || js.GetState() != "running" || js.GetOutcome() != "" || js.GetEndedAt() != "" ||
		js.GetRemainingMs() <= 0 || js.GetTtlMs() != 20000 || js.GetGeneration() != 1 || js.GetOutputs() != 1 {
		t.Errorf("running job: %v", js)
	}

	js, err = c.Cancel(t.Context(), &pb.CancelJobRequest{JobId: id})
	if err != nil {
		t.Fatal(err)
	}
	if js.GetState() != "cancelled" || js.GetOutcome() != "cancelled" || js.GetCode() != "cancelled" ||
		js.GetDetail() != "cancelled by request" || js.GetEndedAt() == "" || js.GetRemainingMs() != 0 {
		t.Errorf("cancelled job: %v", js)
	}
	recvWithin(t, stopped, 5*time.Second, "the worker's context to be cancelled")
	// The Submit stream ends with the terminal event, and OK.
	rest, err := recvAll(st)
	if err != nil || len(rest) == 0 || rest[len(rest)-1].GetKind() != "error" {
		t.Fatalf("stream after cancel: %v, %v", kinds(rest), err)
	}
	if code := dataField[string](t, rest[len(rest)-1], "code"); code != "cancelled" {
		t.Errorf("terminal event code %q", code)
	}
	// Cancelling an ended job changes nothing.
	again, err := c.Cancel(t.Context(), &pb.CancelJobRequest{JobId: id})
	if err != nil || again.GetState() != "cancelled" || again.GetEndedAt() != js.GetEndedAt() {
		t.Errorf("second cancel: %v, %v", again, err)
	}

	_, err = c.Get(t.Context(), &pb.GetJobRequest{JobId: "j_nosuchjob"})
	wantStatus(t, err, codes.NotFound, "job_not_found")
	_, err = c.Cancel(t.Context(), &pb.CancelJobRequest{JobId: "j_nosuchjob"})
	wantStatus(t, err, codes.NotFound, "job_not_found")
	_, err = resumeAll(t, t.Context(), c, &pb.ResumeRequest{JobId: "j_nosuchjob"})
	wantStatus(t, err, codes.NotFound, "job_not_found")
	_, err = resumeAll(t, t.Context(), c, &pb.ResumeRequest{JobId: id, Types: []string{"output", "bogus"}})
	wantStatus(t, err, codes.InvalidArgument, "invalid_field")
}

func TestGRPCSubmitRefusals(t *testing.T) {
	n := MustStartNode(t, nil)
	MustStartWorker(t, n, worker.Config{}, worker.Tokens(time.Millisecond))
	MustStartWorker(t, n, worker.Config{Queue: "other"}, worker.Tokens(time.Millisecond))
	c := jobsClient(t, n)

	submitErr := func(queue, envelope, key string) error {
		t.Helper()
		st, err := c.Submit(t.Context(), &pb.SubmitRequest{Queue: queue, EnvelopeJson: []byte(envelope), IdempotencyKey: key})
		if err != nil {
			return err
		}
		evs, err := recvAll(st)
		if err == nil {
			t.Fatalf("submit to %q %s: no error, events %v", queue, envelope, kinds(evs))
		}
		if len(evs) != 0 {
			t.Errorf("submit to %q %s: events %v before the error", queue, envelope, kinds(evs))
		}
		return err
	}
	for _, tc := range []struct {
		name, queue, envelope string
		grpc                  codes.Code
		code                  string
	}{
		{"bad queue name", "no spaces!", `{"input":"x"}`, codes.InvalidArgument, "invalid_queue_name"},
		{"malformed json", "demo", `{"input":`, codes.InvalidArgument, "malformed_json"},
		{"no envelope", "demo", ``, codes.InvalidArgument, "malformed_json"},
		{"missing input", "demo", `{"ttl_ms":1000}`, codes.InvalidArgument, "missing_input"},
		{"ttl out of range", "demo", `{"input":"x","ttl_ms":999999999}`, codes.OutOfRange, "ttl_out_of_range"},
		{"no worker on the queue", "nobody", `{"input":"x"}`, codes.Unavailable, "no_capable_worker"},
		{"no worker with the capability", "demo", `{"input":"x","capabilities":{"model":"other"}}`, codes.Unavailable, "no_capable_worker"},
	} {
		st := wantStatus(t, submitErr(tc.queue, tc.envelope, ""), tc.grpc, tc.code)
		if tc.grpc == codes.Unavailable {
			var retry *errdetails.RetryInfo
			for _, d := range st.Details() {
				if r, ok := d.(*errdetails.RetryInfo); ok {
					retry = r
				}
			}
			if retry.GetRetryDelay().AsDuration() <= 0 {
				t.Errorf("%s: no RetryInfo in %v", tc.name, st.Details())
			}
		}
	}

	// An idempotency key names one job on one queue.
	keyed, err := c.Submit(t.Context(), &pb.SubmitRequest{Queue: "demo", EnvelopeJson: []byte(`{"input":"x"}`), IdempotencyKey: "key-1"})
	if err != nil {
		t.Fatal(err)
	}
	if evs, err := recvAll(keyed); err != nil || len(evs) == 0 {
		t.Fatalf("keyed submit: %v, %v", kinds(evs), err)
	}
	wantStatus(t, submitErr("other", `{"input":"x"}`, "key-1"), codes.AlreadyExists, "idempotency_key_reused")
	if got := metric(t, n, "switchyard_stream_open", map[string]string{"transport": "grpc"}); got != 0 {
		t.Errorf("grpc job streams open = %v", got)
	}
}

// A retried Submit with the same idempotency key streams the same job from
// its start and does not own it: leaving that stream cancels nothing.
func TestGRPCIdempotentSubmitDoesNotOwnTheJob(t *testing.T) {
	n := MustStartNode(t, nil)
	MustStartWorker(t, n, worker.Config{}, worker.Tokens(50*time.Millisecond))
	c := jobsClient(t, n)
	req := &pb.SubmitRequest{Queue: "demo", EnvelopeJson: []byte(`{"input":"a b c d e f g h","ttl_ms":10000}`), IdempotencyKey: "retry-me"}

	owner, err := c.Submit(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	id := mustRecv(t, owner).GetJobId()

	ctx, cancel := context.WithCancel(t.Context())
	retry, err := c.Submit(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if ev := mustRecv(t, retry); ev.GetJobId() != id || ev.GetSeq() != 1 || ev.GetKind() != "accepted" {
		t.Fatalf("retried submit streams %v, want job %s from seq 1", ev, id)
	}
	cancel()
	waitFor(t, 5*time.Second, "the retried stream to end", func() bool {
		return metric(t, n, "switchyard_stream_ended_total", map[string]string{"transport": "grpc", "reason": "client_gone"}) == 1
	})
	evs, err := recvAll(owner)
	if err != nil || evs[len(evs)-1].GetKind() != "done" {
		t.Fatalf("owner stream: %v, %v (the retried stream's leaving must not cancel the job)", kinds(evs), err)
	}
}

// Resume tokens are one currency: an SSE id resumes a gRPC stream and a
// gRPC token resumes an SSE stream (same keyring, caller and filter).
func TestGRPCTokensAcrossTransports(t *testing.T) {
	n := MustStartNode(t, nil)
	MustStartWorker(t, n, worker.Config{}, worker.Tokens(time.Millisecond))
	c := jobsClient(t, n)

	res := post(t.Context(), t, n, "demo", `{"input":"one two three","ttl_ms":5000}`, true)
	sseEvs := readAll(t, res.Body)
	res.Body.Close()
	if len(sseEvs) != 5 {
		t.Fatalf("SSE events %v", types(sseEvs))
	}
	id := res.Header.Get("X-Job-Id")
	got, err := resumeAll(t, t.Context(), c, &pb.ResumeRequest{JobId: id, ResumeToken: sseEvs[1].LastEventID})
	if err != nil || !slices.Equal(seqs(got), []uint64{3, 4, 5}) {
		t.Fatalf("gRPC resume from an SSE id: %v, %v", seqs(got), err)
	}

	evs := submitAll(t, t.Context(), c, "demo", `{"input":"one two three","ttl_ms":5000}`)
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, baseURL(n)+"/v1/jobs/"+evs[0].GetJobId()+"/events", nil)
	req.Header.Set("Last-Event-ID", evs[1].GetResumeToken())
	res, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	sseEvs = readAll(t, res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || !slices.Equal(types(sseEvs), []string{"output", "output", "done"}) || field[uint64](t, sseEvs[0], "seq") != 3 {
		t.Fatalf("SSE resume from a gRPC token: %d %v", res.StatusCode, types(sseEvs))
	}
}

// Heartbeats carry nothing but liveness and do not keep a silent stream
// open: the idle clock ends it with a terminated event, the call ends OK,
// and the job — whose own stream the node ended — goes on; a Resume picks
// it up.
func TestGRPCHeartbeatsAndIdle(t *testing.T) {
	n := MustStartNode(t, func(c *switchyard.Config) {
		c.HTTP.Stream.Heartbeat = 30 * time.Millisecond
		c.HTTP.Stream.Setup = 200 * time.Millisecond
		c.HTTP.Stream.WriteTimeout = 200 * time.Millisecond
		c.HTTP.Stream.Idle = 400 * time.Millisecond
	})
	MustStartWorker(t, n, worker.Config{}, func(ctx context.Context, _ *worker.Job, out *worker.Output) (any, error) {
		select {
		case <-time.After(700 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		for _, w := range []string{"late ", "words"} {
			if err := out.Send(ctx, w); err != nil {
				return nil, err
			}
		}
		return nil, nil
	})
	c := jobsClient(t, n)

	evs := submitAll(t, t.Context(), c, "demo", `{"input":"x","ttl_ms":10000}`)
	if len(evs) < 3 || evs[0].GetKind() != "accepted" || evs[len(evs)-1].GetKind() != "terminated" {
		t.Fatalf("events %v, want accepted, heartbeats, terminated", kinds(evs))
	}
	for _, ev := range evs[1 : len(evs)-1] {
		if ev.GetKind() != "heartbeat" || ev.GetSeq() != 0 || ev.GetResumeToken() != "" || len(ev.GetDataJson()) != 0 ||
			ev.GetGeneration() != 0 || ev.GetSnapshot() != 0 || ev.GetJobId() != evs[0].GetJobId() {
			t.Errorf("heartbeat carries more than liveness: %v", ev)
		}
	}
	term := evs[len(evs)-1]
	if term.GetSeq() != 0 || term.GetResumeToken() != "" || dataField[string](t, term, "reason") != "idle" ||
		dataField[uint64](t, term, "resume_after_seq") != 1 || dataField[string](t, term, "job_id") != evs[0].GetJobId() {
		t.Errorf("terminated: %v %s", term, term.GetDataJson())
	}
	if got := metric(t, n, "switchyard_stream_ended_total", map[string]string{"transport": "grpc", "reason": "idle"}); got != 1 {
		t.Errorf("idle ends = %v", got)
	}
	rest, err := resumeAll(t, t.Context(), c, &pb.ResumeRequest{JobId: evs[0].GetJobId(), ResumeToken: evs[0].GetResumeToken()})
	if err != nil {
		t.Fatal(err)
	}
	var job []*pb.JobEvent
	for _, ev := range rest {
		if ev.GetKind() != "heartbeat" {
			job = append(job, ev)
		}
	}
	if !slices.Equal(kinds(job), []string{"output", "output", "done"}) || !slices.Equal(seqs(job), []uint64{2, 3, 4}) {
		t.Fatalf("resumed after the idle end: %v %v", kinds(rest), seqs(job))
	}
}

// slowNode starts a node whose streams may fall 64 events behind, with a
// burst worker of 1 KiB outputs, and returns the client (with a fixed 64
// KiB flow-control window, so not reading stalls the transport) and the
// gate that starts the burst.
func slowNode(t *testing.T, outputs int) (*switchyard.Node, pb.JobServiceClient, chan struct{}) {
	t.Helper()
	return slowNodeWith(t, grpcSlowBound{maxEvents: 64, maxBytes: 128 << 20, size: 1 << 10, pace: time.Millisecond}, outputs)
}

// grpcSlowBound is the bound a gRPC slow-consumer test trips — the other is
// out of reach (below the history's own) — with the output size of its
// burst and the pace of its slow reader.
type grpcSlowBound struct {
	bound     string // "events" or "bytes": the one under test
	maxEvents int
	maxBytes  int64
	size      int
	pace      time.Duration // the slow reader's pause after each event
}

func slowNodeWith(t *testing.T, b grpcSlowBound, outputs int) (*switchyard.Node, pb.JobServiceClient, chan struct{}) {
	t.Helper()
	n := MustStartNode(t, func(c *switchyard.Config) {
		c.HTTP.Stream.MaxLagEvents = b.maxEvents
		c.HTTP.Stream.MaxLagBytes = b.maxBytes
		c.HTTP.Stream.WriteTimeout = 2 * time.Second
		c.HTTP.Stream.Setup = time.Second
		c.HTTP.Stream.Idle = 5 * time.Second
		c.HTTP.Stream.Heartbeat = time.Second
		c.Engine.HistoryEvents = 50000
		c.Engine.HistoryBytes = 256 << 20
		c.Engine.RetainBytes = c.Engine.HistoryBytes
		c.Engine.Limits.MaxOutputBytes = 256 << 20
	})
	start := make(chan struct{})
	MustStartWorker(t, n, worker.Config{}, burstWorker(outputs, b.size, start))
	return n, jobsClient(t, n, grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10)), start
}

// checkContiguous checks that job events run from seq from, one by one,
// skipping heartbeats, and returns the last job event.
func checkContiguous(t *testing.T, evs []*pb.JobEvent, from uint64) *pb.JobEvent {
	t.Helper()
	var last *pb.JobEvent
	next := from
	for _, ev := range evs {
		switch ev.GetKind() {
		case "heartbeat", "terminated":
			continue
		}
		if ev.GetSeq() != next {
			t.Fatalf("event %s has seq %d, want %d: a gap or a duplicate", ev.GetKind(), ev.GetSeq(), next)
		}
		next++
		last = ev
	}
	return last
}

// A client too far behind is terminated — by default, not dropped from —
// and, the node having ended its stream, the job goes on; the client
// resumes from the last token it received and misses nothing. The client
// watches a job submitted for later: a job's own stream (its Submit's)
// paces its worker instead, and is never too far behind
// (TestGRPCOwnerIsPaced).
func TestGRPCSlowClientTerminatedThenResumes(t *testing.T) {
	testGRPCSlowClient(t, grpcSlowBound{bound: "events", maxEvents: 64, maxBytes: 128 << 20, size: 1 << 10, pace: time.Millisecond})
}

// The same at the byte bound: 4 KiB outputs, at most 128 KiB behind (32
// outputs), with the event bound out of reach.
func TestGRPCSlowClientByteBound(t *testing.T) {
	testGRPCSlowClient(t, grpcSlowBound{bound: "bytes", maxEvents: 40000, maxBytes: 128 << 10, size: 4 << 10, pace: 5 * time.Millisecond})
}

func testGRPCSlowClient(t *testing.T, b grpcSlowBound) {
	for _, tc := range []struct {
		name string
		read func(st grpc.ServerStreamingClient[pb.JobEvent]) ([]*pb.JobEvent, error)
	}{
		// Reads one event per pace while the worker produces several: the
		// terminated event gets through, and the call ends OK.
		{"reads slowly", func(st grpc.ServerStreamingClient[pb.JobEvent]) ([]*pb.JobEvent, error) {
			return recvPaced(st, b.pace)
		}},
		// Stops reading until the node has ended the stream: the
		// terminated event cannot get through, so the call says so
		// (or, when the node's writer had not yet filled the client's
		// window as the bound was passed, the event fits and the call
		// ends OK with it).
		{"stops reading", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const outputs = 3000
			n, c, start := slowNodeWith(t, b, outputs)
			st, err := c.Resume(t.Context(), &pb.ResumeRequest{JobId: postJob(t, n, "demo")})
			if err != nil {
				t.Fatal(err)
			}
			first := mustRecv(t, st)
			id := first.GetJobId()
			t0 := time.Now()
			close(start)
			var evs []*pb.JobEvent
			var took time.Duration // from the burst to the end of the stream
			if tc.read != nil {
				evs, err = tc.read(st)
				took = time.Since(t0)
				if err != nil || len(evs) == 0 || evs[len(evs)-1].GetKind() != "terminated" {
					t.Fatalf("slow reader: %d events (last %v), then %v", len(evs), kinds(evs[max(len(evs)-1, 0):]), err)
				}
				term := evs[len(evs)-1]
				if dataField[string](t, term, "reason") != "slow_consumer" {
					t.Errorf("terminated %s", term.GetDataJson())
				}
			} else {
				waitFor(t, 10*time.Second, "the stream to be terminated", func() bool {
					return metric(t, n, "switchyard_stream_ended_total", map[string]string{"transport": "grpc", "reason": "slow"}) == 1
				})
				took = time.Since(t0)
				evs, err = recvAll(st)
				switch {
				case status.Code(err) == codes.Unavailable && strings.HasPrefix(status.Convert(err).Message(), "write_failed: "):
				case err == nil && len(evs) > 0 && evs[len(evs)-1].GetKind() == "terminated":
					// The bound counts what waits for the writer; a
					// writer starved while the burst queued up had not
					// filled the client's 64 KiB window, and the
					// terminated event fit in it.
					t.Logf("the terminated event fit in the client's window (after %d buffered events): the stream ended OK", len(evs)-1)
				default:
					t.Fatalf("after %d buffered events: %v, want UNAVAILABLE write_failed, or the terminated event last", len(evs), err)
				}
			}
			if got := metric(t, n, "switchyard_stream_ended_total", map[string]string{"transport": "grpc", "reason": "slow"}); got != 1 {
				t.Errorf("slow ends = %v", got)
			}
			// Only the bound under test can have been passed, and promptly:
			// above it, and at most twice it.
			lagE := metric(t, n, "switchyard_stream_slow_terminated_lag_events_sum", map[string]string{"transport": "grpc"})
			lagB := metric(t, n, "switchyard_stream_slow_terminated_lag_bytes_sum", map[string]string{"transport": "grpc"})
			bound, lag := float64(b.maxEvents), lagE
			if b.bound == "bytes" {
				bound, lag = float64(b.maxBytes), lagB
			}
			if lag <= bound || lag > 2*bound {
				t.Errorf("terminated with %v %s queued, bound %v: want above the bound and at most twice it", lag, b.bound, bound)
			}
			last := checkContiguous(t, evs, 2)
			if last == nil {
				last = first
			}
			if tc.read != nil {
				term := evs[len(evs)-1]
				if after := dataField[uint64](t, term, "resume_after_seq"); after != last.GetSeq() {
					t.Errorf("resume_after_seq %d, last event received %d", after, last.GetSeq())
				}
				if te, tb := dataField[float64](t, term, "lag_events"), dataField[float64](t, term, "lag_bytes"); te != lagE || tb != lagB {
					t.Errorf("terminated event says %v events / %v bytes queued, the metric %v / %v", te, tb, lagE, lagB)
				}
			}
			t.Logf("%s bound (%d events / %d bytes), %d-byte outputs: peak queue %v events / %v bytes; stream ended %s after the burst began, after event %d",
				b.bound, b.maxEvents, b.maxBytes, b.size, lagE, lagB, took.Round(time.Millisecond), last.GetSeq())
			// The job paces nothing for a watcher: it completes, and the
			// client catches up in one stream.
			waitFor(t, 10*time.Second, "the job to complete", func() bool {
				js, err := c.Get(t.Context(), &pb.GetJobRequest{JobId: id})
				return err == nil && js.GetState() == "completed"
			})
			rest, err := resumeAll(t, t.Context(), jobsClient(t, n), &pb.ResumeRequest{JobId: id, ResumeToken: last.GetResumeToken()})
			if err != nil {
				t.Fatal(err)
			}
			if end := checkContiguous(t, rest, last.GetSeq()+1); end == nil || end.GetKind() != "done" || end.GetSeq() != outputs+2 {
				t.Fatalf("resumed stream ended with %v", end)
			}
		})
	}
}

// A stream that opted into drop-oldest is never terminated for falling
// behind: it skips ahead and says what it skipped with gap events.
func TestGRPCDropOldest(t *testing.T) {
	const outputs = 3000
	n, c, start := slowNode(t, outputs)
	res := post(t.Context(), t, n, "demo", `{"input":"x","ttl_ms":30000}`, false)
	var job struct {
		JobID string `json:"job_id"`
	}
	decode(t, res, &job)
	st, err := c.Resume(t.Context(), &pb.ResumeRequest{JobId: job.JobID, DropOldest: true})
	if err != nil {
		t.Fatal(err)
	}
	if ev := mustRecv(t, st); ev.GetKind() != "accepted" {
		t.Fatalf("first event %v", ev)
	}
	close(start)
	next, gaps, dropped := uint64(2), 0, 0
	grpctest.RecvEach(t, st.Recv, func(ev *pb.JobEvent) {
		switch ev.GetKind() {
		case "gap":
			from, to := dataField[uint64](t, ev, "from_seq"), dataField[uint64](t, ev, "to_seq")
			if from != next || to < from || dataField[uint64](t, ev, "dropped") != to-from+1 {
				t.Fatalf("gap %s at %d", ev.GetDataJson(), next)
			}
			gaps++
			dropped += int(to - from + 1)
			next = to + 1
		case "heartbeat":
		case "terminated", "resync":
			t.Fatalf("drop-oldest stream got %s %s", ev.GetKind(), ev.GetDataJson())
		default:
			if ev.GetSeq() != next {
				t.Fatalf("%s seq %d, want %d", ev.GetKind(), ev.GetSeq(), next)
			}
			next++
		}
		time.Sleep(time.Millisecond)
	})
	if next != outputs+3 || gaps == 0 {
		t.Fatalf("stream ended before %d with %d gaps", next, gaps)
	}
	t.Logf("%d gaps, %d events dropped", gaps, dropped)
	if got := metric(t, n, "switchyard_stream_drop_oldest_gaps_total", map[string]string{"transport": "grpc"}); got != float64(gaps) {
		t.Errorf("gaps counted %v, seen %d", got, gaps)
	}
}

// A job's own stream paces its worker: a client that reads slowly gets
// every output, however slow, and no terminated event, while the worker
// waits for it (the job's document says so); one that stops reading fills
// the transport's flow-control window and, making no progress for the
// stall timeout, is terminated — the write it is blocked in cut (a gRPC
// Send cannot be interrupted, so the sink waits on the handoff, not on
// Send), its call ended write_failed so that it resumes — and the job,
// the node having ended its stream, waits for it in its grace window. A
// resume within it continues with no gap, and the worker produces again.
// The handler returns at once; the sender goroutine, blocked in Send,
// ends with the stream (goleak checks it at the end of the package).
func TestGRPCOwnerIsPaced(t *testing.T) {
	const outputs, size = 1500, 4 << 10
	n := MustStartNode(t, func(c *switchyard.Config) {
		c.HTTP.Stream.WriteTimeout = 2 * time.Second
		c.HTTP.Stream.Stall = 300 * time.Millisecond
		c.HTTP.Stream.Setup = time.Second
		c.HTTP.Stream.Idle = 5 * time.Second
		c.HTTP.Stream.Heartbeat = time.Second
		c.HTTP.Stream.MaxLagEvents = 64 // what a watcher may lag; the owner's window is half
		c.Engine.Limits.MaxOutputBytes = 256 << 20
	})
	var sent atomic.Int64
	MustStartWorker(t, n, worker.Config{}, sendChunks(outputs, size, &sent))
	// A fixed 64 KiB window: no BDP growth, so not reading stalls the
	// stream after about a hundred KiB.
	c := jobsClient(t, n, grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))

	t.Run("reads slowly", func(t *testing.T) {
		st, err := c.Submit(t.Context(), &pb.SubmitRequest{Queue: "demo", EnvelopeJson: []byte(`{"input":"x","ttl_ms":60000}`)})
		if err != nil {
			t.Fatal(err)
		}
		var evs []*pb.JobEvent
		waited := false
		grpctest.RecvEach(t, st.Recv, func(ev *pb.JobEvent) {
			evs = append(evs, ev)
			if len(evs)%100 == 0 && !waited {
				js, err := c.Get(t.Context(), &pb.GetJobRequest{JobId: ev.GetJobId()})
				waited = err == nil && js.GetWaitingForReader()
			}
			time.Sleep(time.Millisecond) // at most 1000 events a second
		})
		if last := checkContiguous(t, evs, 1); last.GetKind() != "done" || last.GetSeq() != outputs+2 {
			t.Fatalf("the slow owner's stream ended with %v, want done after every output", last)
		}
		if !waited {
			t.Error("the job's document did not say it waited for its reader")
		}
		if got := metric(t, n, "switchyard_stream_ended_total", map[string]string{"transport": "grpc", "reason": "slow"}); got != 0 {
			t.Errorf("slow ends = %v: a paced reader was terminated", got)
		}
	})

	t.Run("stops reading", func(t *testing.T) {
		sent.Store(0)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		st, err := c.Submit(ctx, &pb.SubmitRequest{Queue: "demo", EnvelopeJson: []byte(`{"input":"x","ttl_ms":60000}`)})
		if err != nil {
			t.Fatal(err)
		}
		first := mustRecv(t, st)
		t0 := time.Now()
		waitFor(t, 10*time.Second, "the stream to be terminated as stalled", func() bool {
			return metric(t, n, "switchyard_stream_ended_total", map[string]string{"transport": "grpc", "reason": "slow"}) == 1
		})
		took := time.Since(t0)
		if got := metric(t, n, "switchyard_stream_open", map[string]string{"transport": "grpc"}); got != 0 {
			t.Errorf("grpc job streams open = %v after the stall", got)
		}
		js, err := c.Get(t.Context(), &pb.GetJobRequest{JobId: first.GetJobId()})
		if err != nil || js.GetState() != "running" || !js.GetWaitingForReader() {
			t.Fatalf("job after its client stopped reading: %v, %v; want running, waiting for its reader", js, err)
		}
		stalledAt := sent.Load()
		// What the client still gets is what the transport held, in order,
		// then write_failed: the terminated event could not get through.
		evs, err := recvAll(st)
		if status.Code(err) != codes.Unavailable || !strings.HasPrefix(status.Convert(err).Message(), "write_failed: ") {
			t.Fatalf("after %d buffered events: %v, want UNAVAILABLE write_failed", len(evs), err)
		}
		last := checkContiguous(t, evs, 2)
		if last == nil {
			last = first
		}
		t.Logf("stopped reading: terminated %s later (stall timeout 300ms), after event %d; the worker had sent %d outputs and waited",
			took.Round(time.Millisecond), last.GetSeq(), stalledAt)
		if stalledAt >= outputs {
			t.Fatalf("the worker sent all %d outputs to a reader that stopped", stalledAt)
		}
		rest, err := resumeAll(t, t.Context(), c, &pb.ResumeRequest{JobId: first.GetJobId(), ResumeToken: last.GetResumeToken()})
		if err != nil {
			t.Fatal(err)
		}
		if end := checkContiguous(t, rest, last.GetSeq()+1); end == nil || end.GetKind() != "done" || end.GetSeq() != outputs+2 {
			t.Fatalf("resumed stream ended with %v", end)
		}
		if got := metric(t, n, "switchyard_stream_grace_saves_total", nil); got != 1 {
			t.Errorf("grace saves = %v, want the resume to have saved the job", got)
		}
	})
}
