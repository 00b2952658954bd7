package integration_test

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/switchyard/switchyard"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
	"github.com/switchyard/switchyard/worker"
)

// Another subject's job answers exactly as a job that does not exist, on
// every route and rpc, and changes nothing; its resume token is refused to
// another subject, even an admin who may read the job.
func TestAnotherSubjectsJob(t *testing.T) {
	n := MustStartSecuredNode(t, nil)
	MustStartWorker(t, n, worker.Config{Queue: "demo", DialOptions: []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()), worker.APIKey(keyAliceWork)}}, worker.Tokens(0))
	ctx := t.Context()
	base := baseURL(n)

	// alice's job, streamed to its end, and a resume token from its stream;
	// and a second job of hers, waiting, for the cancels.
	res := keyed(t, ctx, "POST", base+"/v1/queues/demo/jobs", keyAlice, "application/json", `{"input":"a b c","ttl_ms":30000}`, "Accept", "text/event-stream")
	job := res.Header.Get("X-Job-Id")
	evs := readAll(t, res.Body)
	res.Body.Close()
	tok := evs[1].LastEventID
	if job == "" || tok == "" {
		t.Fatalf("alice's stream: job %q, events %v", job, types(evs))
	}
	MustStartWorker(t, n, worker.Config{Queue: "team-a.hold", DialOptions: []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()), worker.APIKey(keyAliceWork)}},
		func(ctx context.Context, _ *worker.Job, _ *worker.Output) (any, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		})
	running := submitAs(t, n, keyAlice, "team-a.hold", `{"input":"x","ttl_ms":30000}`)

	// What bob gets for alice's job, beside what he gets for none at all.
	for _, tc := range []struct{ method, path string }{
		{"GET", "/v1/jobs/%s"},
		{"DELETE", "/v1/jobs/%s"},
		{"GET", "/v1/jobs/%s/events"},
		{"POST", "/v1/jobs/%s/read-token"},
	} {
		theirs := keyed(t, ctx, tc.method, base+strings.Replace(tc.path, "%s", job, 1), keyBob, "", "")
		none := keyed(t, ctx, tc.method, base+strings.Replace(tc.path, "%s", "j_nosuchjob00000000", 1), keyBob, "", "")
		a, b := problemOf(t, tc.method+" theirs", theirs, readBody(t, theirs), nil, 404, "job_not_found"),
			problemOf(t, tc.method+" none", none, readBody(t, none), nil, 404, "job_not_found")
		if *a.Detail != *b.Detail || a.Title != b.Title || a.Type != b.Type {
			t.Errorf("%s %s: another's job %+v, no job %+v", tc.method, tc.path, a, b)
		}
	}
	conn := grpcConn(t, n)
	jobs := pb.NewJobServiceClient(conn)
	bob := withKey(ctx, keyBob)
	for _, tc := range []struct {
		name string
		call func(id string) error
	}{
		{"Get", func(id string) error { _, err := jobs.Get(bob, &pb.GetJobRequest{JobId: id}); return err }},
		{"Cancel", func(id string) error { _, err := jobs.Cancel(bob, &pb.CancelJobRequest{JobId: id}); return err }},
		{"Resume", func(id string) error {
			return streamErr(jobs.Resume(bob, &pb.ResumeRequest{JobId: id}))
		}},
		{"Resume with alice's token", func(id string) error {
			return streamErr(jobs.Resume(bob, &pb.ResumeRequest{JobId: id, ResumeToken: tok}))
		}},
	} {
		theirs, none := status.Convert(tc.call(job)), status.Convert(tc.call("j_nosuchjob00000000"))
		if theirs.Code() != none.Code() || theirs.Message() != none.Message() || grpcAnswer(theirs.Err()).code != "job_not_found" {
			t.Errorf("%s: another's job %v, no job %v", tc.name, theirs, none)
		}
	}
	// bob's cancels changed nothing.
	var doc struct{ State string }
	res = keyed(t, ctx, "GET", base+"/v1/jobs/"+running, keyAlice, "", "")
	if err := json.Unmarshal(readBody(t, res), &doc); err != nil || doc.State == "cancelled" {
		t.Errorf("alice's waiting job after bob's cancels: %q %v", doc.State, err)
	}

	// The resume token is bound to alice: root, who may read her job, is
	// refused it, over HTTP and gRPC; alice resumes with it.
	res = keyed(t, ctx, "GET", base+"/v1/jobs/"+job+"/events", keyRoot, "", "", "Last-Event-ID", tok)
	problemOf(t, "root with alice's token", res, readBody(t, res), nil, 400, "invalid_resume_token")
	err := streamErr(jobs.Resume(withKey(ctx, keyRoot), &pb.ResumeRequest{JobId: job, ResumeToken: tok}))
	if got := grpcAnswer(err); got.code != "invalid_resume_token" {
		t.Errorf("root's gRPC resume with alice's token: %v", got)
	}
	res = keyed(t, ctx, "GET", base+"/v1/jobs/"+job+"/events", keyAlice, "", "", "Last-Event-ID", tok)
	if rest := readAll(t, res.Body); res.StatusCode != 200 || len(rest) == 0 || field[uint64](t, rest[0], "seq") != 3 {
		t.Errorf("alice's resume: %d %v", res.StatusCode, types(rest))
	}
	res.Body.Close()
}

// /metrics needs the admin role, unless --metrics-open.
func TestMetricsOpen(t *testing.T) {
	n := MustStartSecuredNode(t, func(c *switchyard.Config) { c.HTTP.MetricsOpen = true })
	res := keyed(t, t.Context(), "GET", baseURL(n)+"/metrics", "", "", "")
	if body := readBody(t, res); res.StatusCode != 200 || !strings.Contains(string(body), "switchyard_") {
		t.Fatalf("open /metrics without a key: %d", res.StatusCode)
	}
}

// A key rotated in place (Node.ReloadAuth, what SIGHUP calls) leaves the
// streams it opened running.
func TestReloadKeepsStreams(t *testing.T) {
	path := writeKeys(t, accessKeys())
	n := MustStartNode(t, func(c *switchyard.Config) { c.Auth.File = path })
	MustStartWorker(t, n, worker.Config{Queue: "demo", DialOptions: []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()), worker.APIKey(keyAliceWork)}}, worker.Tokens(100*time.Millisecond))
	res := keyed(t, t.Context(), "POST", baseURL(n)+"/v1/queues/demo/jobs", keyAlice, "application/json",
		`{"input":"one two three four five six","ttl_ms":30000}`, "Accept", "text/event-stream")
	defer res.Body.Close()
	rotated := strings.Replace(accessKeys(), keyAlice, "alice-rotated-key-0000009", 1)
	if err := writeKeyFile(path, rotated); err != nil {
		t.Fatal(err)
	}
	if err := n.ReloadAuth(); err != nil {
		t.Fatal(err)
	}
	evs := readAll(t, res.Body)
	if last := evs[len(evs)-1]; last.Type != "done" {
		t.Fatalf("a stream opened with the rotated key: %v", types(evs))
	}
}

func writeKeyFile(path, doc string) error { return os.WriteFile(path, []byte(doc), 0o600) }
