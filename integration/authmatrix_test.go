package integration_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/switchyard/switchyard/openapi"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
	"github.com/switchyard/switchyard/worker"
)

// The auth matrix: every route of the OpenAPI document (which a test holds
// equal to the router) and every rpc of the public gRPC services, each
// called five ways — with no key, an unknown key, a right key without the
// role, a right key on a forbidden queue, and the right key — with the
// exact status and code of each. A route or rpc the table does not name
// fails the test, so a new one cannot be missed.

// The five columns.
const (
	colNoKey = iota
	colUnknown
	colNoRole
	colForbidden
	colRight
	columns
)

var columnNames = [columns]string{"no key", "unknown key", "key without the role", "key on a forbidden queue", "right key"}

// answer is what a call is expected to get: an HTTP status and problem code
// ("" for a success), or a gRPC code and ErrorInfo reason.
type answer struct {
	status int
	grpc   codes.Code
	code   string
}

func (a answer) String() string {
	if a.status != 0 {
		if a.code == "" {
			return fmt.Sprint(a.status)
		}
		return fmt.Sprintf("%d %s", a.status, a.code)
	}
	if a.code == "" {
		return a.grpc.String()
	}
	return fmt.Sprintf("%s %s", a.grpc, a.code)
}

var (
	unauthenticated = answer{status: 401, code: "unauthenticated"}
	denied          = answer{status: 403, code: "permission_denied"}
	na              = answer{code: "-"} // the column does not apply
	grpcUnauth      = answer{grpc: codes.Unauthenticated, code: "unauthenticated"}
	grpcDenied      = answer{grpc: codes.PermissionDenied, code: "permission_denied"}
	grpcOK          = answer{grpc: codes.OK}
)

func ok(status int) answer { return answer{status: status} }

// httpRow is one route: which key each column uses, how to call it, and
// what each column must get.
type httpRow struct {
	// noRole and forbidden are the keys of those columns ("" when the
	// column does not apply: an open route, or one without a queue).
	noRole, forbidden, right string
	// call makes the request with key; forbidden says the call should
	// name the forbidden queue.
	call func(key string, forbidden bool) *http.Response
	want [columns]answer
}

// open is the row of a route anyone may call.
func open(call func(key string, forbidden bool) *http.Response, status int) httpRow {
	return httpRow{call: call, want: [columns]answer{ok(status), ok(status), na, na, ok(status)}}
}

