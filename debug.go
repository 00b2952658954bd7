package switchyard

import (
	"log/slog"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/switchyard/switchyard/httpapi"
)

// newDebugServer is the profiling server of --debug-addr: net/http/pprof's
// handlers under /debug/pprof/, on a listener of their own so that the
// public API never serves them. On a node with API keys they need an admin
// key (the guard /metrics has); Config.Validate keeps the address on
// loopback unless DebugAllowRemote.
//
// The handlers are registered on a mux of our own, not on
// http.DefaultServeMux, which importing net/http/pprof fills for any
// server built on it.
func newDebugServer(api *httpapi.Server, log *slog.Logger) *http.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return &http.Server{
		Handler:           api.AdminOnly(mux),
		ReadHeaderTimeout: 10 * time.Second,
		// No WriteTimeout: a CPU profile or a trace answers after the
		// seconds it was asked to run for.
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
}

// closeDebug stops the profiling server, if the node has one; a profile in
// progress is cut.
func (n *Node) closeDebug() {
	if n.debug != nil && n.debugLn != nil {
		_ = n.debug.Close()
	}
}
