package httpapi

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"

	"github.com/switchyard/switchyard/apierr"
	"github.com/switchyard/switchyard/openapi"
)

// document is what the tests read of the OpenAPI document.
type document struct {
	Paths      map[string]map[string]json.RawMessage `json:"paths"`
	Components struct {
		Schemas map[string]struct {
			Properties map[string]struct {
				Enum []string `json:"enum"`
			} `json:"properties"`
		} `json:"schemas"`
	} `json:"components"`
}

func loadDocument(tb testing.TB) document {
	tb.Helper()
	var d document
	if err := json.Unmarshal(openapi.JSON, &d); err != nil {
		tb.Fatalf("openapi.json: %v", err)
	}
	return d
}

// Every route of the router is in the document with its method, and every
// operation of the document is a route: swag reads comments only, so a
// route added without its annotation (or an annotation left behind by a
// removed route) fails here. Adding a route means annotating its handler
// and running make openapi.
//
// Routes ending in /* serve trees of static files (Swagger UI's assets,
// which the document describes through /docs; the web page's): they are not
// operations. The one exception is a documented path whose last parameter
// may hold a slash (GET /openai/v1/models/{model}), which chi can only
// route as a wildcard.
func TestRoutesAreTheDocument(t *testing.T) {
	s := newTestServer(t)
	var routes, wildcards []string
	err := chi.Walk(s.Router(), func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		if strings.HasSuffix(route, "/*") {
			wildcards = append(wildcards, strings.ToLower(method)+" "+route)
			return nil
		}
		if route != "/" {
			route = strings.TrimSuffix(route, "/")
		}
		routes = append(routes, strings.ToLower(method)+" "+route)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	documented, err := openapi.Operations()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(routes)
	for _, r := range routes {
		if !slices.Contains(documented, r) {
			t.Errorf("route %s is not in openapi/openapi.json: annotate its handler and run make openapi", r)
		}
	}
	for _, d := range documented {
		// A parameter that may hold a slash (a model name such as
		// "org/model") is a wildcard route in chi.
		if i := strings.LastIndex(d, "/{"); i > 0 && strings.HasSuffix(d, "}") && slices.Contains(wildcards, d[:i]+"/*") {
			continue
		}
		if !slices.Contains(routes, d) {
			t.Errorf("openapi/openapi.json documents %s, which is not a route", d)
		}
	}
	if len(routes) < 10 {
		t.Errorf("walked only %d routes: %v", len(routes), routes)
	}
}

// The document lists every code of the table as Problem's code: a code
// added to the table without regenerating the document fails here.
func TestDocumentListsEveryCode(t *testing.T) {
	got := loadDocument(t).Components.Schemas["Problem"].Properties["code"].Enum
	var want []string
	for _, c := range apierr.Codes() {
		want = append(want, string(c))
	}
	if !slices.Equal(got, want) {
		t.Errorf("Problem.code enum %v, want the table's %v: run make openapi", got, want)
	}
}

// The node serves its document and a documentation page whose assets are
// embedded.
func TestServesDocumentAndDocs(t *testing.T) {
	s := newTestServer(t)
	get := func(path string) (*http.Response, string) {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		res := rec.Result()
		b, _ := io.ReadAll(res.Body)
		return res, string(b)
	}
	for _, tc := range []struct{ path, ctype, contains string }{
		{"/openapi.json", "application/json", `"openapi": "3.0`},
		{"/openapi.yaml", "application/yaml", "openapi: 3.0"},
		{"/docs", "text/html; charset=utf-8", `<base href="/docs/">`},
		{"/docs/", "text/html; charset=utf-8", `swagger-ui-bundle.js`},
		{"/docs/swagger-initializer.js", "text/javascript; charset=utf-8", `url: "/openapi.json"`},
		{"/docs/swagger-ui-bundle.js", "text/javascript; charset=utf-8", "SwaggerUIBundle"},
		{"/docs/swagger-ui.css", "text/css; charset=utf-8", ".swagger-ui"},
	} {
		res, body := get(tc.path)
		if res.StatusCode != 200 || res.Header.Get("Content-Type") != tc.ctype || !strings.Contains(body, tc.contains) {
			t.Errorf("GET %s: %d %q, body has %q: %v", tc.path, res.StatusCode, res.Header.Get("Content-Type"), tc.contains, strings.Contains(body, tc.contains))
		}
	}
	if res, _ := get("/openapi.json"); res.StatusCode == 200 {
		_, body := get("/openapi.json")
		if body != string(openapi.JSON) {
			t.Error("/openapi.json is not the embedded document")
		}
	}
	if res, _ := get("/docs/nothing.js"); res.StatusCode != 404 {
		t.Errorf("a missing asset: %d", res.StatusCode)
	}
}

// The document says which routes need a credential: every API route
// declares the bearer key (the events streams a read token too), then no
// credential at all as the last alternative (a node without keys takes
// every call as anonymous), with its 401 and 403, and the open routes
// declare nothing. No scheme is named like a schema. The behaviour behind
// it is the auth matrix's (integration TestAuthMatrix).
func TestDocumentSecurity(t *testing.T) {
	var doc struct {
		Paths map[string]map[string]struct {
			Security  []map[string][]string      `json:"security"`
			Responses map[string]json.RawMessage `json:"responses"`
		} `json:"paths"`
		Components struct {
			SecuritySchemes map[string]struct{ Type, Scheme, In, Name string } `json:"securitySchemes"`
		} `json:"components"`
	}
	if err := json.Unmarshal(openapi.JSON, &doc); err != nil {
		t.Fatal(err)
	}
	if s := doc.Components.SecuritySchemes["BearerKey"]; s.Type != "http" || s.Scheme != "bearer" {
		t.Errorf("BearerKey: %+v", s)
	}
	if s := doc.Components.SecuritySchemes["ReadTokenQuery"]; s.Type != "apiKey" || s.In != "query" || s.Name != "read_token" {
		t.Errorf("ReadTokenQuery: %+v", s)
	}
	schemas := loadDocument(t).Components.Schemas
	for name := range doc.Components.SecuritySchemes {
		if _, ok := schemas[name]; ok {
			t.Errorf("the security scheme %s is named like a schema", name)
		}
	}
	open := []string{"get /", "head /", "get /healthz", "get /readyz", "get /openapi.json", "get /openapi.yaml", "get /docs"}
	readable := []string{"get /v1/jobs/{id}", "get /v1/jobs/{id}/events", "get /v1/cluster/events"}
	for path, ops := range doc.Paths {
		for method, op := range ops {
			name := method + " " + path
			var schemes []string
			if n := len(op.Security); n > 0 {
				if len(op.Security[n-1]) != 0 {
					t.Errorf("%s: security %v: the last alternative is not {} (anonymous)", name, op.Security)
				}
			}
			for _, req := range op.Security {
				for s := range req {
					schemes = append(schemes, s)
				}
			}
			slices.Sort(schemes)
			want := []string{"BearerKey"}
			switch {
			case slices.Contains(open, name):
				want = nil
			case slices.Contains(readable, name):
				want = []string{"BearerKey", "ReadTokenQuery"}
			}
			if !slices.Equal(schemes, want) {
				t.Errorf("%s: security %v, want %v", name, schemes, want)
			}
			if want != nil && (op.Responses["401"] == nil || op.Responses["403"] == nil) {
				t.Errorf("%s: no 401 or 403 answer", name)
			}
		}
	}
}

// maxDescription is how long an operation's @Description may be: a
// sentence or two that Swagger UI shows whole. What else a reader needs is
// in docs/, linked from the description ("See docs/api.md#…").
const maxDescription = 160

// Every @Description of the handlers is short, and every page of docs/ it
// links exists.
func TestDescriptionsAreShort(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			m := swagDescription.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			seen++
			if n := utf8.RuneCountInString(m[1]); n > maxDescription {
				t.Errorf("%s:%d: a @Description of %d characters (at most %d: the rest goes to docs/, linked from it)", f, i+1, n, maxDescription)
			}
			for _, l := range docsLink.FindAllStringSubmatch(m[1], -1) {
				if _, err := os.Stat(filepath.Join("..", l[1])); err != nil {
					t.Errorf("%s:%d: the @Description links %s, which does not exist", f, i+1, l[1])
				}
			}
		}
	}
	if seen < 10 {
		t.Fatalf("%d @Description lines read: the annotations' format changed?", seen)
	}
}

var (
	swagDescription = regexp.MustCompile(`^//\s*@Description\s+(.*)$`)
	docsLink        = regexp.MustCompile(`(docs/[A-Za-z0-9_./-]+\.md)`)
)
