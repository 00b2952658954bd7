package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/apierr"
	"github.com/switchyard/switchyard/core"
)

// A server fault is answered 500 internal without its text, logged at warn
// and counted; a refusal keeps its code and is logged at debug.
func TestWriteError(t *testing.T) {
	var logs bytes.Buffer
	cfg := DefaultConfig()
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	reg := prometheus.NewRegistry()
	s, _ := newServerWith(t, core.DefaultConfig(), cfg, reg)
	for _, tc := range []struct {
		err    error
		status int
		code   string
		level  string
	}{
		{errors.New("open /var/lib/switchyard: permission denied"), 500, "internal", "level=WARN"},
		{&core.Error{Code: core.CodeQueueFull, Detail: "full"}, 429, "queue_full", "level=DEBUG"},
	} {
		logs.Reset()
		rec := httptest.NewRecorder()
		s.writeError(rec, httptest.NewRequest("POST", "/v1/queues/q/jobs", nil), tc.err)
		var p apierr.Problem
		if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
			t.Fatal(err)
		}
		if rec.Code != tc.status || p.Code != tc.code || strings.Contains(rec.Body.String(), "/var/lib") {
			t.Errorf("%v: %d %s", tc.err, rec.Code, rec.Body)
		}
		if !strings.Contains(logs.String(), tc.level) || !strings.Contains(logs.String(), "path=/v1/queues/q/jobs") {
			t.Errorf("%v: logged %q, want %s with the path", tc.err, logs.String(), tc.level)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counted := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() == "switchyard_api_errors_total" {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "code" {
						counted[l.GetValue()] = m.GetCounter().GetValue()
					}
				}
			}
		}
	}
	if counted["internal"] != 1 || counted["queue_full"] != 1 {
		t.Errorf("counted %v, want one internal and one queue_full", counted)
	}
}

// A handler's panic is answered as the server fault it is, in the shape
// every route documents for 500: a problem with code internal that says
// nothing of the panic. One that panics after its answer began has the
// connection aborted instead (http.ErrAbortHandler).
func TestRecovererAnswersAProblem(t *testing.T) {
	s := newTestServer(t)
	rec := httptest.NewRecorder()
	s.recoverer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("secret detail") })).
		ServeHTTP(rec, httptest.NewRequest("GET", "/v1/queues", nil))
	var p apierr.Problem
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || rec.Code != 500 || p.Code != "internal" ||
		rec.Header().Get("Content-Type") != "application/problem+json" || strings.Contains(rec.Body.String(), "secret") {
		t.Fatalf("%d %q %s (%v)", rec.Code, rec.Header().Get("Content-Type"), rec.Body, err)
	}
	defer func() {
		if r := recover(); r != http.ErrAbortHandler { //nolint:errorlint // net/http compares it so
			t.Fatalf("a panic mid-answer: recovered %v, want http.ErrAbortHandler", r)
		}
	}()
	s.recoverer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(200)
		panic("mid-stream")
	})).ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/v1/jobs/x/events", nil))
}
