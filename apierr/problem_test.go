package apierr_test

import (
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/status"

	"github.com/switchyard/switchyard/apierr"
	"github.com/switchyard/switchyard/core"
)

func TestWriteProblem(t *testing.T) {
	for _, tc := range []struct {
		name       string
		err        error
		status     int
		want       apierr.Problem
		retryAfter string
	}{
		{
			name: "field", err: &core.Error{Code: core.CodeInvalidField, Field: "zone", Detail: "bad zone"}, status: 400,
			want: apierr.Problem{Type: "urn:switchyard:problem:invalid_field", Title: "Bad Request", Status: 400, Detail: "bad zone", Instance: "/v1/queues/q/jobs", Code: "invalid_field", Field: "zone"},
		},
		{
			name: "retry after rounds up", err: &core.Error{Code: core.CodeQueueFull, Detail: "full", RetryAfter: 1500 * time.Millisecond}, status: 429, retryAfter: "2",
			want: apierr.Problem{Type: "urn:switchyard:problem:queue_full", Title: "Too Many Requests", Status: 429, Detail: "full", Instance: "/v1/queues/q/jobs", Code: "queue_full"},
		},
		{
			name: "server fault", err: errors.New("open /var/lib/switchyard: permission denied"), status: 500,
			want: apierr.Problem{Type: "urn:switchyard:problem:internal", Title: "Internal Server Error", Status: 500, Detail: "the node could not complete the request", Instance: "/v1/queues/q/jobs", Code: "internal"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			apierr.WriteProblem(rec, httptest.NewRequest("POST", "/v1/queues/q/jobs", nil), tc.err)
			checkAnswer(t, rec, tc.status, "application/problem+json", tc.retryAfter)
			var got apierr.Problem
			if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("problem %+v, want %+v", got, tc.want)
			}
			if strings.Contains(rec.Body.String(), "/var/lib") {
				t.Errorf("a server fault's text reached the body: %s", rec.Body)
			}
		})
	}
}

// Every bad resume token gets the same bytes, whatever the path it came on.
func TestWriteProblemInvalidResumeTokenIsOneAnswer(t *testing.T) {
	body := func(path string) string {
		rec := httptest.NewRecorder()
		apierr.WriteProblem(rec, httptest.NewRequest("GET", path, nil), core.ErrInvalidResumeToken)
		return rec.Result().Status + "\n" + rec.Body.String()
	}
	a, b := body("/v1/jobs/j_a/events"), body("/v1/jobs/j_b/events?last_event_id=x")
	if a != b {
		t.Fatalf("two refusals differ:\n%s\n%s", a, b)
	}
	if !strings.HasPrefix(a, "400 ") || strings.Contains(a, "instance") {
		t.Fatalf("refusal %s", a)
	}
}

// A problem written from a status the gRPC side made is the problem the
// HTTP side writes for the same error, byte for byte: what lets the
// gateway answer like the chi handlers.
func TestWriteProblemFromStatusIsIdentical(t *testing.T) {
	for _, err := range []error{
		&core.Error{Code: core.CodeTTLOutOfRange, Field: "ttl_ms", Detail: "ttl_ms must be between 1 and 60000"},
		&core.Error{Code: core.CodeNoCapableWorker, Detail: "none", RetryAfter: time.Second},
		core.ErrInvalidResumeToken,
		errors.New("disk on fire"),
	} {
		direct, viaStatus := httptest.NewRecorder(), httptest.NewRecorder()
		r := httptest.NewRequest("POST", "/v1/queues/q/jobs", nil)
		apierr.WriteProblem(direct, r, err)
		apierr.WriteProblem(viaStatus, r, apierr.FromStatus(status.Convert(apierr.Status(err))))
		if direct.Code != viaStatus.Code || direct.Body.String() != viaStatus.Body.String() ||
			direct.Header().Get("Retry-After") != viaStatus.Header().Get("Retry-After") {
			t.Errorf("%v:\n direct %d %s via status %d %s", err, direct.Code, direct.Body, viaStatus.Code, viaStatus.Body)
		}
	}
}

// checkAnswer checks an error answer's status, Content-Type and
// Retry-After ("" for none).
func checkAnswer(t *testing.T, rec *httptest.ResponseRecorder, status int, ctype, retryAfter string) {
	t.Helper()
	if rec.Code != status {
		t.Errorf("status %d, want %d", rec.Code, status)
	}
	if got := rec.Header().Get("Content-Type"); got != ctype {
		t.Errorf("Content-Type %q, want %q", got, ctype)
	}
	if got := rec.Header().Get("Retry-After"); got != retryAfter {
		t.Errorf("Retry-After %q, want %q", got, retryAfter)
	}
}
