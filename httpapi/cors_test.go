package httpapi

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/core"
)

func TestValidateOrigins(t *testing.T) {
	for _, tc := range []struct {
		origins []string
		ok      bool
	}{
		{nil, true},
		{[]string{"http://127.0.0.1:5173", "https://app.example"}, true},
		{[]string{"*"}, true},
		{[]string{"*", "https://app.example"}, false},
		{[]string{"https://app.example/"}, false},
		{[]string{"https://*.example"}, false},
		{[]string{"app.example"}, false},
		{[]string{"ftp://app.example"}, false},
		{[]string{"https://App.example"}, false},
		{[]string{"https://app.example?x=1"}, false},
	} {
		if err := validateOrigins(tc.origins); (err == nil) != tc.ok {
			t.Errorf("%v: %v, want ok %v", tc.origins, err, tc.ok)
		}
	}
}

// With origins listed, a preflight from one of them is answered with what
// a page may send and read; one from another origin gets no CORS headers
// (the browser refuses it); without origins, OPTIONS is what it always
// was.
func TestCORSPreflight(t *testing.T) {
	cfg := DefaultConfig()
	cfg.CORSOrigins = []string{"http://app.test:8000"}
	s, _ := newServerWith(t, core.DefaultConfig(), cfg, prometheus.NewRegistry())
	preflight := func(s *Server, origin, path string) *http.Response {
		r := httptest.NewRequest("OPTIONS", path, nil)
		r.Header.Set("Origin", origin)
		r.Header.Set("Access-Control-Request-Method", "POST")
		r.Header.Set("Access-Control-Request-Headers", "authorization, content-type, idempotency-key")
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		return w.Result()
	}
	for _, path := range []string{"/v1/queues/demo/jobs", "/v1/jobs/j_x/events", "/v1/queues/demo/workers", "/v1/workers/ws_x/jobs/j_x/output", "/openai/v1/chat/completions"} {
		res := preflight(s, "http://app.test:8000", path)
		h := res.Header
		if res.StatusCode != 204 || h.Get("Access-Control-Allow-Origin") != "http://app.test:8000" ||
			h.Get("Access-Control-Allow-Headers") == "" || h.Get("Access-Control-Allow-Credentials") != "" {
			t.Errorf("%s from a listed origin: %d %v", path, res.StatusCode, h)
		}
		if res := preflight(s, "http://evil.test", path); res.Header.Get("Access-Control-Allow-Origin") != "" {
			t.Errorf("%s from another origin: %v", path, res.Header)
		}
	}
	// An actual request exposes the job id header.
	r := httptest.NewRequest("GET", "/v1/jobs/j_nope", nil)
	r.Header.Set("Origin", "http://app.test:8000")
	w := httptest.NewRecorder()
	s.ServeHTTP(w, r)
	if w.Code != 404 || w.Header().Get("Access-Control-Allow-Origin") != "http://app.test:8000" || w.Header().Get("Access-Control-Expose-Headers") == "" {
		t.Errorf("a refusal to a listed origin: %d %v", w.Code, w.Header())
	}
	// No origins: nothing cross-origin.
	if res := preflight(newTestServer(t), "http://app.test:8000", "/v1/queues/demo/jobs"); res.StatusCode != 405 || res.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("without origins: %d %v", res.StatusCode, res.Header)
	}
}
