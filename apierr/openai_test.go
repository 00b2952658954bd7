package apierr_test

import (
	"encoding/json"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/switchyard/switchyard/apierr"
	"github.com/switchyard/switchyard/core"
)

// The OpenAI shape of an error is the table's status with a type derived
// from it, the code as is, the field as param (null without one), and
// Retry-After where a problem document would carry it.
func TestWriteOpenAIError(t *testing.T) {
	for _, tc := range []struct {
		err        error
		status     int
		typ, code  string
		param      any
		retryAfter string
	}{
		{&core.Error{Code: core.CodeInvalidField, Field: "n", Detail: "n must be 1"}, 400, "invalid_request_error", "invalid_field", "n", ""},
		{&core.Error{Code: core.CodeMalformedJSON, Detail: "not JSON"}, 400, "invalid_request_error", "malformed_json", nil, ""},
		{&core.Error{Code: core.CodeModelNotFound, Field: "model", Detail: "no such model"}, 404, "invalid_request_error", "model_not_found", "model", ""},
		{&core.Error{Code: core.CodeQueueFull, Detail: "full", RetryAfter: 1500 * time.Millisecond}, 429, "rate_limit_error", "queue_full", nil, "2"},
		{&core.Error{Code: core.CodeNoCapableWorker, Detail: "none now", RetryAfter: time.Second}, 503, "server_error", "no_capable_worker", nil, "1"},
		{&core.Error{Code: core.CodeWorkerError, Detail: "boom"}, 502, "server_error", "worker_error", nil, ""},
		{&core.Error{Code: "a_code_from_a_newer_peer", Detail: "?"}, 500, "server_error", "a_code_from_a_newer_peer", nil, ""},
		{errors.New("open /var/lib/x: permission denied"), 500, "server_error", "internal", nil, ""},
	} {
		t.Run(tc.code, func(t *testing.T) {
			rec := httptest.NewRecorder()
			apierr.WriteOpenAIError(rec, tc.err)
			checkAnswer(t, rec, tc.status, "application/json", tc.retryAfter)
			var body struct {
				Error map[string]any `json:"error"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatalf("%v: %s", err, rec.Body)
			}
			e := body.Error
			if e["type"] != tc.typ || e["code"] != tc.code || e["param"] != tc.param {
				t.Errorf("error %v, want type %s code %s param %v", e, tc.typ, tc.code, tc.param)
			}
			if _, ok := e["param"]; !ok {
				t.Error("no param member: OpenAI sends it, null when no field is at fault")
			}
			if msg, _ := e["message"].(string); msg == "" || msg == "open /var/lib/x: permission denied" {
				t.Errorf("message %q: want the detail, never a server fault's text", msg)
			}
		})
	}
}
