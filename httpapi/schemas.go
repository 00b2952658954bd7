package httpapi

// The types in this file describe JSON the node reads or writes without
// going through them (core parses the envelope; core/stream writes event
// data): they exist for the OpenAPI document, which swag builds from Go
// types. The integration tests drive every route through a client
// generated from that document, which is what keeps them true.

// Envelope is the body of POST /v1/queues/{queue}/jobs. Only input is
// required; unknown fields are ignored.
type Envelope struct {
	// Version of the envelope format; this node reads 1.
	Version int `json:"version,omitempty" example:"1"`
	// TTLMs is how long the job may take from now, in milliseconds: at most
	// the node's --max-ttl; absent means its --default-ttl.
	TTLMs int64 `json:"ttl_ms,omitempty" example:"30000"`
	// Capabilities a worker must have, one value per key.
	Capabilities map[string]string `json:"capabilities,omitempty"`
	// Input is handed to the worker as is: any JSON value but null.
	Input any `json:"input"`
	// Options is handed to the worker as is: a JSON object.
	Options map[string]any `json:"options,omitempty"`
	// Limits lower the node's ceilings for this job (never raise them).
	Limits *EnvelopeLimits `json:"limits,omitempty"`
	// Zone, when set, keeps the job on workers of nodes in that zone.
	Zone string `json:"zone,omitempty"`
	// GraceMs keeps a job streamed from its POST alive this long after its
	// client disconnects, so that a resume can pick it up; values above the
	// node's --max-grace are capped to it.
	GraceMs int64 `json:"grace_ms,omitempty"`
	// AffinityKey sends the job to the same capable worker as every other
	// job with this key, while that worker lives and has room: a session,
	// a user, a cache's prefix. 1 to 256 bytes (docs/scheduling.md).
	AffinityKey string `json:"affinity_key,omitempty" minLength:"1" maxLength:"256" example:"session-42"`
	// Priority orders the job among its subject's waiting jobs, higher
	// first, with aging so that nothing starves: -5 to 5 (default 0), at
	// most the key's max_priority (docs/scheduling.md).
	Priority int `json:"priority,omitempty" minimum:"-5" maximum:"5"`
	// OnWorkerLost is what happens if the job's worker is lost after it
	// produced output: "fail" (the default) ends it worker_lost; "restart"
	// runs it again from the start on another capable worker, as its
	// stream's next generation, announced by a restart event, at most
	// max_restarts times and within its TTL (docs/cluster.md).
	OnWorkerLost string `json:"on_worker_lost,omitempty" enums:"fail,restart" example:"restart"`
	// MaxRestarts lowers the node's --max-restarts for this job: 0 to the
	// node's ceiling (above it: limit_above_ceiling); absent means the
	// node's.
	MaxRestarts *int `json:"max_restarts,omitempty" minimum:"0" example:"2"`
} // @name Envelope

// EnvelopeLimits are the limits an envelope lowers. Each is at least 1
// and at most the node's; absent means the node's.
type EnvelopeLimits struct {
	MaxInputBytes  int64 `json:"max_input_bytes,omitempty"`
	MaxQueueDepth  int   `json:"max_queue_depth,omitempty"`
	MaxQueueBytes  int64 `json:"max_queue_bytes,omitempty"`
	MaxOutputBytes int64 `json:"max_output_bytes,omitempty"`
} // @name EnvelopeLimits

// EventStream describes a job's text/event-stream. Each field is one SSE
// event type: its name is the event's "event:" line, its schema the JSON
// of its "data:" line. Job events (accepted, output, restart, done, error) carry a
// signed resume token as their "id:"; control events (gap, resync,
// terminated) carry none, and heartbeats are comment lines
// (": heartbeat"). The stream ends after done or error, or after resync or
// terminated.
type EventStream struct {
	Accepted   AcceptedEvent   `json:"accepted"`
	Output     OutputEvent     `json:"output"`
	Restart    RestartEvent    `json:"restart"`
	Done       DoneEvent       `json:"done"`
	Error      ErrorEvent      `json:"error"`
	Gap        GapEvent        `json:"gap"`
	Resync     ResyncEvent     `json:"resync"`
	Terminated TerminatedEvent `json:"terminated"`
} // @name EventStream

