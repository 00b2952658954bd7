package apierr

import (
	"encoding/json"
	"net/http"

	"github.com/switchyard/switchyard/core"
)

// The OpenAI-compatible front door (httpapi, under /openai/) answers in
// the shape OpenAI's SDKs parse, {"error": {message, type, param, code}},
// instead of a problem document. Nothing about it is a second map: the
// status is the table's, code is the stable code, param the core error's
// field, and type is derived from the status (OpenAIType).

// OpenAIError is the error object of an OpenAI-style error response, and
// of the error chunk that ends a chat completion stream early.
type OpenAIError struct {
	// Message is the core error's detail.
	Message string `json:"message"`
	// Type is OpenAIType of the code.
	Type string `json:"type"`
	// Param names the request field at fault (null when none).
	Param *string `json:"param" extensions:"x-nullable"`
	// Code is the stable, machine-readable code, as in docs/errors.md.
	Code string `json:"code"`
} // @name OpenAIError

// OpenAIErrorResponse is the body of every error the OpenAI-compatible
// routes answer with.
type OpenAIErrorResponse struct {
	Error OpenAIError `json:"error"`
} // @name OpenAIErrorResponse

// OpenAI error types, the coarse class an OpenAI SDK reports next to the
// status.
const (
	OpenAIInvalidRequest = "invalid_request_error"
	OpenAIAuthentication = "authentication_error"
	OpenAIPermission     = "permission_error"
	OpenAIRateLimit      = "rate_limit_error"
	OpenAIServer         = "server_error"
)

// OpenAIType returns the OpenAI error type of code, derived from the HTTP
// status the table gives it, so that it can never disagree with the
// status: 401 authentication_error, 403 permission_error, 429
// rate_limit_error, any other 4xx invalid_request_error (OpenAI's own type
// for 400 and for an unknown model's 404), and 5xx server_error — which is
// also what a code the table does not know gets (its status is 500).
func OpenAIType(code core.Code) string {
	switch st := HTTPStatus(code); {
	case st == http.StatusUnauthorized:
		return OpenAIAuthentication
	case st == http.StatusForbidden:
		return OpenAIPermission
	case st == http.StatusTooManyRequests:
		return OpenAIRateLimit
	case st >= 500:
		return OpenAIServer
	default:
		return OpenAIInvalidRequest
	}
}

// OpenAIErrorOf returns the error object err is answered with on the
// OpenAI-compatible routes. A server fault (not a *core.Error) is code
// internal with a fixed message, as everywhere (see ErrorOf).
func OpenAIErrorOf(err error) OpenAIError {
	ce := ErrorOf(err)
	oe := OpenAIError{Message: ce.Detail, Type: OpenAIType(ce.Code), Code: string(ce.Code)}
	if ce.Field != "" {
		field := ce.Field
		oe.Param = &field
	}
	return oe
}

// WriteOpenAIError answers with err in the OpenAI error shape: the table's
// status, Retry-After as WriteProblem sends it (OpenAI's SDKs honour it
// when they retry 429 and 5xx), and {"error": OpenAIErrorOf(err)}. Like
// WriteProblem it logs nothing.
func WriteOpenAIError(w http.ResponseWriter, err error) {
	ce := ErrorOf(err)
	setRetryAfter(w, ce)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(HTTPStatus(ce.Code))
	_ = json.NewEncoder(w).Encode(OpenAIErrorResponse{Error: OpenAIErrorOf(ce)})
}
