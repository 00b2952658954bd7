package core

import (
	"crypto/rand"
	"encoding/base32"
	"time"
	"unsafe"

	"go.opentelemetry.io/otel/trace"
)

// State is where a job is in its life.
//
//	queued ──bind──▶ offered ──accept──▶ running ──end──▶ completed | failed
//	  ▲                │  │                │
//	  └──reject/reclaim┘  └──────reclaim───┘ (only with no output yet)
//	any non-terminal ──────────────────────────────────▶ cancelled | expired | failed
type State string

// Job states.
const (
	StateQueued    State = "queued"
	StateOffered   State = "offered"
	StateRunning   State = "running"
	StateCompleted State = "completed"
	StateFailed    State = "failed"
	StateCancelled State = "cancelled"
	StateExpired   State = "expired"
)

// Terminal reports whether s is an outcome.
func (s State) Terminal() bool {
	switch s {
	case StateCompleted, StateFailed, StateCancelled, StateExpired:
		return true
	}
	return false
}

// CanMove reports whether the state machine allows s → to. Every transition
// the engine makes goes through it, so the diagram above is enforced, not
// just drawn.
func (s State) CanMove(to State) bool {
	if s.Terminal() {
		return false
	}
	switch to {
	case StateOffered:
		return s == StateQueued
	case StateRunning:
		return s == StateOffered
	case StateQueued:
		return s == StateOffered || s == StateRunning
	case StateCompleted:
		return s == StateOffered || s == StateRunning
	case StateFailed, StateCancelled, StateExpired:
		return true
	}
	return false
}

// Outcome is the one terminal outcome a job ends with, as counted by
// switchyard_jobs_total{outcome}.
type Outcome string

// Outcomes.
const (
	OutcomeCompleted Outcome = "completed"
	OutcomeFailed    Outcome = "failed"
	OutcomeCancelled Outcome = "cancelled"
	OutcomeExpired   Outcome = "expired"
)

// outcomeFor maps a terminal code to its outcome and state.
func outcomeFor(code Code) (Outcome, State) {
	switch code {
	case "":
		return OutcomeCompleted, StateCompleted
	case CodeCancelled:
		return OutcomeCancelled, StateCancelled
	case CodeExpired:
		return OutcomeExpired, StateExpired
	}
	return OutcomeFailed, StateFailed
}

// Job is the ingress node's record of one job: the requester-facing half.
// Fields after the marker are guarded by Engine.mu.
type Job struct {
	ID    string
	Queue string
	// Owner is the subject that submitted the job ("" on a node without
	// keys).
	Owner   string
	Created time.Time
	Limits  Effective
	// History is the job's event log; streams read it with their own cursors.
	History *History

	deadline time.Time
	// trace is the job's trace context: its span's (trace.go).
	trace trace.SpanContext

	// guarded by Engine.mu
	//
	// span is the job's span, ended with its outcome; await is the span
	// of its wait for a dispatcher while it waits for one (reroute.go).
	span  trace.Span
	await trace.Span
	//
	// Env is the envelope as submitted. It is dropped (nil) when the job
	// ends: an ended job is kept only for late readers, who get its
	// events, never its input (see Job.trim).
	Env           *Envelope
	state         State
	gen           uint64
	consumer      string
	worker        string
	produced      bool
	outBytes      int64
	slab          eventSlab
	outputs       int
	code          Code
	detail        string
	ended         time.Time
	firstOutputAt time.Time
	timer         *time.Timer
	// streamed: the job was submitted as a stream, so it lives while one
	// of its owner streams reads it (owners counts those open now), and
	// for the grace window graceTimer runs after the last one ended (see
	// StreamClosed).
	streamed   bool
	owners     int
	graceTimer *time.Timer
	// rerouteTimer routes the job again one heartbeat after a dispatcher
	// that was shutting down or fenced refused its forward (reroute.go).
	rerouteTimer *time.Timer
	// pace is the current binding's output credit (credit.go); nil once
	// the job ended.
	pace    *pace
	idemKey string
	// weight is the owner's fair-share weight (SubmitOptions.Share).
	weight int
	// idemHash is the keyed submission's hash (submissionHash).
	idemHash string
	// onEnd is SubmitOptions.OnEnd, called by finishLocked.
	onEnd func()
	// dispatcher is the node the current generation was forwarded to;
	// host is the node its consumer lives on, once a reply names it (""
	// before: a dispatcher at the consumer's node answers only with the
	// first output or the end, see host.go).
	dispatcher string
	host       string
	// stopForward ends a new job's forward still going on in the
	// background once the job ends (see forwardNew).
	stopForward func()
	// exclude holds the consumers that refused the job.
	exclude map[string]bool
	// settled is set when the nodes downstream have let go of the job
	// (its worker ended it, or the dispatcher failed it): ending it then
	// sends them no cancel.
	settled bool
	// restarts counts the job's restarts (restart.go); attempts records
	// each run on a worker, for its view.
	restarts int
	attempts []Attempt
	// retainedBytes is what the job is accounted for against RetainBytes
	// once it ended (see retain.go).
	retainedBytes int64
}

