package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// Defaults and bounds of Config.
const (
	DefaultConcurrency       = 1
	DefaultMaxBackoff        = 5 * time.Second
	DefaultHeartbeatInterval = 2 * time.Second

	// maxConcurrency bounds Concurrency: the send queue is sized from it
	// and allocated up front.
	maxConcurrency = 1 << 16
	// initialBackoff is the first reconnect delay (capped by MaxBackoff).
	initialBackoff = 100 * time.Millisecond
	// handshakeTimeout bounds connecting plus the Register/Registered
	// exchange: a node that accepts the TCP connection and never answers
	// must not hold the worker forever.
	handshakeTimeout = 10 * time.Second
	// silenceFactor × heartbeat interval without a message from the node
	// ends the session: several heartbeats must be missed, not one late.
	silenceFactor = 3
)

// ErrInvalidConfig is wrapped by the error Run returns for a Config it
// cannot use; Run does not connect then.
var ErrInvalidConfig = errors.New("worker: invalid config")

// Config says where a worker connects and what it serves.
type Config struct {
	// Server is the node's gRPC address, host:port (any gRPC target works).
	Server string
	// Queue is the queue this worker serves. The node validates the name.
	Queue string
	// Capabilities this worker can run, as "key=value": what it declares
	// when it first registers. Worker.SetCapabilities changes the set while
	// the worker runs.
	Capabilities []string
	// Concurrency is the most jobs run at once; 0 means 1.
	Concurrency int
	// Name is a human label for the node's logs and cluster view.
	Name string
	// Decide, if set, is called before a job is accepted; a non-nil error
	// rejects the job with err.Error() as the reason, and the node offers it
	// to another worker. It runs on the session's receive loop, so it must
	// be quick. Default: accept everything.
	Decide func(*Job) error
	// Logger receives one Info line per job accepted, rejected, cancelled
	// and ended, and session events. nil discards.
	Logger *slog.Logger
	// DialOptions for the gRPC connection. When empty the connection uses
	// insecure (plaintext) credentials, which suits loopback and
	// development; when set they replace that default, so they must carry
	// transport credentials of their own. They apply after the SDK's static
	// flow-control windows (internal/flowwin: 4 MiB a stream, no PING per
	// burst of data read), so an option of the caller's that sets a window
	// wins.
	DialOptions []grpc.DialOption
	// MaxBackoff caps the delay between reconnect attempts; 0 means 5s.
	MaxBackoff time.Duration
	// HeartbeatInterval overrides the interval the node asks for in its
	// Registered message (2s if it names none). The worker sends a heartbeat
	// after this long without sending anything, and ends the session after
	// three intervals without hearing anything.
	HeartbeatInterval time.Duration
	// TracerProvider records the worker's span of each job it runs
	// (switchyard.worker.run), a child of the node's offer in the job's
	// trace; the handler's context carries that span, so the handler's own
	// spans join the job's trace too. nil: OpenTelemetry's global provider
	// (otel.GetTracerProvider, a no-op until the program installs an SDK).
	TracerProvider trace.TracerProvider
}

func (c Config) withDefaults() (Config, error) {
	switch {
	case c.Server == "":
		return c, fmt.Errorf("%w: Server is empty", ErrInvalidConfig)
	case c.Queue == "":
		// Only emptiness is checked here: the node owns the naming rules
		// and answers InvalidArgument, which Run returns unretried.
		return c, fmt.Errorf("%w: Queue is empty", ErrInvalidConfig)
	case c.Concurrency < 0 || c.Concurrency > maxConcurrency:
		return c, fmt.Errorf("%w: Concurrency %d is outside 0..%d", ErrInvalidConfig, c.Concurrency, maxConcurrency)
	case c.MaxBackoff < 0:
		return c, fmt.Errorf("%w: MaxBackoff %s is negative", ErrInvalidConfig, c.MaxBackoff)
	case c.HeartbeatInterval < 0:
		return c, fmt.Errorf("%w: HeartbeatInterval %s is negative", ErrInvalidConfig, c.HeartbeatInterval)
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = DefaultMaxBackoff
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if len(c.DialOptions) == 0 {
		c.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	return c, nil
}

// runner is one Run: the config, the handler and what outlives a session.
type runner struct {
	cfg    Config
	h      Handler
	log    *slog.Logger
	tracer trace.Tracer
	// healthy is set by a session that stayed registered for at least
	// MaxBackoff; the backoff reads and clears it, so a worker that was
	// connected for an hour reconnects quickly instead of inheriting an
	// old, long delay.
	healthy atomic.Bool

	mu sync.Mutex
	// caps is the set every registration declares: Config.Capabilities,
	// then each set a node accepted. A session's receive loop replaces it
	// when the node's answer arrives, so the next session (which cannot
	// start before that loop ends) registers with it.
	caps []string
	// live is the registered session, nil between sessions; stopped is set
	// when Run has returned. changed is closed and replaced whenever either
	// changes.
	live    *session
	stopped bool
	changed chan struct{}
}

func (r *runner) declared() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.caps)
}

