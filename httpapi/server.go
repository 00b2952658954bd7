// Package httpapi is Switchyard's HTTP front end: JSON in, server-sent
// events or JSON out, problem+json for every refusal. It validates, calls
// the core.Engine and maps errors with apierr (the one error map every
// transport shares); the job machinery lives in core.
package httpapi

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/switchyard/switchyard/apierr"
	"github.com/switchyard/switchyard/auth"
	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/resume"
	"github.com/switchyard/switchyard/core/stream"
	"github.com/switchyard/switchyard/grpcapi"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
	"github.com/switchyard/switchyard/web"
)

// Config configures the HTTP layer.
type Config struct {
	// MaxBodyBytes bounds a request body; it is read through this limit
	// before anything is parsed. Zero means the engine's max input + 64 KiB.
	MaxBodyBytes int64
	// HeaderTimeout bounds the time to read a request's headers, and
	// MaxHeaderBytes their size: the node's http.Server takes both from
	// here. A client over either is cut by the server before any route
	// runs (431 for headers too large; a header trickle is closed).
	HeaderTimeout  time.Duration
	MaxHeaderBytes int
	// BodyTimeout bounds the time to read a request's whole body, from
	// the end of its headers (see bodyDeadline): a slow or stalled body
	// gets 408 request_timeout and changes nothing.
	BodyTimeout time.Duration
	// Stream is every job stream's bounds and clocks.
	Stream stream.Policy
	// WriteBuffer is the kernel send buffer (SO_SNDBUF) of every HTTP
	// connection, in bytes; 0 leaves it to the kernel's autotuning. See
	// LimitWriteBuffer; the node applies it to its listener.
	WriteBuffer int
	// Keyring signs and verifies resume tokens; nil means a fresh random
	// key (tokens then do not survive a restart — nor does the history they
	// point into).
	Keyring *resume.Keyring
	// TokenTTL is how long a resume token stays valid.
	TokenTTL time.Duration
	// RetryHint is the SSE retry: field of every stream's first message:
	// how long a browser waits before it resumes a dropped stream (their
	// default is 3s). Zero sends none.
	RetryHint time.Duration
	// StreamMetrics are the node's client-stream metrics, shared with the
	// other stream transports; nil registers a set of its own.
	StreamMetrics *stream.Metrics
	// Errors are the node's API error metrics, shared with the gRPC
	// services; nil registers a set of its own.
	Errors *apierr.Metrics
	// Cluster is the catalog view behind the cluster and queue views; nil
	// shows an empty cluster.
	Cluster core.ClusterView
	// ClusterEventsInterval is how often GET /v1/cluster/events looks for a
	// change and reads the cluster's figures (the most snapshots it sends a
	// second, catalog changes aside); zero means
	// DefaultClusterEventsInterval.
	ClusterEventsInterval time.Duration
	// ClusterChanges subscribes to the catalog view's changes (a node,
	// consumer or dispatch record written or deleted): the cluster event
	// streams send the change at once rather than at their next look, so a
	// state that lasts less than an interval (a node draining) is seen.
	// It returns the channel, poked without blocking, and the unsubscribe.
	// Nil: the streams look every interval only.
	ClusterChanges func() (<-chan struct{}, func())
	// PeerFigures asks every other node of the cluster for its live
	// figures, within ctx's deadline, for the cluster view's load: one
	// entry per node of the catalog but this one, with Err set for a node
	// that was not asked or did not answer, At the time its answer came.
	// Nil: this node's figures alone.
	PeerFigures func(ctx context.Context) []core.NodeFigures
	// Workers are the clocks of HTTP worker sessions: the gRPC sessions'
	// (the setup timeout does not apply: a session registers with its
	// opening request).
	Workers grpcapi.WorkerConfig
	// OpenAIQueue is the queue the OpenAI-compatible front door posts chat
	// completions to (see openai.go); empty means DefaultOpenAIQueue.
	OpenAIQueue string
	// Members manages the catalog's membership (members.go); nil: the
	// member routes answer not_found.
	Members core.MemberAdmin
	// Keys authenticate every API call (see auth.go); nil means a node
	// without keys: every call is anonymous.
	Keys *auth.Store
	// CORSOrigins are the origins whose pages may call the API routes
	// (cors.go): exact origins, or "*" (a node without keys only: the
	// node checks that). Empty: none.
	CORSOrigins []string
	// RelayTLS is how this node reaches another's HTTP port to relay a
	// keyed submission whose job lives there (relay.go); nil: plaintext.
	RelayTLS *tls.Config
	// MetricsOpen serves /metrics to anyone; otherwise it needs the admin
	// role (on a node without keys, everyone is admin).
	MetricsOpen bool
	// TracerProvider records the span of every API request (trace.go);
	// nil (export off) records none, and a caller's trace context still
	// reaches the job.
	TracerProvider trace.TracerProvider
	// Ready reports whether the node should receive traffic (/readyz).
	Ready    func() error
	Gatherer prometheus.Gatherer
	Logger   *slog.Logger
}

