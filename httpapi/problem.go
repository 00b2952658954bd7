package httpapi

import (
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strconv"

	"github.com/switchyard/switchyard/core"
)

// Codes the HTTP layer adds to core's. Every code is documented in
// docs/errors.md; clients match on code, never on detail.
const (
	CodeUnsupportedMediaType core.Code = "unsupported_media_type"
	CodeBodyTooLarge         core.Code = "body_too_large"
	CodeNotFound             core.Code = "not_found"
	CodeMethodNotAllowed     core.Code = "method_not_allowed"
	CodeInternal             core.Code = "internal"
)

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
}

// statusOf is the one place that maps a code to an HTTP status.
func statusOf(code core.Code) int {
	switch code {
	case core.CodeMalformedJSON, core.CodeInvalidField, core.CodeUnsupportedVersion,
		core.CodeMissingInput, core.CodeInvalidQueueName, CodeInvalidResumeToken:
		return http.StatusBadRequest
	case CodeUnsupportedMediaType:
		return http.StatusUnsupportedMediaType
	case CodeBodyTooLarge, core.CodeInputTooLarge:
		return http.StatusRequestEntityTooLarge
	case core.CodeTTLOutOfRange, core.CodeLimitAboveCeiling:
		return http.StatusUnprocessableEntity
	case core.CodeQueueFull, core.CodeQueueBytesFull:
		return http.StatusTooManyRequests
	case core.CodeNoCapableWorker, core.CodeDraining, core.CodeDispatcherUnavailable:
		return http.StatusServiceUnavailable
	case core.CodeJobNotFound, CodeNotFound:
		return http.StatusNotFound
	case core.CodeIdempotencyReuse:
		return http.StatusConflict
	case CodeMethodNotAllowed:
		return http.StatusMethodNotAllowed
	case core.CodeRequestTimeout:
		return http.StatusRequestTimeout
	}
	return http.StatusInternalServerError
}

// writeError writes err as problem+json. Errors that are not core.Error are
// server faults: logged, counted and shown only as "internal".
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	var ce *core.Error
	if !errors.As(err, &ce) {
		s.log.Warn("request failed", "path", r.URL.Path, "err", err)
		ce = &core.Error{Code: CodeInternal, Detail: "the node could not complete the request"}
	} else {
		s.log.Debug("request refused", "path", r.URL.Path, "code", ce.Code, "detail", ce.Detail)
	}
	writeProblem(w, r, ce)
}

func writeProblem(w http.ResponseWriter, r *http.Request, ce *core.Error) {
	st := statusOf(ce.Code)
	instance := r.URL.Path
	if ce.Code == CodeInvalidResumeToken {
		// Byte-identical for every bad token: not even the path varies.
		instance = ""
	}
	if ce.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(ce.RetryAfter.Seconds()))))
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(st)
	_ = json.NewEncoder(w).Encode(Problem{
		Type:     "urn:switchyard:problem:" + string(ce.Code),
		Title:    http.StatusText(st),
		Status:   st,
		Detail:   ce.Detail,
		Instance: instance,
		Code:     string(ce.Code),
		Field:    ce.Field,
	})
}
