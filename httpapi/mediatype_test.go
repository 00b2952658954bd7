package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/go-chi/chi/v5/middleware"
)

// The fast paths for the bare media types answer what the general parse
// answers, in any case and with parameters or lists around them.
func TestMediaTypeChecks(t *testing.T) {
	for ct, ok := range map[string]bool{
		"application/json":                true,
		"Application/JSON":                true,
		"application/json; charset=utf-8": true,
		"application/problem+json":        true,
		"text/plain":                      false,
		"application/json;;":              false,
		"":                                false,
	} {
		r, _ := http.NewRequest(http.MethodPost, "/", nil)
		if ct != "" {
			r.Header.Set("Content-Type", ct)
		}
		if err := requireJSON(r); (err == nil) != ok {
			t.Errorf("requireJSON(%q) = %v, want ok %v", ct, err, ok)
		}
	}
	for accept, ok := range map[string]bool{
		"text/event-stream":                    true,
		"Text/Event-Stream":                    true,
		" text/event-stream ":                  true,
		"application/json, text/event-stream":  true,
		"text/event-stream;q=0.9":              true,
		"application/json":                     false,
		"text/event-streams":                   false,
		"":                                     false,
		"application/json,text/event-stream;;": false,
	} {
		r, _ := http.NewRequest(http.MethodPost, "/", nil)
		r.Header.Set("Accept", accept)
		if got := wantsEventStream(r); got != ok {
			t.Errorf("wantsEventStream(%q) = %v, want %v", accept, got, ok)
		}
	}
	r, _ := http.NewRequest(http.MethodPost, "/", nil)
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Accept", "text/event-stream")
	if a := testing.AllocsPerRun(100, func() { _ = requireJSON(r); wantsEventStream(r) }); a != 0 {
		t.Errorf("the bare media types cost %v allocations", a)
	}
}

// setReadDeadline reaches the connection through the writers wrapped
// around it, as http.ResponseController does, without allocating; a
// writer with no connection says it is not supported.
func TestSetReadDeadline(t *testing.T) {
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ww := middleware.NewWrapResponseWriter(w, r.ProtoMajor)
		err := setReadDeadline(ww, time.Now().Add(time.Minute))
		allocs := testing.AllocsPerRun(10, func() { _ = setReadDeadline(ww, time.Time{}) })
		got <- fmt.Sprint(err, allocs)
	}))
	defer srv.Close()
	res, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if g := <-got; g != "<nil> 0" {
		t.Errorf("through a wrapped writer: error and allocations %s, want <nil> 0", g)
	}
	if err := setReadDeadline(httptest.NewRecorder(), time.Time{}); !errors.Is(err, http.ErrNotSupported) {
		t.Errorf("on a recorder: %v, want ErrNotSupported", err)
	}
}