// DefaultConfig returns the HTTP settings a node uses unless told otherwise.
func DefaultConfig() Config {
	return Config{
		HeaderTimeout: 10 * time.Second, MaxHeaderBytes: 64 << 10, BodyTimeout: 30 * time.Second,
		Stream: stream.DefaultPolicy(), WriteBuffer: DefaultWriteBuffer, TokenTTL: time.Hour, RetryHint: time.Second,
		Workers:     grpcapi.DefaultWorkerConfig(),
		OpenAIQueue: DefaultOpenAIQueue,
	}
}

// Validate refuses settings that cannot work.
func (c Config) Validate() error {
	if c.WriteBuffer < 0 {
		return &core.ConfigError{Field: "http-write-buffer", Value: c.WriteBuffer, Err: errors.New("must not be negative (0 leaves it to the kernel)")}
	}
	if c.HeaderTimeout <= 0 {
		return &core.ConfigError{Field: "http-header-timeout", Value: c.HeaderTimeout, Err: errors.New("must be positive")}
	}
	if c.MaxHeaderBytes < 4<<10 {
		return &core.ConfigError{Field: "http-max-header-bytes", Value: c.MaxHeaderBytes, Err: errors.New("must be at least 4096, or ordinary requests are refused")}
	}
	if c.BodyTimeout <= 0 {
		return &core.ConfigError{Field: "http-body-timeout", Value: c.BodyTimeout, Err: errors.New("must be positive")}
	}
	if c.OpenAIQueue != "" && !core.ValidName(c.OpenAIQueue) {
		return &core.ConfigError{Field: "openai-queue", Value: c.OpenAIQueue, Err: errors.New("must be a queue name: 1-128 of [A-Za-z0-9._-], not starting with '.'")}
	}
	if err := validateOrigins(c.CORSOrigins); err != nil {
		return err
	}
	if c.TokenTTL < time.Second || c.TokenTTL > resume.MaxTTL {
		return &core.ConfigError{Field: "resume-token-ttl", Value: c.TokenTTL, Err: errors.New("must be between 1s and 24h")}
	}
	if err := c.Workers.Validate(); err != nil {
		return err
	}
	return c.Stream.Validate()
}

// Server is the HTTP API of one node.
type Server struct {
	e   *core.Engine
	cfg Config
	log *slog.Logger
	m   *stream.TransportMetrics
	// om are the stream metrics of the OpenAI-compatible chat completions,
	// streamed or not (transport "openai").
	om *stream.TransportMetrics
	// errs logs and counts every problem the server answers with.
	errs *apierr.Reporter
	// gateway serves the unary routes (see gateway.go).
	gateway http.Handler
	// cluster is the gateway's ClusterService, which the live cluster view
	// reads too (see clusterevents.go).
	cluster pb.ClusterServiceServer
	// load reads the cluster's figures for the live cluster view.
	load *loadSampler
	// ui serves the web page and its assets.
	ui *web.Handler
	// workers are the HTTP worker sessions (see workers.go).
	workers workerSessions
	// relay carries relayed submissions (relay.go).
	relay *http.Transport
	mux   *chi.Mux
}

