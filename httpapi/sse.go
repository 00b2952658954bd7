package httpapi

import (
	"bytes"
	"errors"
	"net/http"
	"strconv"
	"time"

	sse "github.com/tmaxmax/go-sse"

	"github.com/switchyard/switchyard/core"
)

// readBatch is how many events a stream takes from the history per read.
const readBatch = 64

// stream writes a job's events as server-sent events, starting after the
// cursor. It is the stream's one writer: it reads the job's History with its
// own cursor, so a slow client costs the node nothing but that cursor, and
// is bounded by how far behind the head it may fall (MaxLagEvents,
// MaxLagBytes) rather than by a queue that grows.
//
// owner marks the stream opened by the job's POST: its client leaving before
// the terminal event cancels the job (after the envelope's grace window).
func (s *Server) stream(w http.ResponseWriter, r *http.Request, j *core.Job, after uint64, owner bool) {
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	h.Set("X-Job-Id", j.ID)
	w.WriteHeader(http.StatusOK)

	s.e.StreamOpened(j.ID)
	s.m.streamsOpen.Inc()
	clientLeft := true
	defer func() {
		s.m.streamsOpen.Dec()
		s.e.StreamClosed(j.ID, owner && clientLeft)
	}()

	write := func(m *sse.Message) error {
		// A client that cannot take a write within WriteTimeout is gone or
		// hopelessly slow: end the stream; it resumes from its last id.
		_ = rc.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
		_, err := m.WriteTo(w)
		return err
	}
	heartbeat := time.NewTimer(s.cfg.HeartbeatInterval)
	defer heartbeat.Stop()
	cursor := after
	for {
		rd, oldest, err := j.History.Since(cursor, readBatch)
		if errors.Is(err, core.ErrHistoryGone) {
			clientLeft = false
			m := &sse.Message{Type: sse.Type("resync")}
			m.AppendData(string(mustJSON(map[string]any{
				"job_id": j.ID, "oldest_seq": oldest, "detail": "full resync required: the events after your position are no longer retained",
			})))
			_ = write(m)
			_ = rc.Flush()
			return
		}
		if rd.LagEvents > s.cfg.MaxLagEvents || rd.LagBytes > s.cfg.MaxLagBytes {
			// Terminate, never drop silently: the client resumes from the id
			// of the last event it got, inside retained history.
			clientLeft = false
			s.m.slowClosed.Inc()
			m := &sse.Message{Type: sse.Type("terminated")}
			m.AppendData(string(mustJSON(map[string]any{
				"job_id": j.ID, "reason": "slow_consumer", "resume_after_seq": cursor,
				"detail": "the stream fell too far behind; reconnect with Last-Event-ID set to the last id you received",
			})))
			_ = write(m)
			_ = rc.Flush()
			return
		}
		for _, ev := range rd.Events {
			m := &sse.Message{ID: sse.ID(s.eventID(j, ev)), Type: sse.Type(string(ev.Kind))}
			m.AppendData(string(eventData(j, ev)))
			if err := write(m); err != nil {
				return
			}
			cursor = ev.Seq
			if ev.Kind.Terminal() {
				clientLeft = false
			}
		}
		if len(rd.Events) > 0 {
			if err := rc.Flush(); err != nil {
				return
			}
			if !clientLeft {
				return
			}
			heartbeat.Reset(s.cfg.HeartbeatInterval)
			if len(rd.Events) == readBatch {
				continue
			}
		}
		select {
		case <-rd.Wake:
		case <-heartbeat.C:
			// A heartbeat is liveness only: it acknowledges nothing and says
			// nothing about order. Do not reuse it as either.
			m := &sse.Message{}
			m.AppendComment("heartbeat")
			if write(m) != nil || rc.Flush() != nil {
				return
			}
			heartbeat.Reset(s.cfg.HeartbeatInterval)
		case <-r.Context().Done():
			return
		}
	}
}

// eventID is the SSE id of an event: the position a client resumes from.
func (s *Server) eventID(_ *core.Job, ev core.Event) string {
	return strconv.FormatUint(ev.Seq, 10)
}

// cursor reads the resume position of a GET stream.
func (s *Server) cursor(r *http.Request, j *core.Job) (uint64, error) {
	raw := r.Header.Get("Last-Event-ID")
	if q := r.URL.Query().Get("last_event_id"); q != "" {
		raw = q
	}
	if raw == "" {
		return 0, nil
	}
	seq, err := strconv.ParseUint(raw, 10, 64)
	if err != nil || seq > j.History.Head() {
		return 0, &core.Error{Code: CodeInvalidCursor, Detail: "the resume position is not valid for this job"}
	}
	return seq, nil
}

// eventData is the JSON data of an event: the stream envelope (job, gen,
// seq) followed by the event's own fields.
func eventData(j *core.Job, ev core.Event) []byte {
	var b bytes.Buffer
	b.Grow(len(ev.Data) + 64)
	b.WriteString(`{"job_id":`)
	b.Write(mustJSON(j.ID))
	b.WriteString(`,"gen":`)
	b.WriteString(strconv.FormatUint(ev.Gen, 10))
	b.WriteString(`,"seq":`)
	b.WriteString(strconv.FormatUint(ev.Seq, 10))
	if inner := bytes.TrimSpace(ev.Data); len(inner) > 2 {
		b.WriteByte(',')
		b.Write(inner[1:])
	} else {
		b.WriteByte('}')
	}
	return b.Bytes()
}
