package httpapi

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/switchyard/switchyard/core"
)

// This file bounds how a request body is read: its size (MaxBodyBytes) and
// the time it takes to arrive (BodyTimeout).
//
// The node's http.Server has a header timeout but no ReadTimeout: that one
// runs from the first byte of a request to its end, response included as
// far as reads go, and would cut every SSE stream once it fired (the
// server's background read, which notices a client that left, treats the
// expired deadline as the client gone). So the body's deadline is set per
// request, once its headers are read, and lifted once the body is read
// whole.

// bodyDeadline gives every request that carries a body BodyTimeout to
// send it whole. Without it a client that trickles its body (a byte a
// second) or stops sending holds its connection and handler for as long as
// it likes. It applies whether or not the route reads the body: a body
// left unread is drained by the server after the handler, and that read
// must end too.
func (s *Server) bodyDeadline(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil && r.Body != http.NoBody {
			// Not supported only where there is no connection to bound
			// (a test's ResponseRecorder).
			_ = setReadDeadline(w, time.Now().Add(s.cfg.BodyTimeout))
		}
		next.ServeHTTP(w, r)
	})
}

// readJSONBody is readBody for a body that must be JSON (Content-Type
// application/json or +json; else unsupported_media_type, before anything
// is read).
func (s *Server) readJSONBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if err := requireJSON(r); err != nil {
		return nil, err
	}
	return s.readBody(w, r)
}

// readBody reads a request body whole, through the byte limit and within
// the deadline bodyDeadline set, then lifts that deadline so that a
// response that streams for longer (SSE) is not cut by it. (Go's HTTP/1
// server lifts it too when the body hits its end, as it starts the read
// that notices a client leaving; this keeps it true whatever the server
// does.) A body that did not arrive in time is request_timeout (408), and
// the connection is closed after the answer: what is left of the body is
// not worth reading.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		switch {
		case errors.As(err, &tooBig):
			return nil, &core.Error{Code: core.CodeBodyTooLarge, Detail: "the body is larger than the node accepts"}
		case errors.Is(err, os.ErrDeadlineExceeded):
			w.Header().Set("Connection", "close")
			return nil, &core.Error{Code: core.CodeRequestTimeout, Detail: "the body did not arrive whole within " + s.cfg.BodyTimeout.String()}
		}
		return nil, &core.Error{Code: core.CodeMalformedJSON, Detail: "could not read the body: " + err.Error()}
	}
	_ = setReadDeadline(w, time.Time{})
	return body, nil
}

// setReadDeadline is http.NewResponseController(w).SetReadDeadline(t),
// without the controller it allocates for every call: the first writer
// down w's Unwrap chain that sets a read deadline sets it.
func setReadDeadline(w http.ResponseWriter, t time.Time) error {
	for {
		switch u := w.(type) {
		case interface{ SetReadDeadline(time.Time) error }:
			return u.SetReadDeadline(t)
		case interface{ Unwrap() http.ResponseWriter }:
			w = u.Unwrap()
		default:
			return fmt.Errorf("%w", http.ErrNotSupported)
		}
	}
}
