package apierr

import (
	"encoding/json"
	"math"
	"net/http"
	"strconv"

	"github.com/switchyard/switchyard/core"
)

// ProblemType prefixes a code to make a problem document's type.
const ProblemType = "urn:switchyard:problem:"

// Problem is an RFC 9457 problem details object with Switchyard's stable
// machine-readable code as an extension member. Ten lines of struct are
// not worth a dependency.
type Problem struct {
	Type     string `json:"type"`
	Title    string `json:"title"`
	Status   int    `json:"status"`
	Detail   string `json:"detail,omitempty"`
	Instance string `json:"instance,omitempty"`
	// Code is the stable, machine-readable reason.
	Code string `json:"code"`
	// Field names the envelope field at fault, when there is one.
	Field string `json:"field,omitempty"`
} // @name Problem

// problemOf is the problem document of ce answering a request for path.
func problemOf(ce *core.Error, path string) Problem {
	st := HTTPStatus(ce.Code)
	if ce.Code == core.CodeInvalidResumeToken {
		// Byte-identical for every bad token: not even the path varies.
		path = ""
	}
	return Problem{
		Type:     ProblemType + string(ce.Code),
		Title:    http.StatusText(st),
		Status:   st,
		Detail:   ce.Detail,
		Instance: path,
		Code:     string(ce.Code),
		Field:    ce.Field,
	}
}

// WriteProblem answers r with err as application/problem+json: the status
// from the table, Retry-After (whole seconds, rounded up) for a refusal
// that may succeed later, and a document with the core error's code,
// detail and field, its instance the request's path. A server fault (not a
// *core.Error) is answered as code internal with a fixed detail (see
// ErrorOf). WriteProblem logs nothing: a transport reports the error first
// (see Reporter).
func WriteProblem(w http.ResponseWriter, r *http.Request, err error) {
	ce := ErrorOf(err)
	p := problemOf(ce, r.URL.Path)
	setRetryAfter(w, ce)
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

// setRetryAfter sets Retry-After (whole seconds, rounded up) for a refusal
// that may succeed later.
func setRetryAfter(w http.ResponseWriter, ce *core.Error) {
	if ce.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(ce.RetryAfter.Seconds()))))
	}
}
