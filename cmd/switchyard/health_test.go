package main

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// The health check passes on 2xx only, and a failure says why: the status
// and what the node said, a refused connection, or no answer in time.
func TestHealth(t *testing.T) {
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer ok.Close()
	notReady := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, `{"code":"draining","detail":"not ready: catalog lease lost"}`, http.StatusServiceUnavailable)
	}))
	defer notReady.Close()
	hung := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hung:
		case <-r.Context().Done():
		}
	}))
	defer slow.Close()
	defer close(hung)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String() + "/readyz"
	ln.Close()

	for _, tc := range []struct {
		name, url, want string
	}{
		{"ready", ok.URL + "/readyz", ""},
		{"not ready", notReady.URL + "/readyz", "503 Service Unavailable: {\"code\":\"draining\""},
		{"refused", closed, "connection refused"},
		{"no answer", slow.URL + "/readyz", "no answer within 200ms"},
		{"bad url", "://", "--url"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkHealth(context.Background(), tc.url, 200*time.Millisecond)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("got %v, want healthy", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestHealthFlags(t *testing.T) {
	err := run(context.Background(), []string{"health", "--timeout", "0s"})
	if err == nil || !strings.Contains(err.Error(), "--timeout") {
		t.Fatalf("got %v, want a --timeout error", err)
	}
	t.Setenv("SWITCHYARD_URL", "http://127.0.0.1:1/readyz")
	err = run(context.Background(), []string{"health", "--timeout", "1s"})
	if err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Fatalf("got %v, want the URL from SWITCHYARD_URL in the error", err)
	}
}