// New returns the HTTP API over e; reg receives its metrics.
func New(e *core.Engine, cfg Config, reg prometheus.Registerer) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = e.Config().Limits.MaxInputBytes + 64<<10
	}
	if cfg.Keyring == nil {
		ring, err := resume.NewKeyring("k0", resume.GenerateKey("k0"))
		if err != nil {
			return nil, err
		}
		cfg.Keyring = ring
	}
	if cfg.Cluster == nil {
		cfg.Cluster = core.NoCluster{}
	}
	if cfg.OpenAIQueue == "" {
		cfg.OpenAIQueue = DefaultOpenAIQueue
	}
	if cfg.Ready == nil {
		cfg.Ready = func() error { return nil }
	}
	if cfg.Keys == nil {
		cfg.Keys, _ = auth.Open(auth.Source{}, nil) // no source: cannot fail
	}
	if cfg.ClusterEventsInterval <= 0 {
		cfg.ClusterEventsInterval = DefaultClusterEventsInterval
	}
	if cfg.StreamMetrics == nil {
		cfg.StreamMetrics = stream.NewMetrics(reg)
	}
	if cfg.Errors == nil {
		cfg.Errors = apierr.NewMetrics(reg)
	}
	s := &Server{
		e: e, cfg: cfg, log: cfg.Logger, m: cfg.StreamMetrics.For("sse"), om: cfg.StreamMetrics.For("openai"),
		errs: cfg.Errors.Reporter("http", cfg.Logger), relay: newRelayTransport(cfg.RelayTLS),
	}
	jobs, cluster, err := s.gatewayServices()
	if err != nil {
		return nil, err
	}
	s.cluster = cluster
	s.load = newLoadSampler(func() core.NodeFigures { return ReadFigures(e, cfg.Gatherer) }, cfg.PeerFigures, cfg.ClusterEventsInterval)
	if s.gateway, err = s.newGateway(jobs, cluster); err != nil {
		return nil, err
	}
	ui, err := web.New(http.HandlerFunc(s.notFound))
	if err != nil {
		return nil, err
	}
	s.mux = s.routes(ui)
	return s, nil
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Router exposes the chi router, so a test can walk the routes.
func (s *Server) Router() chi.Routes { return s.mux }

func (s *Server) routes(ui *web.Handler) *chi.Mux {
	r := chi.NewRouter()
	// No Timeout middleware and no server WriteTimeout: streams live as long
	// as their job; their own clocks bound them (see sse.go).
	r.Use(traceRequests(s.cfg.TracerProvider), middleware.RequestID, s.recoverer, s.bodyDeadline)
	r.NotFound(s.notFound)
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, &core.Error{Code: core.CodeMethodNotAllowed, Detail: r.Method + " is not allowed here"})
	})
	cors := corsMiddleware(s.cfg.CORSOrigins)
	r.Route("/v1", func(r chi.Router) {
		if cors != nil {
			r.Use(cors)
		}
		r.Use(s.authenticate)
		// What each route needs (auth.go): the roles, and the queue its
		// path names; the job routes show a job to its owner, to admins,
		// and to a read token issued for it.
		submit, work := s.allow(auth.Submit, "queue"), s.allow(auth.Work, "queue")
		admin, worker := s.allow(auth.Admin, ""), s.allow(auth.Work, "")
		owner := s.allow(auth.Submit|auth.Admin, "")
		reader := s.allowRead(auth.Submit|auth.Admin, jobScopeOf)
		r.With(submit).Post("/queues/{queue}/jobs", s.handleSubmit)
		r.With(reader).Get("/jobs/{id}", s.handleGetJob)
		r.With(owner).Delete("/jobs/{id}", s.handleCancel)
		r.With(reader).Get("/jobs/{id}/events", s.handleEvents)
		r.With(owner).Post("/jobs/{id}/read-token", s.handleJobReadToken)
		r.With(admin).Get("/cluster/nodes", s.handleNodes)
		r.With(s.allowRead(auth.Admin, clusterScopeOf)).Get("/cluster/events", s.handleClusterEvents)
		r.With(admin).Post("/cluster/read-token", s.handleClusterReadToken)
		r.With(admin).Get("/cluster/members", s.handleListMembers)
		r.With(admin).Post("/cluster/members", s.handleAddMember)
		r.With(admin).Delete("/cluster/members/{member}", s.handleRemoveMember)
		r.With(admin).Get("/queues", s.handleQueues)
		r.With(admin).Get("/queues/{queue}", s.handleQueue)
		r.With(work).Post("/queues/{queue}/workers", s.handleWorkerSession)
		// A session's posts need the key too, of the subject that opened
		// it (workerposts.go): a session id alone is not enough.
		r.With(worker).Post("/workers/{session}/heartbeat", s.handleWorkerHeartbeat)
		r.With(worker).Route("/workers/{session}/jobs/{job}", func(r chi.Router) {
			r.Post("/accept", s.handleWorkerAccept)
			r.Post("/reject", s.handleWorkerReject)
			r.Post("/output", s.handleWorkerOutput)
			r.Post("/complete", s.handleWorkerComplete)
			r.Post("/fail", s.handleWorkerFail)
		})
	})
	// The OpenAI-compatible front door (openai.go): in this router, under
	// the middleware above, so whatever guards /v1 guards it too.
	r.Route(OpenAIPrefix, func(r chi.Router) {
		if cors != nil {
			r.Use(cors)
		}
		r.Use(s.authenticate, s.allowOpenAI())
		s.openAIRoutes(r)
	})
	// The web page (package web): the page at / and its assets under
	// /ui/{version}/, each with its own content type, caching and CSP.
	s.ui = ui
	r.Get("/", s.handlePage)
	r.Head("/", s.handlePageHead)
	r.Method(http.MethodGet, web.Prefix+"*", ui)
	r.Method(http.MethodHead, web.Prefix+"*", ui)
	r.Get("/healthz", s.handleHealthz)
	r.Get("/readyz", s.handleReadyz)
	r.With(s.allowMetrics).Get("/metrics", s.handleMetrics)
	r.Get("/openapi.json", s.handleOpenAPIJSON)
	r.Get("/openapi.yaml", s.handleOpenAPIYAML)
	r.Get("/docs", s.handleDocs)
	r.Get("/docs/*", s.handleDocsAsset)
	return r
}

