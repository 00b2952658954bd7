package integration_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
	sse "github.com/tmaxmax/go-sse"

	"github.com/switchyard/switchyard/openapi"
)

// docCheck holds every exchange it carries to the node's OpenAPI document
// (the served one, openapi.JSON) with kin-openapi's openapi3filter: the
// request must be one the document allows, or else be refused (a 4xx);
// the response's status must be documented for its operation (or be an
// error its default answer covers), in a documented media type, its
// headers and body valid against their schemas. An event stream is held
// event by event: each event, as {event, id, data} with its data parsed
// as JSON (or kept as text when it is not JSON: OpenAI's [DONE]), must
// validate against the stream's schema, which is a oneOf on the event
// name (docs/api.md, "Event streams"). A mismatch fails the test.
//
// It also counts what it saw, operation by operation, status by status
// and media type by media type, so that a test can require every answer
// the document promises to have been seen (missing).
type docCheck struct {
	t      testing.TB
	doc    *openapi3.T
	router routers.Router

	mu   sync.Mutex
	seen map[string]bool // "operationId status media"
	n    int
}

// newDocCheck loads the embedded document for checking exchanges with
// the nodes at any address.
func newDocCheck(tb testing.TB) *docCheck {
	tb.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(openapi.JSON)
	if err != nil {
		tb.Fatal(err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		tb.Fatalf("the served document is not valid OpenAPI: %v", err)
	}
	// The document's server is "/", the node that serves it: every node
	// of the test is one.
	doc.Servers = openapi3.Servers{{URL: "http://{host}", Variables: map[string]*openapi3.ServerVariable{"host": {Default: "127.0.0.1"}}}}
	router, err := legacy.NewRouter(doc)
	if err != nil {
		tb.Fatal(err)
	}
	return &docCheck{t: tb, doc: doc, router: router, seen: map[string]bool{}}
}

// client is an HTTP client whose every exchange is checked.
func (dc *docCheck) client() *http.Client { return &http.Client{Transport: dc} }

// RoundTrip implements http.RoundTripper.
func (dc *docCheck) RoundTrip(req *http.Request) (*http.Response, error) {
	var reqBody []byte
	if req.Body != nil {
		var err error
		if reqBody, err = io.ReadAll(req.Body); err != nil {
			return nil, err
		}
		_ = req.Body.Close()
		req.Body = io.NopCloser(bytes.NewReader(reqBody))
	}
	res, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	what := req.Method + " " + req.URL.RequestURI()
	fail := func(format string, args ...any) {
		dc.t.Errorf("%s → %d %s: %s", what, res.StatusCode, res.Header.Get("Content-Type"), fmt.Sprintf(format, args...))
	}
	ct := res.Header.Get("Content-Type")
	mt := strings.TrimSpace(strings.Split(ct, ";")[0])

	route, params, ferr := dc.router.FindRoute(req)
	if ferr != nil && (errors.Is(ferr, routers.ErrMethodNotAllowed) || dc.pathDefault(req) != nil) {
		// A method the path does not have: no operation of the path can
		// list the 405, and its default answer is the one that says it.
		dc.record("method_not_allowed", res.StatusCode, mt)
		if res.StatusCode != http.StatusMethodNotAllowed {
			fail("a method the document does not have for this path was not refused 405")
		}
		body := dc.readBody(res)
		dc.checkBody(fail, dc.pathDefault(req), mt, body)
		return res, nil
	}
	if ferr != nil {
		fail("not an operation of the document: %v", ferr)
		return res, nil
	}
	op := route.Operation
	in := &openapi3filter.RequestValidationInput{
		Request: cloneWithBody(req, reqBody), PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, MultiError: true},
	}
	if err := openapi3filter.ValidateRequest(req.Context(), in); err != nil && res.StatusCode < 400 {
		fail("the node took a request the document does not allow: %v", err)
	}
	status := fmt.Sprint(res.StatusCode)
	resp := op.Responses.Value(status)
	if resp == nil {
		if res.StatusCode < 400 || op.Responses.Default() == nil {
			fail("status %s is not documented for %s", status, op.OperationID)
			return res, nil
		}
		resp, status = op.Responses.Default(), "default"
	}
	if len(resp.Value.Content) == 0 {
		// A bodiless answer has no media type to count (a 204 of an event
		// stream names one all the same, for clients that read it).
		dc.record(op.OperationID, res.StatusCode, "")
	} else {
		dc.record(op.OperationID, res.StatusCode, mt)
	}
	if status == "default" {
		dc.record(op.OperationID+" default", res.StatusCode, mt)
	}
	if len(resp.Value.Content) == 0 {
		if body := dc.readBody(res); len(body) > 0 && req.Method != http.MethodHead {
			fail("a body where the document says there is none: %q", body)
		}
		return res, nil
	}
	media := resp.Value.Content.Get(ct)
	if media == nil && req.Method != http.MethodHead {
		fail("media type not documented for %s %s (it has %v)", op.OperationID, status, slices.Sorted(mapKeys(resp.Value.Content)))
		return res, nil
	}
	if mt == "text/event-stream" {
		out := &docCheckInput{in: in, status: res.StatusCode, header: res.Header}
		if err := openapi3filter.ValidateResponse(req.Context(), out.response(nil, true)); err != nil {
			fail("%v", err)
		}
		res.Body = &streamCheck{ReadCloser: res.Body, done: func(b []byte) { dc.checkStream(fail, media.Schema.Value, b) }}
		return res, nil
	}
	body := dc.readBody(res)
	if isOpaque(media) {
		// The page, the metrics, the YAML document: bytes as they are.
		return res, nil
	}
	out := &docCheckInput{in: in, status: res.StatusCode, header: res.Header}
	if err := openapi3filter.ValidateResponse(req.Context(), out.response(body, false)); err != nil {
		fail("%v", err)
	}
	return res, nil
}

