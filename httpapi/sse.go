package httpapi

import (
	"bytes"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	sse "github.com/tmaxmax/go-sse"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/stream"
)

// sseSink writes one job stream as server-sent events. The go-sse encoder
// validates ids and event names, so no CR or LF from anywhere can reach an
// id: or event: line; data is JSON we compacted, one line.
type sseSink struct {
	sseConn
	job  *core.Job
	snap uint64

	// retryHint is sent once, as the retry: field of the first message.
	retryHint time.Duration
	// retrySent: the first message carries retry:, asking browsers to
	// reconnect after 1s instead of their default 3s — a dropped stream
	// resumes by itself, so sooner is better. It rides on a real event: a
	// block with nothing but retry: trips up some clients.
	retrySent bool
	// ended: the job's terminal event was written (see Flush).
	ended bool
}

var _ stream.Sink = (*sseSink)(nil)

// Event writes a job event as one SSE message, in one Write: the bytes
// go-sse would write for it (id, event, retry on the first, data), built in
// a pooled buffer rather than through an sse.Message, which costs a
// validation pass over the token, a string copy of the data and several
// writes per event. What the go-sse encoder would refuse or split — a CR
// or LF in the id, the event name or the data, which cannot come from our
// own tokens, kinds and compacted JSON — is left to it.
func (s *sseSink) Event(ev core.Event, token []byte) error {
	bp := sseBufs.Get().(*[]byte)
	defer sseBufs.Put(bp)
	b := append((*bp)[:0], "id: "...)
	b = append(b, token...)
	b = append(b, "\nevent: "...)
	b = append(b, ev.Kind...)
	r := s.retry()
	if r > 0 {
		b = append(b, "\nretry: "...)
		b = strconv.AppendInt(b, r.Milliseconds(), 10)
	}
	b = append(b, "\ndata: "...)
	data := len(b)
	b = stream.AppendEventData(b, s.job, ev, s.snap)
	*bp = b
	s.ended = ev.Kind.Terminal()
	if !sseLineBytes(token) || !sseLine(string(ev.Kind)) || bytes.IndexByte(b[data:], '\n') >= 0 || bytes.IndexByte(b[data:], '\r') >= 0 {
		return s.eventSlow(ev, token, r, b[data:])
	}
	if len(token) == 0 {
		b = b[len("id: \n"):]
	}
	b = append(b, "\n\n"...)
	*bp = b
	_, err := s.w.Write(b)
	return err
}

// Flush hands what was written to the connection, but for the flush that
// follows the job's terminal event: the stream ends with that event
// (stream.Run returns, and streamJob's handler with it), and net/http then
// writes what its buffers hold together with the end of the chunked
// response, in one write syscall instead of two per stream. The terminal
// event therefore reaches the client when the handler returns, a few
// microseconds later, in the same segment as the end of the response.
func (s *sseSink) Flush() error {
	if s.ended {
		return nil
	}
	return s.sseConn.Flush()
}

// sseBufs are Event's buffers: an open stream holds none while it waits.
var sseBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// sseLine reports whether s can be an SSE field value as it is.
func sseLine(s string) bool {
	return strings.IndexByte(s, '\n') < 0 && strings.IndexByte(s, '\r') < 0 && strings.IndexByte(s, 0) < 0
}

// sseLineBytes is sseLine for bytes.
func sseLineBytes(b []byte) bool {
	return bytes.IndexByte(b, '\n') < 0 && bytes.IndexByte(b, '\r') < 0 && bytes.IndexByte(b, 0) < 0
}

// eventSlow is Event through the go-sse encoder, which validates the id
// and event name and splits data lines.
func (s *sseSink) eventSlow(ev core.Event, token []byte, retry time.Duration, data []byte) error {
	m := &sse.Message{Type: sse.Type(string(ev.Kind)), Retry: retry}
	if len(token) > 0 {
		m.ID = sse.ID(string(token))
	}
	m.AppendData(string(data))
	_, err := m.WriteTo(s.w)
	return err
}