// handlePage is GET and HEAD /: the web page (package web), whose assets
// are served under /ui/{version}/.
//
//	@Summary		The web page
//	@Description	A playground and a live cluster view, embedded in the binary; its assets are under `/ui/{version}/`. See docs/web.md#serving.
//	@Tags			node
//	@ID				webPage
//	@Produce		html
//	@Success		200	{string}	string	"the page"
//	@Router			/ [get]
func (s *Server) handlePage(w http.ResponseWriter, r *http.Request) { s.ui.ServeHTTP(w, r) }

// handlePageHead is HEAD /: the page's headers (its ETag, for a cache).
//
//	@Summary		The web page's headers
//	@Tags			node
//	@ID				webPageHead
//	@Produce		html
//	@Success		200	{string}	string	"no body"
//	@Router			/ [head]
func (s *Server) handlePageHead(w http.ResponseWriter, r *http.Request) { s.ui.ServeHTTP(w, r) }

// recoverer answers a handler's panic as the server fault it is: a
// problem (code internal, as the document says every route may answer),
// the panic and its stack in the node's log only. A panic after the
// answer began (a stream) cannot change its status: the connection is
// closed instead, by re-panicking with http.ErrAbortHandler, which
// net/http takes as "abort quietly", as it does that panic from below.
func (s *Server) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ww := middleware.NewWrapResponseWriter(w, r.ProtoMajor)
		defer func() {
			rec := recover()
			if rec == nil {
				return
			}
			if rec == http.ErrAbortHandler { //nolint:errorlint // net/http compares it so
				panic(rec)
			}
			s.log.Error("handler panic", "path", r.URL.Path, "panic", rec, "stack", string(debug.Stack()))
			if ww.Status() != 0 {
				panic(http.ErrAbortHandler)
			}
			s.writeError(ww, r, fmt.Errorf("panic: %v", rec))
		}()
		next.ServeHTTP(ww, r)
	})
}

func (s *Server) notFound(w http.ResponseWriter, r *http.Request) {
	s.writeError(w, r, &core.Error{Code: core.CodeNotFound, Detail: "no such route"})
}

// handleHealthz is GET /healthz.
//
//	@Summary		Liveness
//	@Description	200 while the process serves HTTP.
//	@Tags			node
//	@ID				healthz
//	@Produce		plain
//	@Success		200	{string}	string	"ok"
//	@Router			/healthz [get]
func (s *Server) handleHealthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = io.WriteString(w, "ok\n")
}

