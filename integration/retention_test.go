package integration_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/switchyard/switchyard"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
	"github.com/switchyard/switchyard/worker"
)

// TestEvictedJobAnswers: a node that keeps one ended job (--retain-jobs 1)
// evicts the older one when the next ends; every call for an evicted job
// then answers at once with its documented answer — 404 job_not_found
// over HTTP, NotFound over gRPC — with or without a resume token that
// verified while the job was kept (docs/streams.md, "Ended jobs").
func TestEvictedJobAnswers(t *testing.T) {
	n := MustStartNode(t, func(c *switchyard.Config) { c.Engine.RetainJobs = 1 })
	MustStartWorker(t, n, worker.Config{Name: "w", Concurrency: 2}, worker.Tokens(0))
	grpcJobs := jobsClient(t, n)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	// A over SSE: its id and the token of an event in the middle.
	res := post(ctx, t, n, "demo", `{"input":"one two three"}`, true)
	evs := readAll(t, res.Body)
	res.Body.Close()
	a, aToken := res.Header.Get("X-Job-Id"), evs[1].LastEventID
	if a == "" || aToken == "" || types(evs)[len(evs)-1] != "done" {
		t.Fatalf("job A: id %q, events %v", a, types(evs))
	}
	wantHTTP(t, ctx, http.MethodGet, baseURL(n)+"/v1/jobs/"+a+"/events", aToken, http.StatusOK, "")

	// G over gRPC: ending it evicts A.
	gevs := submitAll(t, ctx, grpcJobs, "demo", `{"input":"four five"}`)
	g, gToken := gevs[0].GetJobId(), gevs[1].GetResumeToken()
	if got := metric(t, n, "switchyard_retention_evictions_total", map[string]string{"reason": "count"}); got != 1 {
		t.Fatalf("evictions{count} = %v after two jobs with --retain-jobs 1, want 1", got)
	}
	wantEvicted(t, ctx, n, grpcJobs, a, aToken)

	// B over SSE: ending it evicts G.
	res = post(ctx, t, n, "demo", `{"input":"six"}`, true)
	readAll(t, res.Body)
	res.Body.Close()
	wantEvicted(t, ctx, n, grpcJobs, g, gToken)
	if got := metric(t, n, "switchyard_retention_jobs", nil); got != 1 {
		t.Errorf("retention_jobs = %v, want 1", got)
	}
}

// wantEvicted checks every call for an evicted job: GET, its events with
// and without the token, DELETE, gRPC Get and Resume with the token.
func wantEvicted(t *testing.T, ctx context.Context, n *switchyard.Node, c pb.JobServiceClient, id, token string) {
	t.Helper()
	job := baseURL(n) + "/v1/jobs/" + id
	wantHTTP(t, ctx, http.MethodGet, job, "", http.StatusNotFound, "job_not_found")
	wantHTTP(t, ctx, http.MethodGet, job+"/events", "", http.StatusNotFound, "job_not_found")
	wantHTTP(t, ctx, http.MethodGet, job+"/events", token, http.StatusNotFound, "job_not_found")
	wantHTTP(t, ctx, http.MethodDelete, job, "", http.StatusNotFound, "job_not_found")
	if _, err := c.Get(ctx, &pb.GetJobRequest{JobId: id}); status.Code(err) != codes.NotFound {
		t.Errorf("gRPC Get of evicted %s: %v, want NotFound", id, err)
	}
	_, err := resumeAll(t, ctx, c, &pb.ResumeRequest{JobId: id, ResumeToken: token})
	if status.Code(err) != codes.NotFound {
		t.Errorf("gRPC Resume of evicted %s with its token: %v, want NotFound", id, err)
	}
}

// wantHTTP makes one request (with Last-Event-ID when token is set) and
// checks its status and, for a problem, its code.
func wantHTTP(t *testing.T, ctx context.Context, method, url, token string, wantStatus int, wantCode string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, method, url, nil)
	if token != "" {
		req.Header.Set("Last-Event-ID", token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer res.Body.Close()
	var p struct {
		Code   string `json:"code"`
		Detail string `json:"detail"`
	}
	if wantCode != "" {
		_ = jsonDecoder(res).Decode(&p)
	}
	if res.StatusCode != wantStatus || p.Code != wantCode {
		t.Errorf("%s %s (token %v): %d %s, want %d %s", method, url, token != "", res.StatusCode, p.Code, wantStatus, wantCode)
	}
	if wantCode != "" {
		t.Logf("%s %s (token %v): %d %s: %s", method, req.URL.Path, token != "", res.StatusCode, p.Code, p.Detail)
	}
}