// EventEnvelope starts the data of every job event.
type EventEnvelope struct {
	// JobID is the stream id: the job.
	JobID string `json:"job_id"`
	// Gen is the stream generation the event belongs to: 1, and one more
	// after each restart event. Sequence numbers go on across generations.
	Gen uint64 `json:"gen"`
	// Seq is the event's position in the job's stream, from 1.
	Seq uint64 `json:"seq"`
	// Snap is the snapshot version of the history (the node incarnation).
	Snap uint64 `json:"snap"`
	// Attempt is the binding generation that produced the event (0 before
	// a worker was bound).
	Attempt uint64 `json:"attempt"`
} // @name EventEnvelope

// AcceptedEvent is the first event: the node took the job.
type AcceptedEvent struct {
	EventEnvelope
	Queue string `json:"queue"`
	TTLMs int64  `json:"ttl_ms"`
	// TraceID is the job's W3C trace id (32 hex digits): the trace of the
	// request's traceparent, or a new one (docs/tracing.md).
	TraceID string `json:"trace_id" example:"4bf92f3577b34da6a3ce929d0e0e4736"`
} // @name AcceptedEvent

// OutputEvent is one chunk of output, in the order the worker sent it.
type OutputEvent struct {
	EventEnvelope
	// Data is the chunk: one JSON value.
	Data any `json:"data"`
} // @name OutputEvent

// RestartEvent says the job's worker was lost after it produced output and
// the job (on_worker_lost: restart) runs again from the start: every event
// before it belongs to the previous stream generation, whose output the
// client should set aside. Its envelope's gen and attempt are the new
// generation's.
type RestartEvent struct {
	EventEnvelope
	// Reason is how the previous generation's worker was lost:
	// worker_lost (its session ended, or its node stopped it) or
	// node_gone (its node's death was proven).
	Reason string `json:"reason" enums:"worker_lost,node_gone"`
	// Detail says what was lost, for people.
	Detail string `json:"detail"`
	// LastSeq is the seq of the previous generation's last event.
	LastSeq uint64 `json:"last_seq"`
	// Restarts is how many times the job restarted, this one included;
	// MaxRestarts how many times it may.
	Restarts    int `json:"restarts"`
	MaxRestarts int `json:"max_restarts"`
} // @name RestartEvent

// DoneEvent ends a job that completed.
type DoneEvent struct {
	EventEnvelope
	// Outcome is "completed".
	Outcome string `json:"outcome" enums:"completed"`
	// Result is the worker's result, if it gave one.
	Result any `json:"result,omitempty"`
} // @name DoneEvent

// ErrorEvent ends a job that did not complete.
type ErrorEvent struct {
	EventEnvelope
	Outcome string `json:"outcome" enums:"failed,cancelled,expired"`
	// Code is one of docs/errors.md's outcome codes, or a code the worker
	// failed the job with.
	Code   string `json:"code"`
	Detail string `json:"detail"`
} // @name ErrorEvent

// GapEvent says a drop-oldest stream skipped events, or that a stream read
// from the start begins after events no longer retained.
type GapEvent struct {
	JobID   string `json:"job_id"`
	FromSeq uint64 `json:"from_seq"`
	ToSeq   uint64 `json:"to_seq"`
	Dropped uint64 `json:"dropped"`
	Detail  string `json:"detail"`
} // @name GapEvent

// ResyncEvent ends a stream whose position is older than the retained
// history: start over.
type ResyncEvent struct {
	JobID     string `json:"job_id"`
	OldestSeq uint64 `json:"oldest_seq"`
	AfterSeq  uint64 `json:"after_seq"`
	Detail    string `json:"detail"`
} // @name ResyncEvent

// TerminatedEvent ends a stream the node ended (the job goes on): resume
// with the last id received.
type TerminatedEvent struct {
	JobID          string `json:"job_id"`
	Reason         string `json:"reason" enums:"slow_consumer,idle,max_duration"`
	ResumeAfterSeq uint64 `json:"resume_after_seq"`
	// LagEvents and LagBytes are the stream's queue when it was judged
	// slow (slow_consumer only).
	LagEvents int    `json:"lag_events,omitempty"`
	LagBytes  int64  `json:"lag_bytes,omitempty"`
	Detail    string `json:"detail"`
} // @name TerminatedEvent
