package core

import "time"

// This file is the ingress's side of a job after its submission: the job
// read and cancelled by its requester, and the bookkeeping of its streams
// (owner streams and the grace window), which decides how long a streamed
// job lives.

// Job returns the job record for streaming.
func (e *Engine) Job(id string) (*Job, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	j := e.jobs[id]
	if j == nil {
		return nil, errJobNotFound()
	}
	return j, nil
}

// JobNotFound is the answer for a job the caller may not see: word for
// word the answer for one the node does not have, so that an id cannot be
// probed.
func JobNotFound() *Error { return errJobNotFound() }

// errJobNotFound is the answer for an id the node has no record of: it
// never had it, or the job ended and was evicted (retain.go). The two are
// one answer: telling them apart would take a record of every evicted job.
func errJobNotFound() *Error {
	return &Error{Code: CodeJobNotFound, Detail: "no job with this id on this node: it never existed here, or it ended and is no longer retained (a node keeps ended jobs for a limited time, number and size)"}
}

// View returns a snapshot of a job.
func (e *Engine) View(id string) (JobView, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	j := e.jobs[id]
	if j == nil {
		return JobView{}, errJobNotFound()
	}
	return j.view(time.Now()), nil
}

// Cancel ends a job as cancelled; a worker running it is told at once. It
// returns the job's view afterwards. Cancelling an ended job changes nothing.
func (e *Engine) Cancel(id, detail string) (JobView, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	j := e.jobs[id]
	if j == nil {
		return JobView{}, errJobNotFound()
	}
	e.finishLocked(j, CodeCancelled, detail, nil)
	return j.view(time.Now()), nil
}

// StreamOpened records that a stream of the job opened and reports whether
// it is an owner stream: one that keeps the job alive. claim is the
// transport's word that the stream is the submitter's — the stream of the
// job's own submission, or a resume whose token verified (the token is the
// proof: it is signed for the caller and the stream's filter). Only a job
// submitted as streamed has owner streams. An owner stream opened during the
// job's grace window saves the job: the window stops. Any other stream only
// watches, and its coming and going changes nothing.
func (e *Engine) StreamOpened(id string, claim bool) (owner bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	j := e.jobs[id]
	if j == nil || !claim || !j.streamed || j.state.Terminal() {
		return false
	}
	j.owners++
	if j.graceTimer != nil {
		// Stopped, or fired with its callback still waiting for e.mu: either
		// way the window is over without a cancel (the callback checks that
		// it is still the job's window).
		j.graceTimer.Stop()
		j.graceTimer = nil
		e.m.GraceSaves.Inc()
	}
	return true
}

// StreamClosed records that a stream ended; owner is what StreamOpened
// returned for it, and a stream that was not an owner changes nothing. When
// the last owner stream of a running job ends, the job is given a grace
// window to be resumed in, and is cancelled if no owner stream opens
// within it:
//   - clientLeft (the client went away, or stopped reading so that a write
//     failed): the envelope's grace window; without one the job is
//     cancelled at once.
//   - otherwise the node ended the stream (slow consumer, idle, max
//     duration, resync) and told the client to resume: the envelope's
//     window, or the node's MaxGrace if it asked for none. Cancelling at
//     once would break the node's own word, and running to the TTL would
//     hold a worker for a client that may never come back. With a MaxGrace
//     of 0 there is no window to give, and the job runs to its TTL.
func (e *Engine) StreamClosed(id string, owner, clientLeft bool) {
	if !owner {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	j := e.jobs[id]
	if j == nil {
		return
	}
	j.owners--
	if j.owners > 0 || j.state.Terminal() || e.closed {
		return
	}
	window, detail := j.Limits.Grace, "the client disconnected and did not resume within the grace window"
	switch {
	case clientLeft && window <= 0:
		e.finishLocked(j, CodeCancelled, "the client disconnected", nil)
		return
	case !clientLeft:
		if window <= 0 {
			window = e.cfg.Limits.MaxGrace
		}
		detail = "the node ended the client's stream and the client did not resume within the grace window"
	}
	if window <= 0 {
		return
	}
	stopTimer(j.graceTimer)
	var t *time.Timer
	t = time.AfterFunc(window, func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		// A window that an owner stream stopped, or that a later one
		// replaced, is not this timer's to end.
		if j.graceTimer != t || e.closed {
			return
		}
		j.graceTimer = nil
		if j.owners <= 0 {
			e.finishLocked(j, CodeCancelled, detail, nil)
		}
	})
	j.graceTimer = t
}
