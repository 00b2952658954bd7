package core

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"time"
)

// This file is migration, opt-in per job: a job whose worker is lost after
// it produced output fails worker_lost by default (it may not be safe to
// run twice, and its requester has part of an answer); a job whose
// envelope says "on_worker_lost": "restart" starts again instead, on
// another capable worker, as its stream's next generation, at most
// max_restarts times and within its TTL. It is never restarted while its
// worker may still be running it (docs/cluster.md, "Restarting a job
// after its worker is lost").

// LostPolicy is what happens to a job whose worker is lost after it
// produced output.
type LostPolicy string

// Lost policies.
const (
	// LostFail ends the job worker_lost: the default.
	LostFail LostPolicy = "fail"
	// LostRestart runs the job again from the start, as its stream's next
	// generation.
	LostRestart LostPolicy = "restart"
)

// DefaultMaxRestarts is the node's restart ceiling when not told
// otherwise (--max-restarts).
const DefaultMaxRestarts = 3

// ParseLostPolicy reads an on_worker_lost value (field names where it came
// from: an envelope field or a header): "fail" or "restart", anything else
// invalid_field.
func ParseLostPolicy(s, field string) (LostPolicy, error) {
	switch p := LostPolicy(s); p {
	case LostFail, LostRestart:
		return p, nil
	}
	return "", errorf(CodeInvalidField, field, "%s must be %q or %q", field, LostFail, LostRestart)
}

// checkRestart reads an envelope's on_worker_lost and max_restarts. A
// max_restarts above the node's ceiling is refused by Limits.Apply, which
// knows the ceiling.
func checkRestart(w *wireEnvelope, env *Envelope) error {
	env.OnWorkerLost = LostFail
	if raw := w.OnWorkerLost; len(raw) > 0 && !bytes.Equal(raw, []byte("null")) {
		var s string
		if raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
			return errorf(CodeInvalidField, "on_worker_lost", "on_worker_lost must be %q or %q", LostFail, LostRestart)
		}
		p, err := ParseLostPolicy(s, "on_worker_lost")
		if err != nil {
			return err
		}
		env.OnWorkerLost = p
	}
	if raw := w.MaxRestarts; len(raw) > 0 && !bytes.Equal(raw, []byte("null")) {
		n, err := strconv.ParseInt(string(raw), 10, 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) || n < 0 {
			return errorf(CodeInvalidField, "max_restarts", "max_restarts must be a whole number, at least 0")
		}
		if errors.Is(err, strconv.ErrRange) {
			n = 1<<31 - 1 // above any ceiling: Apply refuses it
		}
		v := int(min(n, 1<<31-1))
		env.MaxRestarts = &v
	}
	return nil
}

// Attempt is one run of a job on a worker, as its ingress saw it: from the
// worker's accept to the binding's end.
type Attempt struct {
	// Attempt is the binding generation (the "attempt" of the events it
	// produced); Gen the stream generation its events belong to.
	Attempt uint64
	Gen     uint64
	// Consumer and Worker name the worker; Node the node it is connected
	// to.
	Consumer string
	Worker   string
	Node     string
	Started  time.Time
	// Ended is zero while the attempt runs. Reason is how it ended: the
	// job's outcome code ("completed" for a success), or "worker_lost:"
	// and what was lost.
	Ended  time.Time
	Reason string
}

// lost is what the ingress knows of the worker of a binding that ended
// without an outcome: whether it may still run the job.
type lost uint8

const (
	// lostStopped: the binding's host let go of it. The worker's session
	// ended, or the host stopped the job on the worker (told it to, and
	// forwards nothing more of it) before it released it.
	lostStopped lost = iota
	// lostProven: the node that held the binding is proven dead (its
	// record gone with its lease, or a new incarnation in its place): it
	// fenced itself before, and runs nothing.
	lostProven
	// lostRunning: the worker may still be running the job: its host was
	// only sent a cancel (the job left the host's zone). Such a job is
	// never restarted.
	lostRunning
)

// restartReason is the restart event's reason and the restarts metric's
// label for how the previous generation's worker was lost.
func (l lost) restartReason() string {
	if l == lostProven {
		return "node_gone"
	}
	return "worker_lost"
}

// startAttemptLocked records the run the worker's accept of the current
// binding starts.
func (e *Engine) startAttemptLocked(j *Job, now time.Time) {
	node := j.host
	if node == "" {
		// No response leg named a host: the worker is this node's.
		node = e.cfg.Node
	}
	j.attempts = append(j.attempts, Attempt{
		Attempt: j.gen, Gen: j.History.Generation(), Consumer: j.consumer, Worker: j.worker, Node: node, Started: now,
	})
}

// endAttemptLocked ends the current binding's run, if one is open.
func (e *Engine) endAttemptLocked(j *Job, reason string, now time.Time) {
	if n := len(j.attempts); n > 0 && j.attempts[n-1].Attempt == j.gen && j.attempts[n-1].Ended.IsZero() {
		j.attempts[n-1].Ended, j.attempts[n-1].Reason = now, reason
	}
}

// lostWithOutputLocked decides for a job whose worker was lost after it
// had produced output: it restarts if it opted in, has a restart left and
// TTL left, and its worker is known not to run it any more; otherwise it
// fails worker_lost, saying why it did not restart.
func (e *Engine) lostWithOutputLocked(j *Job, consumer string, how lost, reason string) {
	why := ""
	switch {
	case j.Env.OnWorkerLost != LostRestart:
	case how == lostRunning:
		why = "; not restarted: its worker may still be running it"
	case j.restarts >= j.Limits.MaxRestarts:
		why = "; not restarted: it used its " + strconv.Itoa(j.Limits.MaxRestarts) + " restarts"
	case !time.Now().Before(j.deadline):
		why = "; not restarted: its TTL ran out"
	case e.closed:
		why = "; not restarted: the node is closing"
	default:
		e.restartLocked(j, consumer, how, reason)
		return
	}
	e.finishLocked(j, CodeWorkerLost, "the worker was lost after it had produced output: "+reason+why, nil)
}

// restartLocked runs a job that lost its worker after it produced output
// again from the start: a restart event opens its stream's next
// generation, then the job goes back to its queue under a new binding
// generation (reforwardLocked), ahead of new arrivals, never again to the
// consumer it was lost on. The event comes before anything the new
// generation produces: both are appended under Engine.mu, the event first.
func (e *Engine) restartLocked(j *Job, consumer string, how lost, reason string) {
	if consumer == "" {
		consumer = j.consumer
	}
	if consumer != "" {
		if j.exclude == nil {
			j.exclude = map[string]bool{}
		}
		j.exclude[consumer] = true
	}
	j.restarts++
	// The new generation's output is its own: max_output_bytes bounds
	// each generation, and "produced" is the new generation's to set.
	j.produced, j.outBytes = false, 0
	cause := how.restartReason()
	e.m.Restarts.WithLabelValues(cause).Inc()
	e.logJob(j.trace, slog.LevelInfo, "restarting a job whose worker was lost after it produced output",
		"job", j.ID, "gen", j.gen, "restarts", j.restarts, "reason", reason)
	// reforwardLocked makes the binding generation j.gen+1.
	j.History.Append(EventRestart, j.gen+1, mustJSON(map[string]any{
		"reason": cause, "detail": reason, "last_seq": j.History.Head(),
		"restarts": j.restarts, "max_restarts": j.Limits.MaxRestarts,
	}))
	e.reforwardLocked(j)
}