func (s *sseSink) Control(c stream.Control, data map[string]any) error {
	m := &sse.Message{Type: sse.Type(string(c)), Retry: s.retry()}
	m.AppendData(string(stream.ControlData(data)))
	_, err := m.WriteTo(s.w)
	return err
}

// retry returns the reconnect hint for the first message, zero after.
func (s *sseSink) retry() time.Duration {
	if s.retrySent {
		return 0
	}
	s.retrySent = true
	return s.retryHint
}

// sseConn is the connection side of an SSE stream, shared by the sinks of
// our own streams and the OpenAI-compatible ones: flushing, write
// deadlines, and making room for a last event when the stream is aborted.
type sseConn struct {
	w  http.ResponseWriter
	rc *http.ResponseController

	// conn is the connection the stream is written on (nil when unknown),
	// and writeBuffer its SO_SNDBUF cap (0: none): what Abort needs to make
	// room for the terminated event.
	conn        *net.TCPConn
	writeBuffer int

	mu      sync.Mutex
	aborted bool
}

// newSSEConn returns the connection side of a stream answering r on w.
func (s *Server) newSSEConn(w http.ResponseWriter, r *http.Request) sseConn {
	return sseConn{w: w, rc: http.NewResponseController(w), conn: tcpConn(r.Context()), writeBuffer: s.cfg.WriteBuffer}
}

func (s *sseConn) Flush() error { return s.rc.Flush() }

// Heartbeat writes an SSE comment line: liveness only. Clients ignore
// comments (OpenAI's SDKs skip them too), so it can never be mistaken for
// an event or an acknowledgement.
func (s *sseConn) Heartbeat() error {
	m := &sse.Message{}
	m.AppendComment("heartbeat")
	_, err := m.WriteTo(s.w)
	return err
}

func (s *sseConn) SetWriteDeadline(t time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.aborted {
		return nil
	}
	return s.rc.SetWriteDeadline(t)
}

// Abort bounds a write stuck on a slow client, and all later ones, by
// deadline, and makes room for the write in progress and the terminated
// event. net.Conn deadlines and socket options are safe to set from another
// goroutine; that is why this method may be called concurrently with the
// writer.
//
// The room: Linux wakes a writer blocked on a full send buffer only once a
// third of it is free again (sk_stream_min_wspace); for a client reading a
// few hundred KiB/s behind a capped buffer that is still most of a second,
// too close to the grace, and past it on a loaded node. Raising SO_SNDBUF
// makes the kernel recheck at once, so the blocked write returns now,
// followed by the terminated event, and the stream ends without waiting on
// the client: one that still reads gets the event after what was already
// queued. The raise is one more cap, once, on a stream that is ending.
func (s *sseConn) Abort(deadline time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.aborted = true
	_ = s.rc.SetWriteDeadline(deadline)
	if s.conn != nil && s.writeBuffer > 0 {
		_ = s.conn.SetWriteBuffer(2 * s.writeBuffer)
	}
}

// streamJob serves a job's stream from after as server-sent events. claim
// marks a stream that is the submitter's — the job's own POST, or a resume
// with a valid token (stream.JobStream.Claim).
func (s *Server) streamJob(w http.ResponseWriter, r *http.Request, j *core.Job, after uint64, filter map[core.EventKind]bool, slow stream.SlowPolicy, claim bool) stream.Result {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	h.Set("X-Job-Id", j.ID)
	w.WriteHeader(http.StatusOK)

	door := stream.Door{Engine: s.e, Resumes: s.resumes(), Policy: s.cfg.Stream}
	return door.Serve(r.Context(), stream.JobStream{
		Job: j, After: after, Filter: filter, Slow: slow, Claim: claim, Caller: callerFingerprint(r),
	}, &sseSink{sseConn: s.newSSEConn(w, r), job: j, snap: s.e.Epoch(), retryHint: s.cfg.RetryHint})
}
