package httpapi

import (
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/core"
)

// newTestServer returns a Server over a fresh engine with the default HTTP
// config (so a fresh random resume key), closed when the test ends.
func newTestServer(tb testing.TB) *Server {
	tb.Helper()
	s, _ := newServerWith(tb, core.DefaultConfig(), DefaultConfig(), prometheus.NewRegistry())
	return s
}

// newServerWith returns a Server with cfg, registering its metrics in reg,
// over a fresh engine with ecfg, closed when the test ends.
func newServerWith(tb testing.TB, ecfg core.Config, cfg Config, reg prometheus.Registerer) (*Server, *core.Engine) {
	tb.Helper()
	e, err := core.New(ecfg)
	if err != nil {
		tb.Fatalf("core.New: %v", err)
	}
	tb.Cleanup(e.Close)
	s, err := New(e, cfg, reg)
	if err != nil {
		tb.Fatalf("httpapi.New: %v", err)
	}
	return s, e
}

// serveConns serves s over real connections, each kept in its requests'
// context (ConnContext) as the node does, so that a stream can reach its
// connection. Closed when the test ends.
func serveConns(tb testing.TB, s *Server) *httptest.Server {
	tb.Helper()
	ts := httptest.NewUnstartedServer(s)
	ts.Config.ConnContext = ConnContext
	ts.Start()
	tb.Cleanup(ts.Close)
	return ts
}

// kinds is the fixed set of job event kinds.
var kinds = []core.EventKind{core.EventAccepted, core.EventOutput, core.EventDone, core.EventError}