func (r *runner) setDeclared(caps []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.caps = caps
}

// setLive records the registered session (nil when it ended) and wakes
// SetCapabilities calls waiting for one.
func (r *runner) setLive(s *session, stopped bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.live, r.stopped = s, stopped
	close(r.changed)
	r.changed = make(chan struct{})
}

// liveSession waits for a registered session.
func (r *runner) liveSession(ctx context.Context) (*session, error) {
	for {
		r.mu.Lock()
		s, stopped, changed := r.live, r.stopped, r.changed
		r.mu.Unlock()
		switch {
		case stopped:
			return nil, ErrStopped
		case s != nil && s.ctx.Err() == nil:
			return s, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

// Worker is a worker that can change its declaration while it runs. Make
// one with New and serve with Run; the package-level Run is New plus Run
// for a worker that never changes its capabilities.
type Worker struct {
	r       *runner
	started atomic.Bool
}

// ErrStopped is returned (wrapped) by Worker.SetCapabilities once Run has
// returned, and by a second call of Worker.Run.
var ErrStopped = errors.New("worker: stopped")

// New validates cfg and returns a Worker that serves jobs with h once Run
// is called. It does not connect.
func New(cfg Config, h Handler) (*Worker, error) {
	if h == nil {
		return nil, fmt.Errorf("%w: nil Handler", ErrInvalidConfig)
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	r := &runner{
		cfg: cfg, h: h, log: cfg.Logger.With("queue", cfg.Queue), tracer: cfg.TracerProvider.Tracer(scopeName),
		caps: slices.Clone(cfg.Capabilities), changed: make(chan struct{}),
	}
	return &Worker{r: r}, nil
}

// Run connects to cfg.Server, registers and serves jobs with h until ctx is
// done, then returns nil. When a session ends for any other reason (the
// node went away, the stream broke, the node fell silent) Run cancels the
// session's jobs, waits for their handlers and reconnects with capped
// exponential backoff. It returns an error only for what retrying cannot
// fix: an invalid Config, or the node refusing the registration
// (InvalidArgument, Unimplemented, PermissionDenied, Unauthenticated); the
// gRPC status is preserved in the chain for status.Code.
//
// When Run returns, every goroutine it started has ended.
func Run(ctx context.Context, cfg Config, h Handler) error {
	w, err := New(cfg, h)
	if err != nil {
		return err
	}
	return w.Run(ctx)
}

// Run serves as the package-level Run does, with the Config and Handler
// given to New. A Worker runs once: a second call returns ErrStopped.
func (w *Worker) Run(ctx context.Context) error {
	if !w.started.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: Run was already called", ErrStopped)
	}
	r := w.r
	defer r.setLive(nil, true)
	cfg := r.cfg
	b := &sessionBackOff{
		inner: &backoff.ExponentialBackOff{
			InitialInterval:     min(initialBackoff, cfg.MaxBackoff),
			RandomizationFactor: backoff.DefaultRandomizationFactor,
			Multiplier:          2,
			MaxInterval:         cfg.MaxBackoff,
		},
		max:   cfg.MaxBackoff,
		reset: &r.healthy,
	}
	op := func() (struct{}, error) {
		err := r.session(ctx)
		if ctx.Err() != nil {
			// Shutdown is the one way a session may end that is not retried
			// and not an error.
			return struct{}{}, nil
		}
		return struct{}{}, err
	}
	_, err := backoff.Retry(ctx, op,
		backoff.WithBackOff(b),
		// A worker keeps trying for as long as it runs: a node restart of
		// any length must not leave it given up.
		backoff.WithMaxElapsedTime(0),
		backoff.WithNotify(func(err error, d time.Duration) {
			r.log.Warn("worker session ended; reconnecting", "err", err, "in", d)
		}),
	)
	if ctx.Err() != nil {
		r.log.Info("worker stopped")
		return nil
	}
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	return nil
}

// sessionBackOff is the exponential backoff with two changes: it starts
// over after a healthy session (the old delay says nothing about now), and it never exceeds max even with
// randomization applied.
type sessionBackOff struct {
	inner *backoff.ExponentialBackOff
	max   time.Duration
	reset *atomic.Bool
}

func (b *sessionBackOff) Reset() { b.inner.Reset() }

func (b *sessionBackOff) NextBackOff() time.Duration {
	if b.reset.Swap(false) {
		b.inner.Reset()
	}
	d := b.inner.NextBackOff()
	if d == backoff.Stop {
		return d
	}
	return min(d, b.max)
}

// Capabilities returns the set the worker declares: Config.Capabilities
// until a SetCapabilities succeeds, then the set it gave.
func (w *Worker) Capabilities() []string { return w.r.declared() }

// CapabilitiesError is a node's refusal of Worker.SetCapabilities; the
// worker goes on with the set it had. Code is "invalid_worker" when the
// list itself is invalid (sending it again gets the same answer) or
// "catalog_unavailable" when the node could not publish it (a retry may
// succeed); docs/errors.md lists every code.
type CapabilitiesError struct {
	Code    string
	Message string
}

// Error implements error.
func (e *CapabilitiesError) Error() string {
	return "worker: node refused capabilities: " + e.Code + ": " + e.Message
}

// SetCapabilities replaces the capabilities the worker declares ("key=value"
// strings, the complete new set) without reconnecting, for example when a
// model is loaded or unloaded:
//
//	err := w.SetCapabilities(ctx, []string{"model=llama-70b", "gpu=a100"})
//
// It returns nil once the node has republished the worker's record, so
// ingress on every node matches jobs against the new set: jobs needing it
// are offered from then on (some may arrive just before SetCapabilities
// returns), and jobs the old set allowed but the new one does not are
// refused. Jobs already running are not touched. The set is kept for every
// later registration after a reconnect.
//
// A node's refusal is a *CapabilitiesError and leaves the previous set in
// effect. When no session is registered (Run has not connected yet, or is
// reconnecting) SetCapabilities waits for one, and it sends the update again
// when a session ends before the node answered; ctx bounds the whole wait.
// If ctx ends after the update was sent, the node may still apply it, and
// Capabilities reports the outcome once the answer arrives. Once Run has
// returned, SetCapabilities returns ErrStopped. Calls are safe from any
// goroutine; concurrent ones are applied one after the other.
func (w *Worker) SetCapabilities(ctx context.Context, caps []string) error {
	caps = slices.Clone(caps)
	for {
		s, err := w.r.liveSession(ctx)
		if err != nil {
			return fmt.Errorf("worker: set capabilities: %w", err)
		}
		err = s.setCapabilities(ctx, caps)
		if !errors.Is(err, errSessionGone) {
			return err
		}
		cause := context.Cause(s.ctx)
		switch status.Code(cause) {
		case codes.InvalidArgument, codes.Unimplemented, codes.ResourceExhausted:
			// The node ended the session over the update (a node that does
			// not know the message ends it InvalidArgument): sending it
			// again on the next session would end that one too.
			return fmt.Errorf("worker: set capabilities: the node ended the session: %w", cause)
		}
		// The session ended for its own reasons; the next one registers
		// with the set the node last accepted, and gets the update again.
	}
}
