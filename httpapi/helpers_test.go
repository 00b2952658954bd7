package httpapi

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/core"
)

// newTestServer returns a Server over a fresh engine with the default HTTP
// config (so a fresh random resume key), closed when the test ends.
func newTestServer(tb testing.TB) *Server {
	tb.Helper()
	e, err := core.New(core.DefaultConfig())
	if err != nil {
		tb.Fatalf("core.New: %v", err)
	}
	tb.Cleanup(e.Close)
	s, err := New(e, DefaultConfig(), prometheus.NewRegistry())
	if err != nil {
		tb.Fatalf("httpapi.New: %v", err)
	}
	return s
}

// kinds is the fixed set of job event kinds.
var kinds = []core.EventKind{core.EventAccepted, core.EventOutput, core.EventDone, core.EventError}