// StreamGeneration is the generation of the job's event stream now: 1,
// and one more with each restart (a job that opted into restarts and lost
// its worker after it had produced output, see restart.go). A job that
// went back to the queue before any output keeps its stream generation.
// Sequence numbers go on across generations, so a resume token from an
// earlier generation still names one event and resumes after it
// (stream.Positions). Binding generations (fencing) are separate: see
// Event.Gen.
func (j *Job) StreamGeneration() uint64 { return j.History.Generation() }

// JobView is a snapshot of a job for GET /v1/jobs/{id} and friends.
type JobView struct {
	ID         string
	Queue      string
	Owner      string
	State      State
	Outcome    Outcome
	Code       Code
	Detail     string
	Generation uint64
	HandledBy  string
	WorkerName string
	Created    time.Time
	Ended      time.Time
	TTL        time.Duration
	Remaining  time.Duration
	Outputs    int
	LastSeq    uint64
	// WaitingForReader is true while the job's worker has used all its
	// output credit: it goes on as the job's reader takes its output.
	WaitingForReader bool
	// TraceID is the job's W3C trace id (32 hex digits).
	TraceID string
	// StreamGeneration is the stream generation now (1 plus the restarts);
	// Restarts the job's restarts so far, MaxRestarts its ceiling, and
	// OnWorkerLost its policy ("" once the job ended).
	StreamGeneration uint64
	Restarts         int
	MaxRestarts      int
	OnWorkerLost     LostPolicy
	// Attempts are the job's runs on workers, oldest first.
	Attempts []Attempt
}

func (j *Job) view(now time.Time) JobView {
	v := JobView{
		ID: j.ID, Queue: j.Queue, Owner: j.Owner, State: j.state, Code: j.code, Detail: j.detail,
		Generation: j.gen, HandledBy: j.consumer, WorkerName: j.worker,
		Created: j.Created, Ended: j.ended, TTL: j.Limits.TTL, Outputs: j.outputs,
		LastSeq: j.History.Head(), WaitingForReader: j.pace.waiting(),
		TraceID:          j.trace.TraceID().String(),
		StreamGeneration: j.History.Generation(), Restarts: j.restarts, MaxRestarts: j.Limits.MaxRestarts,
		Attempts: append([]Attempt(nil), j.attempts...),
	}
	if j.Env != nil {
		v.OnWorkerLost = j.Env.OnWorkerLost
		if v.OnWorkerLost == "" {
			v.OnWorkerLost = LostFail
		}
	}
	if j.state.Terminal() {
		v.Outcome, _ = outcomeFor(j.code)
	} else {
		v.Remaining = max(j.deadline.Sub(now), 0)
	}
	return v
}

var idEncoding = base32.NewEncoding("0123456789abcdefghijklmnopqrstuv").WithPadding(base32.NoPadding)

// newID returns a random id with a prefix, e.g. "j_3k9…". 80 random bits:
// ids are unguessable handles, not just labels, since a job id is enough to
// read its stream.
func newID(prefix string) string {
	var b [10]byte
	_, _ = rand.Read(b[:])
	// Built in place, as strings.Builder does: one allocation, never
	// written once it is the string. The alphabet is lower case already.
	buf := make([]byte, len(prefix)+idEncoding.EncodedLen(len(b)))
	idEncoding.Encode(buf[copy(buf, prefix):], b[:])
	return unsafe.String(unsafe.SliceData(buf), len(buf))
}
