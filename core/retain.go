package core

import (
	"time"
	"unsafe"
)

// This file is the retention of ended jobs: what a node keeps of a job after
// its terminal event, for how long, and what it lets go first.
//
// An ended job stays readable (GET, its events, a resume) for a late
// reader: a client that lost its stream, a poller of a job submitted for
// later. That memory is bounded three ways, node-wide: by time (Retention),
// by count (RetainJobs) and by bytes (RetainBytes). Every ended job is kept
// in one FIFO in the order it ended; since Retention is the same for every
// job, the oldest ended job is also the first whose time runs out, so one
// queue and one timer serve all three bounds, with no timer per job and no
// scan: ending a job appends to the FIFO, eviction pops its front.
//
// A job evicted (by any bound) is forgotten entirely: its record, its
// history and its idempotency key. Every later call for it gets
// job_not_found, exactly like an id this node never had (see
// docs/streams.md, "Ended jobs").

// EvictReason says which bound made a node let go of an ended job; it is
// the reason label of switchyard_retention_evictions_total.
type EvictReason string

// Eviction reasons.
const (
	// EvictRetention: the job ended Retention ago.
	EvictRetention EvictReason = "retention"
	// EvictCount: more than RetainJobs ended jobs were kept.
	EvictCount EvictReason = "count"
	// EvictBytes: the ended jobs kept held more than RetainBytes.
	EvictBytes EvictReason = "bytes"
)

// retained is the FIFO of ended jobs, oldest end first. Guarded by
// Engine.mu.
type retained struct {
	// jobs[head:] are the jobs kept; the slots before head were popped
	// and are reused once they are the larger part of the slice.
	jobs  []*Job
	head  int
	bytes int64
	// timer fires when the oldest kept job's Retention runs out; nil when
	// none is armed.
	timer *time.Timer
}

func (r *retained) len() int { return len(r.jobs) - r.head }

func (r *retained) push(j *Job) {
	if r.head > 0 && r.head >= len(r.jobs)/2 {
		// Amortised O(1): each slot moves once per time the slice fills.
		n := copy(r.jobs, r.jobs[r.head:])
		clear(r.jobs[n:])
		r.jobs, r.head = r.jobs[:n], 0
	}
	r.jobs = append(r.jobs, j)
	r.bytes += j.retainedBytes
}

func (r *retained) front() *Job { return r.jobs[r.head] }

func (r *retained) pop() *Job {
	j := r.jobs[r.head]
	r.jobs[r.head] = nil
	r.head++
	r.bytes -= j.retainedBytes
	if r.head == len(r.jobs) {
		r.jobs, r.head = r.jobs[:0], 0
	}
	return j
}

// retainLocked keeps a job that just ended for late readers, and evicts the
// oldest ended jobs while the count or byte bound is passed. The job that
// just ended is never evicted here: whatever its size, it stays for the
// readers streaming it now (Validate keeps RetainBytes above one job's
// largest history, so this is at most one job over the bound).
func (e *Engine) retainLocked(j *Job) {
	j.trim()
	j.retainedBytes = j.footprint()
	e.retain.push(j)
	for e.retain.len() > 1 {
		reason := EvictCount
		if e.retain.len() <= e.cfg.RetainJobs {
			if e.retain.bytes <= e.cfg.RetainBytes {
				break
			}
			reason = EvictBytes
		}
		e.evictLocked(reason)
	}
	e.retainGaugesLocked()
	e.armRetentionLocked()
}

// evictLocked forgets the oldest ended job: its record, history and
// idempotency key.
func (e *Engine) evictLocked(reason EvictReason) {
	j := e.retain.pop()
	if e.jobs[j.ID] == j {
		delete(e.jobs, j.ID)
	}
	if j.idemKey != "" && e.idem[j.idemKey] == j.ID {
		delete(e.idem, j.idemKey)
	}
	e.m.Evictions.WithLabelValues(string(reason)).Inc()
}

// armRetentionLocked arms the one retention timer for the oldest kept job,
// unless one is armed already: that one fires no later (the front only
// ever gets younger), and firing early only re-arms.
func (e *Engine) armRetentionLocked() {
	if e.retain.timer != nil || e.retain.len() == 0 || e.closed {
		return
	}
	wait := e.cfg.Retention - time.Since(e.retain.front().ended)
	e.retain.timer = time.AfterFunc(max(wait, 0), e.expireRetained)
}

// expireRetained evicts every kept job that ended Retention ago or more.
func (e *Engine) expireRetained() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.retain.timer = nil
	if e.closed {
		return
	}
	for e.retain.len() > 0 && time.Since(e.retain.front().ended) >= e.cfg.Retention {
		e.evictLocked(EvictRetention)
	}
	e.retainGaugesLocked()
	e.armRetentionLocked()
}

func (e *Engine) retainGaugesLocked() {
	e.m.RetainedJobs.Set(float64(e.retain.len()))
	e.m.RetainedBytes.Set(float64(e.retain.bytes))
}

// Retained reports how many ended jobs the node keeps for late readers and
// the bytes they are accounted for (see RetainJobs, RetainBytes).
func (e *Engine) Retained() (jobs int, bytes int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.retain.len(), e.retain.bytes
}

// trim drops what only a running job uses, once it has ended: the envelope
// (its input above all: a late reader gets the job's events, never its
// input), the consumers that refused it, its timers. What stays is what
// view, the event streams and resume tokens read.
func (j *Job) trim() {
	j.Env = nil
	j.exclude = nil
	j.timer = nil
	j.graceTimer = nil
}

// jobOverhead is what an ended job costs beyond its strings and history:
// its record and its History (a fixed size each), and its entries in the
// engine's maps (the jobs index, and the idempotency index when it has a
// key), counted as one map slot of a string and a pointer each, plus the
// FIFO's pointer.
const jobOverhead = int64(unsafe.Sizeof(Job{})+unsafe.Sizeof(History{})) + 2*mapSlot + 8

// mapSlot approximates one entry of a Go map from a string to a pointer
// or a string: key, value and the table's per-slot control byte, rounded.
const mapSlot = 48

// footprint is what an ended job is accounted for against RetainBytes: an
// estimate of the heap it holds, close to the allocator's figure for
// typical jobs (BenchmarkEndedJobMemory prints both), never a promise of
// it. Call it after trim, under Engine.mu.
func (j *Job) footprint() int64 {
	strs := len(j.ID) + len(j.Queue) + len(j.detail) + len(j.idemKey)
	// A job's attempts (usually one) share their consumer, worker and
	// node strings with the engine's records; their reasons are their own.
	attempts := int64(cap(j.attempts)) * int64(unsafe.Sizeof(Attempt{}))
	for _, a := range j.attempts {
		strs += len(a.Reason)
	}
	return jobOverhead + int64(strs) + attempts + j.History.footprint()
}