func TestAuthMatrix(t *testing.T) {
	n := MustStartSecuredNode(t, nil)
	ctx := t.Context()
	base := baseURL(n)
	// Workers that hold the work key: tokens on demo, the chat worker on
	// the front door's queue.
	workerOpts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), worker.APIKey(keyAliceWork)}
	MustStartWorker(t, n, worker.Config{Queue: "demo", DialOptions: workerOpts}, worker.Tokens(0))
	MustStartWorker(t, n, worker.Config{Queue: "chat", DialOptions: workerOpts}, worker.Chat(0))
	job := submitAs(t, n, keyAlice, "demo", `{"input":"a b","ttl_ms":30000}`)
	// An HTTP worker session of alice's work key, for the session's posts.
	sessRes := keyed(t, ctx, "POST", base+"/v1/queues/team-a.sess/workers", keyAliceWork, "application/json", `{}`)
	session := readSession(t, sessRes)

	req := func(method, path, ctype, body string, header ...string) func(string, bool) *http.Response {
		return func(key string, forbidden bool) *http.Response {
			p := path
			if forbidden {
				p = strings.ReplaceAll(p, "{queue}", "forbidden")
			}
			p = strings.NewReplacer("{queue}", "demo", "{id}", job, "{session}", session, "{job}", "j_none", "{model}", "demo").Replace(p)
			return keyed(t, ctx, method, base+p, key, ctype, body, header...)
		}
	}
	post := func(path, body string, header ...string) func(string, bool) *http.Response {
		return req("POST", path, "application/json", body, header...)
	}
	get := func(path string, header ...string) func(string, bool) *http.Response {
		return req("GET", path, "", "", header...)
	}
	// The rows of the document's operations, by "method path".
	rows := map[string]httpRow{
		"post /v1/queues/{queue}/jobs": {keyAliceWork, keyAlice, keyAlice, post("/v1/queues/{queue}/jobs", `{"input":"x","ttl_ms":5000}`),
			[columns]answer{unauthenticated, unauthenticated, denied, denied, ok(202)}},
		"get /v1/jobs/{id}": {keyAliceWork, "", keyAlice, get("/v1/jobs/{id}"),
			[columns]answer{unauthenticated, unauthenticated, denied, na, ok(200)}},
		"delete /v1/jobs/{id}": {keyAliceWork, "", keyAlice, req("DELETE", "/v1/jobs/{id}", "", ""),
			[columns]answer{unauthenticated, unauthenticated, denied, na, ok(200)}},
		"get /v1/jobs/{id}/events": {keyAliceWork, "", keyAlice, get("/v1/jobs/{id}/events"),
			[columns]answer{unauthenticated, unauthenticated, denied, na, ok(200)}},
		"post /v1/jobs/{id}/read-token": {keyAliceWork, "", keyAlice, post("/v1/jobs/{id}/read-token", ``),
			[columns]answer{unauthenticated, unauthenticated, denied, na, ok(200)}},
		"get /v1/cluster/nodes": {keyAlice, "", keyRoot, get("/v1/cluster/nodes"),
			[columns]answer{unauthenticated, unauthenticated, denied, na, ok(200)}},
		"get /v1/cluster/events": {keyAlice, "", keyRoot, get("/v1/cluster/events"),
			[columns]answer{unauthenticated, unauthenticated, denied, na, ok(200)}},
		"post /v1/cluster/read-token": {keyAlice, "", keyRoot, post("/v1/cluster/read-token", ``),
			[columns]answer{unauthenticated, unauthenticated, denied, na, ok(200)}},
		"get /v1/cluster/members": {keyAlice, "", keyRoot, get("/v1/cluster/members"),
			[columns]answer{unauthenticated, unauthenticated, denied, na, ok(200)}},
		// The right key's calls are refused past authorization, so that
		// the matrix changes no membership.
		"post /v1/cluster/members": {keyAlice, "", keyRoot, post("/v1/cluster/members", `{"name":"bad name","peer_url":"https://127.0.0.1:1"}`),
			[columns]answer{unauthenticated, unauthenticated, denied, na, {status: 400, code: "invalid_member"}}},
		"delete /v1/cluster/members/{member}": {keyAlice, "", keyRoot, req("DELETE", "/v1/cluster/members/nobody", "", ""),
			[columns]answer{unauthenticated, unauthenticated, denied, na, {status: 404, code: "member_not_found"}}},
		"get /v1/queues": {keyAlice, "", keyRoot, get("/v1/queues"),
			[columns]answer{unauthenticated, unauthenticated, denied, na, ok(200)}},
		"get /v1/queues/{queue}": {keyAlice, "", keyRoot, get("/v1/queues/{queue}"),
			[columns]answer{unauthenticated, unauthenticated, denied, na, ok(200)}},
		"post /v1/queues/{queue}/workers": {keyAlice, keyAliceWork, keyAliceWork, post("/v1/queues/{queue}/workers", `{}`),
			[columns]answer{unauthenticated, unauthenticated, denied, denied, ok(200)}},
		"post /v1/workers/{session}/heartbeat": {keyAlice, "", keyAliceWork, post("/v1/workers/{session}/heartbeat", ``),
			[columns]answer{unauthenticated, unauthenticated, denied, na, ok(204)}},
		"post /openai/v1/chat/completions": {keyAliceWork, keyBob, keyAlice,
			post("/openai/v1/chat/completions", `{"model":"demo","messages":[{"role":"user","content":"hi"}]}`),
			[columns]answer{unauthenticated, unauthenticated, denied, denied, ok(200)}},
		"get /openai/v1/models": {keyAliceWork, keyBob, keyAlice, get("/openai/v1/models"),
			[columns]answer{unauthenticated, unauthenticated, denied, denied, ok(200)}},
		"get /openai/v1/models/{model}": {keyAliceWork, keyBob, keyAlice, get("/openai/v1/models/{model}"),
			[columns]answer{unauthenticated, unauthenticated, denied, denied, ok(200)}},
		"get /metrics": {keyAlice, "", keyRoot, get("/metrics"),
			[columns]answer{unauthenticated, unauthenticated, denied, na, ok(200)}},
		"get /":             open(get("/"), 200),
		"head /":            open(req("HEAD", "/", "", ""), 200),
		"get /healthz":      open(get("/healthz"), 200),
		"get /readyz":       open(get("/readyz"), 200),
		"get /openapi.json": open(get("/openapi.json"), 200),
		"get /openapi.yaml": open(get("/openapi.yaml"), 200),
		"get /docs":         open(get("/docs"), 200),
	}
	// A session's posts about a job: the key passes, and the post is
	// refused by the session (it holds no job j_none).
	for _, verb := range []string{"accept", "reject", "output", "complete", "fail"} {
		rows["post /v1/workers/{session}/jobs/{job}/"+verb] = httpRow{keyAlice, "", keyAliceWork,
			post("/v1/workers/{session}/jobs/{job}/"+verb, `{"generation":1,"data":"x"}`),
			[columns]answer{unauthenticated, unauthenticated, denied, na, {status: 409, code: "job_not_held"}}}
	}

	ops, err := openapi.Operations()
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range ops {
		if _, ok := rows[op]; !ok {
			t.Errorf("the document's %s has no row in the auth matrix: add one", op)
		}
	}
	for op := range rows {
		if !slices.Contains(ops, op) {
			t.Errorf("the auth matrix has a row for %s, which the document does not have", op)
		}
	}
	table := runAuthMatrix(t, "HTTP route", rows, func(row httpRow) [columns]answer { return row.want },
		func(op string, row httpRow, col int) (answer, bool) {
			keys := [columns]string{"", keyUnknown, row.noRole, row.forbidden, row.right}
			if keys[col] == "" && col != colNoKey && col != colRight {
				t.Errorf("%s: column %q has an answer but no key", op, columnNames[col])
				return answer{}, false
			}
			key := keys[col]
			if row.right == "" && col == colRight {
				key = keyAlice // an open route: any key
			}
			res := row.call(key, col == colForbidden)
			got := answer{status: res.StatusCode}
			if res.StatusCode >= 400 {
				got.code = problemCode(readBody(t, res))
			} else {
				drainClose(res)
			}
			if res.StatusCode == 401 && res.Header.Get("WWW-Authenticate") == "" {
				t.Errorf("%s, %s: 401 without WWW-Authenticate", op, columnNames[col])
			}
			return got, true
		})

	// gRPC: every rpc of the public services.
	conn := grpcConn(t, n)
	jobs, cluster, workers := pb.NewJobServiceClient(conn), pb.NewClusterServiceClient(conn), pb.NewWorkerServiceClient(conn)
	queue := func(forbidden bool) string {
		if forbidden {
			return "forbidden"
		}
		return "demo"
	}
	type grpcRow struct {
		noRole, forbidden, right string
		call                     func(ctx context.Context, forbidden bool) error
		want                     [columns]answer
	}
	access := [columns]answer{grpcUnauth, grpcUnauth, grpcDenied, grpcDenied, grpcOK}
	noQueue := [columns]answer{grpcUnauth, grpcUnauth, grpcDenied, na, grpcOK}
	grpcRows := map[string]grpcRow{
		pb.WorkerService_Connect_FullMethodName: {keyAlice, keyAliceWork, keyAliceWork, func(ctx context.Context, forbidden bool) error {
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			st, err := workers.Connect(ctx)
			if err != nil {
				return err
			}
			// A Send after the server ended the stream (a refusal that came
			// first) returns io.EOF; the refusal itself is Recv's to tell.
			if err := st.Send(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Register{Register: &pb.Register{Queue: queue(forbidden), Capabilities: []string{"model=demo"}}}}); err != nil && !errors.Is(err, io.EOF) {
				return err
			}
			_, err = st.Recv()
			return err
		}, access},
		pb.JobService_Submit_FullMethodName: {keyAliceWork, keyAlice, keyAlice, func(ctx context.Context, forbidden bool) error {
			return streamErr(jobs.Submit(ctx, &pb.SubmitRequest{Queue: queue(forbidden), EnvelopeJson: []byte(`{"input":"x","ttl_ms":5000}`)}))
		}, access},
		pb.JobService_Resume_FullMethodName: {keyAliceWork, "", keyAlice, func(ctx context.Context, _ bool) error {
			return streamErr(jobs.Resume(ctx, &pb.ResumeRequest{JobId: job}))
		}, noQueue},
		pb.JobService_SubmitBatched_FullMethodName: {keyAliceWork, keyAlice, keyAlice, func(ctx context.Context, forbidden bool) error {
			return batchedStreamErr(jobs.SubmitBatched(ctx, &pb.SubmitRequest{Queue: queue(forbidden), EnvelopeJson: []byte(`{"input":"x","ttl_ms":5000}`)}))
		}, access},
		pb.JobService_ResumeBatched_FullMethodName: {keyAliceWork, "", keyAlice, func(ctx context.Context, _ bool) error {
			return batchedStreamErr(jobs.ResumeBatched(ctx, &pb.ResumeRequest{JobId: job}))
		}, noQueue},
		pb.JobService_Get_FullMethodName: {keyAliceWork, "", keyAlice, func(ctx context.Context, _ bool) error {
			_, err := jobs.Get(ctx, &pb.GetJobRequest{JobId: job})
			return err
		}, noQueue},
		pb.JobService_Cancel_FullMethodName: {keyAliceWork, "", keyAlice, func(ctx context.Context, _ bool) error {
			_, err := jobs.Cancel(ctx, &pb.CancelJobRequest{JobId: job})
			return err
		}, noQueue},
		pb.ClusterService_ListNodes_FullMethodName: {keyAlice, "", keyRoot, func(ctx context.Context, _ bool) error {
			_, err := cluster.ListNodes(ctx, &pb.ListNodesRequest{})
			return err
		}, noQueue},
		pb.ClusterService_ListQueues_FullMethodName: {keyAlice, "", keyRoot, func(ctx context.Context, _ bool) error {
			_, err := cluster.ListQueues(ctx, &pb.ListQueuesRequest{})
			return err
		}, noQueue},
		pb.ClusterService_GetQueue_FullMethodName: {keyAlice, "", keyRoot, func(ctx context.Context, _ bool) error {
			_, err := cluster.GetQueue(ctx, &pb.GetQueueRequest{Queue: "demo"})
			return err
		}, noQueue},
	}
	var rpcs []string
	for _, sd := range []grpc.ServiceDesc{pb.JobService_ServiceDesc, pb.ClusterService_ServiceDesc, pb.WorkerService_ServiceDesc} {
		for _, m := range sd.Methods {
			rpcs = append(rpcs, "/"+sd.ServiceName+"/"+m.MethodName)
		}
		for _, s := range sd.Streams {
			rpcs = append(rpcs, "/"+sd.ServiceName+"/"+s.StreamName)
		}
	}
	for _, rpc := range rpcs {
		if _, ok := grpcRows[rpc]; !ok {
			t.Errorf("rpc %s has no row in the auth matrix: add one", rpc)
		}
	}
	table = append(table, "")
	table = append(table, runAuthMatrix(t, "gRPC method", grpcRows, func(row grpcRow) [columns]answer { return row.want },
		func(_ string, row grpcRow, col int) (answer, bool) {
			keys := [columns]string{"", keyUnknown, row.noRole, row.forbidden, row.right}
			return grpcAnswer(row.call(withKey(ctx, keys[col]), col == colForbidden)), true
		})...)
	t.Logf("the auth matrix as it ran:\n%s", strings.Join(table, "\n"))
}