// record counts an answer of op.
func (dc *docCheck) record(op string, status int, media string) {
	dc.mu.Lock()
	defer dc.mu.Unlock()
	dc.seen[fmt.Sprintf("%s %d %s", op, status, media)] = true
	dc.n++
}

// exchanges is how many exchanges were checked.
func (dc *docCheck) exchanges() int {
	dc.mu.Lock()
	defer dc.mu.Unlock()
	return dc.n
}

// missing lists the answers the document promises (every operation's
// statuses, each in each of its media types; 500 and default aside: they
// are what any route may answer, not what it does) that no exchange has
// shown, less those excused.
func (dc *docCheck) missing(excused map[string]string) []string {
	dc.mu.Lock()
	defer dc.mu.Unlock()
	var out []string
	for _, path := range dc.doc.Paths.InMatchingOrder() {
		for _, op := range dc.doc.Paths.Value(path).Operations() {
			for status, resp := range op.Responses.Map() {
				if status == "default" || status == "500" {
					continue
				}
				medias := slices.Sorted(mapKeys(resp.Value.Content))
				if len(medias) == 0 {
					medias = []string{""}
				}
				for _, m := range medias {
					key := fmt.Sprintf("%s %s %s", op.OperationID, status, m)
					if !dc.seen[key] && excused[key] == "" {
						out = append(out, key)
					}
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

func (dc *docCheck) readBody(res *http.Response) []byte {
	b, err := io.ReadAll(res.Body)
	_ = res.Body.Close()
	if err != nil {
		dc.t.Errorf("read a body: %v", err)
	}
	res.Body = io.NopCloser(bytes.NewReader(b))
	return b
}

// pathDefault is the default answer of the operations of req's path.
func (dc *docCheck) pathDefault(req *http.Request) *openapi3.ResponseRef {
	for _, path := range dc.doc.Paths.InMatchingOrder() {
		if !routeMatches(path, req.URL.Path) {
			continue
		}
		for _, op := range dc.doc.Paths.Value(path).Operations() {
			if d := op.Responses.Default(); d != nil {
				return d
			}
		}
	}
	return nil
}

// checkBody validates a JSON body against resp's schema for its media
// type, by hand (no operation to hand openapi3filter).
func (dc *docCheck) checkBody(fail func(string, ...any), resp *openapi3.ResponseRef, mt string, body []byte) {
	if resp == nil {
		fail("no default answer documented for the path")
		return
	}
	media := resp.Value.Content.Get(mt)
	if media == nil {
		fail("media type not documented (it has %v)", slices.Sorted(mapKeys(resp.Value.Content)))
		return
	}
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		fail("not JSON: %v: %s", err, body)
		return
	}
	if err := media.Schema.Value.VisitJSON(v, openapi3.MultiErrors()); err != nil {
		fail("%v", err)
	}
}

// checkStream validates every complete event of an event stream against
// schema, the schema of one event.
func (dc *docCheck) checkStream(fail func(string, ...any), schema *openapi3.Schema, body []byte) {
	n := 0
	for ev, err := range sse.Read(bytes.NewReader(body), nil) {
		if err != nil {
			fail("event %d: %v", n, err)
			return
		}
		n++
		name := ev.Type
		if name == "" {
			name = "message"
		}
		var data any = ev.Data
		var parsed any
		if json.Unmarshal([]byte(ev.Data), &parsed) == nil {
			data = parsed
		}
		doc := map[string]any{"event": name, "data": data}
		if ev.LastEventID != "" {
			doc["id"] = ev.LastEventID
		}
		if err := schema.VisitJSON(doc, openapi3.MultiErrors()); err != nil {
			fail("event %d (%s %s): %v", n, name, ev.Data, err)
		}
	}
}

// docCheckInput builds the response validation input of one exchange.
type docCheckInput struct {
	in     *openapi3filter.RequestValidationInput
	status int
	header http.Header
}

func (d *docCheckInput) response(body []byte, excludeBody bool) *openapi3filter.ResponseValidationInput {
	out := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: d.in, Status: d.status, Header: d.header,
		Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true, ExcludeResponseBody: excludeBody},
	}
	out.SetBodyBytes(body)
	return out
}

// streamCheck hands an event stream's bytes to done once the client has
// read it to its end or closed it, whichever comes first.
type streamCheck struct {
	io.ReadCloser
	done func([]byte)

	mu   sync.Mutex
	buf  bytes.Buffer
	once sync.Once
}

func (s *streamCheck) Read(p []byte) (int, error) {
	n, err := s.ReadCloser.Read(p)
	s.mu.Lock()
	s.buf.Write(p[:n])
	s.mu.Unlock()
	if err != nil {
		s.finish()
	}
	return n, err
}

func (s *streamCheck) Close() error {
	err := s.ReadCloser.Close()
	s.finish()
	return err
}

func (s *streamCheck) finish() {
	s.once.Do(func() {
		s.mu.Lock()
		b := bytes.Clone(s.buf.Bytes())
		s.mu.Unlock()
		s.done(b)
	})
}

// isOpaque reports whether a media type's schema is a string of bytes
// taken as it is (format: binary).
func isOpaque(m *openapi3.MediaType) bool {
	return m.Schema != nil && m.Schema.Value != nil && m.Schema.Value.Format == "binary"
}

func cloneWithBody(req *http.Request, body []byte) *http.Request {
	r := req.Clone(context.WithoutCancel(req.Context()))
	r.Body = io.NopCloser(bytes.NewReader(body))
	return r
}

// routeMatches reports whether a document path ("/v1/jobs/{id}") matches
// a request path.
func routeMatches(pattern, path string) bool {
	ps, xs := strings.Split(pattern, "/"), strings.Split(path, "/")
	if len(ps) != len(xs) {
		return false
	}
	for i := range ps {
		if !strings.HasPrefix(ps[i], "{") && ps[i] != xs[i] {
			return false
		}
	}
	return true
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}