// handleReadyz is GET /readyz.
//
//	@Summary		Readiness
//	@Description	200 while the node should receive traffic; 503 draining while it shuts down or after it lost its catalog lease (fenced).
//	@Tags			node
//	@ID				readyz
//	@Produce		plain
//	@Success		200	{string}	string			"ready"
//	@Failure		503	{object}	apierr.Problem	"draining"
//	@Router			/readyz [get]
func (s *Server) handleReadyz(w http.ResponseWriter, r *http.Request) {
	err := s.cfg.Ready()
	if err == nil && s.e.Draining() {
		err = errors.New("draining")
	}
	if err != nil {
		s.writeError(w, r, &core.Error{Code: core.CodeDraining, Detail: "not ready: " + err.Error()})
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = io.WriteString(w, "ready\n")
}

// handleMetrics is GET /metrics.
//
//	@Summary		Metrics
//	@Description	The node's Prometheus metrics; OpenMetrics, with exemplars, to a scraper whose Accept asks for it. See docs/tracing.md#exemplars.
//	@Tags			node
//	@ID				metrics
//	@Produce		plain
//	@Success		200	{string}	string	"Prometheus text format"
//	@Security		BearerKey
//	@Router			/metrics [get]
func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Gatherer == nil {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		return
	}
	// OpenMetrics to a scraper that asks for it (Accept:
	// application/openmetrics-text): the format that carries exemplars,
	// the trace ids of sampled jobs on the latency histograms.
	promhttp.HandlerFor(s.cfg.Gatherer, promhttp.HandlerOpts{EnableOpenMetrics: true}).ServeHTTP(w, r)
}

// DefaultWriteBuffer is the SO_SNDBUF a node asks for on every HTTP
// connection it accepts (--http-write-buffer; Linux doubles it for its own
// bookkeeping).
const DefaultWriteBuffer = 128 << 10

// LimitWriteBuffer returns ln with the kernel send buffer (SO_SNDBUF) of
// every TCP connection it accepts set to size bytes; size 0 returns ln as
// it is, leaving the kernel to autotune.
//
// Why a cap: left alone, Linux grows a connection's send buffer up to
// net.ipv4.tcp_wmem's maximum (4 MiB by default). That is kernel memory
// per stream beyond the bound its queue has, and it stands between a slow
// client and the terminated event that tells it how to resume: the event
// can only follow what is buffered. With a cap, both are bounded, and a
// stream judged slow can make room for its last event (see sseSink.Abort).
func LimitWriteBuffer(ln net.Listener, size int) net.Listener {
	if size <= 0 {
		return ln
	}
	return &writeBufferListener{Listener: ln, size: size}
}

// ConnContext is the http.Server ConnContext of a node's API: it keeps
// each connection in the context of its requests, so that a stream judged
// slow can reach its send buffer (see sseSink.Abort).
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, ctxKeyConn(0), c)
}

type ctxKeyConn int

// tcpConn returns the TCP connection a request came in on, if ConnContext
// recorded it.
func tcpConn(ctx context.Context) *net.TCPConn {
	c, _ := ctx.Value(ctxKeyConn(0)).(net.Conn)
	// Over TLS the connection is a *tls.Conn on the TCP one.
	if tc, ok := c.(interface{ NetConn() net.Conn }); ok {
		c = tc.NetConn()
	}
	t, _ := c.(*net.TCPConn)
	return t
}

type writeBufferListener struct {
	net.Listener
	size int
}

func (l *writeBufferListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		tc, ok := c.(*net.TCPConn)
		if !ok {
			return c, nil
		}
		// Setting an option on a socket that was just accepted fails only
		// when the peer is already gone: drop it rather than serve it
		// without its cap.
		if err := tc.SetWriteBuffer(l.size); err != nil {
			_ = c.Close()
			continue
		}
		return c, nil
	}
}

// writeError answers r with err as a problem document (apierr.WriteProblem:
// a server fault shows only as code internal), after logging and counting
// it. Under /openai/ it answers in OpenAI's error shape instead
// (apierr.WriteOpenAIError), whoever writes the error — a handler, the
// router's not-found, or a middleware that runs before any route — so an
// OpenAI SDK always gets an error it parses.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	s.errs.Report(err, "path", r.URL.Path)
	if isOpenAIPath(r.URL.Path) {
		apierr.WriteOpenAIError(w, err)
		return
	}
	apierr.WriteProblem(w, r, err)
}