// runAuthMatrix runs a matrix's rows, by name in order: call answers a
// row's call at a column (false: no answer to check, nor a cell), for every
// column the row expects an answer at (want), and the test fails where the
// answer is not the one expected. It returns the matrix as it ran: a row of
// column names after title, then a row per row.
func runAuthMatrix[R any](t *testing.T, title string, rows map[string]R, want func(R) [columns]answer, call func(name string, row R, col int) (answer, bool)) []string {
	t.Helper()
	table := []string{sprintRow(append([]string{title}, columnNames[:]...)...)}
	for _, name := range slices.Sorted(maps.Keys(rows)) {
		row := rows[name]
		cells := []string{name}
		for col := range columns {
			w := want(row)[col]
			if w == na {
				cells = append(cells, "-")
				continue
			}
			got, ok := call(name, row, col)
			if !ok {
				continue
			}
			if got != w {
				t.Errorf("%s, %s: got %v, want %v", name, columnNames[col], got, w)
			}
			cells = append(cells, got.String())
		}
		table = append(table, sprintRow(cells...))
	}
	return table
}

// grpcAnswer is what a call ended with: OK, or its code and reason.
func grpcAnswer(err error) answer {
	if err == nil || errors.Is(err, io.EOF) {
		return grpcOK
	}
	st := status.Convert(err)
	a := answer{grpc: st.Code()}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			a.code = info.GetReason()
		}
	}
	return a
}

// readSession reads an HTTP worker session's registered event and returns
// its session id; the stream stays open until the test ends.
func readSession(tb testing.TB, res *http.Response) string {
	tb.Helper()
	if res.StatusCode != 200 {
		tb.Fatalf("open session: %d %s", res.StatusCode, readBody(tb, res))
	}
	tb.Cleanup(func() { _ = res.Body.Close() })
	buf := make([]byte, 4096)
	var got strings.Builder
	for !strings.Contains(got.String(), "\n\n") {
		n, err := res.Body.Read(buf)
		got.Write(buf[:n])
		if err != nil {
			tb.Fatalf("read the registered event: %v (%q)", err, got.String())
		}
	}
	_, data, _ := strings.Cut(got.String(), "data: ")
	var reg struct{ Session string }
	if err := json.Unmarshal([]byte(strings.TrimSpace(strings.SplitN(data, "\n", 2)[0])), &reg); err != nil || reg.Session == "" {
		tb.Fatalf("registered event %q: %v", got.String(), err)
	}
	return reg.Session
}
