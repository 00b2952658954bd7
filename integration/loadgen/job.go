package loadgen

import (
	"encoding/json"
	"net/http"
	"slices"
	"time"
)

// Job is one POST and its stream as its client saw it, with arrival
// times. A suite's job record embeds it and adds what its jobs are; the
// loop's Mu guards it while the loop runs.
type Job struct {
	Ingress  string
	SubmitAt time.Time
	// Status is the HTTP answer (0: none); Refusal the problem code of a
	// non-200 one (Refusal); PostErr a transport error before any answer.
	Status  int
	Refusal string
	PostErr string
	ID      string
	Events  []Event
	// Terminal is the first terminal event's kind (done or error), Code
	// and Detail its error's; Terminals counts terminal events (more
	// than one is a bug).
	Terminal, Code, Detail string
	Terminals              int
	// EndAt is when the stream ended: its terminal event, a transport
	// error, or the end of the body.
	EndAt time.Time
	// Broken: the stream ended without its terminal event (a transport
	// error after the answer, or a body that ended); Open: it was still
	// open when the suite stopped waiting (the loop was halted).
	Broken string
	Open   bool
}

// Event is one SSE event of a job's stream.
type Event struct {
	Kind         string
	At           time.Time
	Seq, Attempt uint64
	// I is an output's index (-1 when not an output, or none given); By
	// the worker that sent an output (its data.by), Code an error's code.
	I        int
	By, Code string
	// AfterTerminal: the stream had already sent a terminal event.
	AfterTerminal bool
	// Gen is the stream generation the event belongs to; Reason and
	// LastSeq are a restart event's (the previous generation's last seq).
	Gen     uint64
	Reason  string
	LastSeq uint64
}

// Record appends one event of the job's stream (its SSE type and data),
// arrived at at: it takes the job's id from it when the answer had none,
// and counts terminal events, the first of which ends the job.
func (j *Job) Record(kind, data string, at time.Time) {
	var d struct {
		JobID             string `json:"job_id"`
		Gen, Seq, Attempt uint64
		Code, Detail      string
		Reason            string
		LastSeq           uint64 `json:"last_seq"`
		Data              struct {
			By string
			I  *int
		}
	}
	_ = json.Unmarshal([]byte(data), &d)
	e := Event{Kind: kind, At: at, Seq: d.Seq, Attempt: d.Attempt, Code: d.Code, By: d.Data.By, I: -1,
		Gen: d.Gen, Reason: d.Reason, LastSeq: d.LastSeq, AfterTerminal: j.Terminals > 0}
	if kind == "output" && d.Data.I != nil {
		e.I = *d.Data.I
	}
	j.Events = append(j.Events, e)
	if j.ID == "" {
		j.ID = d.JobID
	}
	if kind == "done" || kind == "error" {
		j.Terminals++
		if j.Terminals == 1 {
			j.Terminal, j.Code, j.Detail, j.EndAt = kind, d.Code, d.Detail, at
		}
	}
}

// PostFailed records a POST that got no answer, at the time the client saw
// it: cut by the loop's halt (halted), the stream is open; otherwise err
// is the job's PostErr.
func (j *Job) PostFailed(err error, halted bool) {
	j.EndAt = time.Now()
	if halted {
		j.Open = true
	} else {
		j.PostErr = err.Error()
	}
}

// refused records a non-200 answer and its problem code (Refusal).
func (j *Job) refused(status int, code string) {
	j.Status, j.Refusal, j.EndAt = status, code, time.Now()
}

// accepted records a 200 answer and the job id it names.
func (j *Job) accepted(status int, id string) { j.Status, j.ID = status, id }

// Ended reports whether the stream had ended by t (zero t: at all).
func (j *Job) Ended(t time.Time) bool {
	return !j.EndAt.IsZero() && (t.IsZero() || !j.EndAt.After(t))
}

// OutputBefore reports whether the client saw an output event before t.
func (j *Job) OutputBefore(t time.Time) bool {
	return slices.ContainsFunc(j.Events, func(e Event) bool { return e.Kind == "output" && e.At.Before(t) })
}

// OutputBy reports whether the client had seen an output event by t
// (before it or at it).
func (j *Job) OutputBy(t time.Time) bool {
	return slices.ContainsFunc(j.Events, func(e Event) bool { return e.Kind == "output" && !e.At.After(t) })
}

// Attempts are the distinct generations the job's outputs came from, in
// the order they first came.
func (j *Job) Attempts() []uint64 {
	var out []uint64
	for _, e := range j.Events {
		if e.Kind == "output" && !slices.Contains(out, e.Attempt) {
			out = append(out, e.Attempt)
		}
	}
	return out
}

// Clone is a copy of j that shares no events with it.
func (j *Job) Clone() Job {
	c := *j
	c.Events = slices.Clone(j.Events)
	return c
}

// Answer records a POST's answer to j under Mu: a refusal (its problem
// code, read with Refusal) or the accepted job's id. It returns whether
// the job was accepted and, if not, how long the client waits before its
// next job. It closes nothing.
func (l *Loop[J]) Answer(j *Job, res *http.Response) (accepted bool, wait time.Duration) {
	if res.StatusCode != http.StatusOK {
		code, wait := Refusal(res)
		l.Mu.Lock()
		j.refused(res.StatusCode, code)
		l.Mu.Unlock()
		return false, wait
	}
	l.Mu.Lock()
	j.accepted(res.StatusCode, res.Header.Get("X-Job-Id"))
	l.Mu.Unlock()
	return true, 0
}
