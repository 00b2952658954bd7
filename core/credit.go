package core

import (
	"fmt"
	"log/slog"
	"time"
)

// This file is output credit: how a job's reader paces its worker. A
// worker may run ahead of what the job's reader has taken by at most a
// window (Config.OutputWindowEvents and OutputWindowBytes) and then waits:
// a fast worker slows down, and no output is buffered without bound,
// dropped, or held up behind another job's.
//
// The ingress keeps the account (pace, on the Job): what the binding's
// worker sent and what the reader took, and grants more credit when half
// the window is free again. Credits are cumulative — the outputs, and
// their data bytes, the binding may have sent in all — so a late or
// repeated grant never adds to a newer one. Who the reader is decides
// what "taken" means:
//   - a streamed job (an SSE POST, a gRPC Submit) is paced by its owner
//     streams: an output is taken once an owner stream wrote it to its
//     client (StreamSent). A reader that keeps reading at any rate gets
//     every output; one that stops is judged by its stream's stall clock.
//   - a job submitted for later (202) has no reader while it runs: an
//     output is taken once the ingress has it in the job's history, whose
//     bounds hold it for late readers (one that comes too late gets
//     resync). Its credit is flow control between nodes and nothing more.
//
// The consumer host keeps the binding's side (hostCredit, on its binding):
// the credit its worker was given and what it sent. A worker that sends
// past its credit breaks the protocol: the output is not relayed and the
// job fails credit_exceeded. A transport whose worker cannot see its
// credit (HTTP) waits for it instead (Worker.OutputOrWait).

// OutputCredit is an amount of output: a number of outputs and the sum of
// their data lengths, as the worker sent them (before the node compacts
// them). The zero value means none: a window of zero is a job that is not
// paced.
type OutputCredit struct {
	Events int64
	Bytes  int64
}

// IsZero reports whether c is the zero credit.
func (c OutputCredit) IsZero() bool { return c.Events == 0 && c.Bytes == 0 }

// covers reports whether a binding that sent used may send one more
// output under credit c: one output may end past the bytes, so an output
// larger than the window still goes, alone.
func (c OutputCredit) covers(used OutputCredit) bool {
	return c.IsZero() || used.Events < c.Events && used.Bytes < c.Bytes
}

func (c OutputCredit) add(events, bytes int64) OutputCredit {
	return OutputCredit{c.Events + events, c.Bytes + bytes}
}

func maxCredit(a, b OutputCredit) OutputCredit {
	return OutputCredit{max(a.Events, b.Events), max(a.Bytes, b.Bytes)}
}

// pace is a job's output credit as its ingress keeps it, for the current
// binding (it starts again when the job goes back to its queue, which it
// does only before any output), dropped when the job ends. Guarded by
// Engine.mu.
type pace struct {
	// window is how far the worker may run ahead of the reader; zero: not
	// paced.
	window OutputCredit
	// recv is what the binding's worker sent that reached the ingress;
	// taken is the part of it the reader took; granted is the newest
	// credit, sent to the host.
	recv, taken, granted OutputCredit
	// sent is the newest position an owner stream wrote, and unread[head:]
	// the outputs after it, oldest first: what a streamed job's reader has
	// not taken yet. Never more than the window (and the output past it).
	// unread is a queue on an array taken from the front, whose taken
	// part is reclaimed rather than walked off and grown again: it starts
	// on first, so a job whose reader keeps within a few outputs of its
	// worker (most) allocates no array of its own.
	sent   uint64
	unread []unreadOutput
	head   int
	first  [unreadInline]unreadOutput
}

// unreadInline is how many unread outputs a pace holds without an array
// of its own.
const unreadInline = 8

type unreadOutput struct {
	seq   uint64
	bytes int64
}

// newPace is the account of a new binding paced by window, for a job
// whose owner streams have written up to sent.
func newPace(window OutputCredit, sent uint64) *pace {
	p := &pace{window: window, granted: window, sent: sent}
	p.unread = p.first[:0]
	return p
}

// waiting reports whether the binding's worker has used all its credit:
// what reached the ingress alone proves it, whatever is on its way. An
// ended job (its account dropped) waits for nothing.
func (p *pace) waiting() bool {
	return p != nil && !p.window.IsZero() && !p.granted.covers(p.recv)
}

// outputWindow is the window this node paces its jobs with.
func (e *Engine) outputWindow() OutputCredit {
	return OutputCredit{Events: int64(e.cfg.OutputWindowEvents), Bytes: e.cfg.OutputWindowBytes}
}

// outputTakenLocked accounts for an output of bytes (as the worker sent
// it) that the ingress appended at seq: a job submitted for later takes
// it now, a streamed job once an owner stream wrote it.
func (e *Engine) outputTakenLocked(j *Job, seq uint64, bytes int64) {
	p := j.pace
	p.recv = p.recv.add(1, bytes)
	if j.streamed && seq > p.sent {
		p.pushUnread(seq, bytes)
		e.m.UnreadEvents.Inc()
		e.m.UnreadBytes.Add(float64(bytes))
	} else {
		p.taken = p.taken.add(1, bytes)
	}
	e.grantLocked(j)
}

// pushUnread queues an output of bytes at seq as not taken yet.
func (p *pace) pushUnread(seq uint64, bytes int64) {
	if len(p.unread) == cap(p.unread) && p.head > 0 && p.head >= len(p.unread)/2 {
		// Full, at least half of it taken: what is left moves to the
		// front, no more than was taken since the last move, so a
		// constant amount of copying per output.
		p.unread = p.unread[:copy(p.unread, p.unread[p.head:])]
		p.head = 0
	}
	p.unread = append(p.unread, unreadOutput{seq, bytes})
}

// takeUnread takes the unread outputs up to seq: how many, and their
// bytes, added to what the reader took.
func (p *pace) takeUnread(seq uint64) (n int, bytes int64) {
	for ; p.head < len(p.unread) && p.unread[p.head].seq <= seq; p.head++ {
		p.taken = p.taken.add(1, p.unread[p.head].bytes)
		bytes += p.unread[p.head].bytes
		n++
	}
	if p.head == len(p.unread) {
		// All taken (what a reader that keeps up does): the array is
		// reused from its start.
		p.unread, p.head = p.unread[:0], 0
	}
	return n, bytes
}

// StreamSent records that an owner stream of the job wrote everything up
// to seq to its client: the outputs up to it are taken, and the job's
// worker may get more credit. The transports call it after each flush of
// an owner stream (stream.Request.Sent); a position older than one
// already reported changes nothing.
func (e *Engine) StreamSent(id string, seq uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	j := e.jobs[id]
	if j == nil || j.state.Terminal() || seq <= j.pace.sent {
		return
	}
	p := j.pace
	p.sent = seq
	n, bytes := p.takeUnread(seq)
	if n > 0 {
		e.m.UnreadEvents.Sub(float64(n))
		e.m.UnreadBytes.Sub(float64(bytes))
	}
	e.grantLocked(j)
}

// paceEndedLocked drops an ended job's account: what its reader did not
// take is no longer waited for (a late reader reads the history).
func (e *Engine) paceEndedLocked(j *Job) {
	if j.pace == nil {
		return
	}
	var bytes int64
	unread := j.pace.unread[j.pace.head:]
	for _, u := range unread {
		bytes += u.bytes
	}
	e.m.UnreadEvents.Sub(float64(len(unread)))
	e.m.UnreadBytes.Sub(float64(bytes))
	j.pace = nil
}

// Pacer is the stream.Request.Sent of a stream of job id: StreamSent for
// an owner stream (owner is what StreamOpened returned for it), nil for a
// stream that only watches and so paces nothing.
func (e *Engine) Pacer(id string, owner bool) func(seq uint64) {
	if !owner {
		return nil
	}
	return func(seq uint64) { e.StreamSent(id, seq) }
}

// grantLocked sends the job's binding more credit once half its window
// is free again: batched, so a fast stream costs one grant per half
// window, never one per output.
func (e *Engine) grantLocked(j *Job) {
	p := j.pace
	if j.state.Terminal() || p.window.IsZero() {
		return
	}
	want := p.taken.add(p.window.Events, p.window.Bytes)
	if want.Events-p.granted.Events < (p.window.Events+1)/2 && want.Bytes-p.granted.Bytes < (p.window.Bytes+1)/2 {
		return
	}
	p.granted = maxCredit(p.granted, want)
	if w := e.hosted[j.ID]; w != nil {
		if b := w.bindings[j.ID]; b != nil && b.t.d.Gen == j.gen {
			e.creditLocked(w, b, p.granted)
			return
		}
	}
	if j.host != "" && j.host != e.cfg.Node {
		e.sendLocked(j.host, Message{Kind: MsgGrant, JobID: j.ID, Gen: j.gen, Queue: j.Queue, Credit: p.granted})
	}
}

// hostCredit is a binding's output credit on its consumer host: the
// credit its worker was given and what it sent. Guarded by Engine.mu.
type hostCredit struct {
	// granted is zero for a job that is not paced.
	granted, used OutputCredit
	// waitingSince is when the worker used all its credit (zero while it
	// has some): the time it waits for its reader, counted in
	// switchyard_worker_credit_wait_seconds_total.
	waitingSince time.Time
	// wake is handed to OutputOrWait's callers and closed by the next
	// grant, or when the binding ends.
	wake chan struct{}
}

// useCreditLocked counts an output of bytes against b's credit.
func (e *Engine) useCreditLocked(b *binding, bytes int64) {
	c := &b.credit
	c.used = c.used.add(1, bytes)
	if !c.granted.covers(c.used) && c.waitingSince.IsZero() {
		c.waitingSince = time.Now()
		e.m.CreditWaiting.Inc()
	}
}

// creditLocked gives w's binding b the credit c (a grant from the job's
// ingress) and passes it to the worker. An older grant changes nothing.
func (e *Engine) creditLocked(w *Worker, b *binding, c OutputCredit) {
	bc := &b.credit
	if bc.granted.IsZero() || b.cancelling || c.Events <= bc.granted.Events && c.Bytes <= bc.granted.Bytes {
		return
	}
	bc.granted = maxCredit(bc.granted, c)
	if bc.granted.covers(bc.used) {
		e.stopWaitingLocked(bc)
	}
	if err := w.conn.SendCredit(b.t.d.JobID, b.t.d.Gen, bc.granted); err != nil {
		e.dropLocked(w, fmt.Errorf("send output credit: %w", err))
	}
}

// stopWaitingLocked ends the wait of a binding that has credit again or
// ended: the time counts, and whoever waits on it is woken.
func (e *Engine) stopWaitingLocked(c *hostCredit) {
	if !c.waitingSince.IsZero() {
		e.m.CreditWait.Add(time.Since(c.waitingSince).Seconds())
		e.m.CreditWaiting.Dec()
		c.waitingSince = time.Time{}
	}
	if c.wake != nil {
		close(c.wake)
		c.wake = nil
	}
}

// hostGrantLocked applies a grant from the job's ingress to the binding
// it names, if this node hosts it.
func (e *Engine) hostGrantLocked(m Message) {
	w := e.hosted[m.JobID]
	if w == nil {
		return
	}
	if b := w.bindings[m.JobID]; b != nil && b.t.d.Gen == m.Gen {
		e.creditLocked(w, b, m.Credit)
	}
}

// creditExceededLocked ends a binding whose worker sent output past its
// credit: the output is not relayed (the node would have to hold it for a
// reader that did not ask for it), the worker is told to stop, and the
// job fails credit_exceeded. The worker's other jobs go on.
func (e *Engine) creditExceededLocked(w *Worker, b *binding) {
	d := b.t.d
	e.logJob(d.Trace, slog.LevelWarn, "worker sent output past its credit; failing the job", "consumer", w.ID, "name", w.Name, "job", d.JobID,
		"sent", b.credit.used.Events, "credit_events", b.credit.granted.Events, "credit_bytes", b.credit.granted.Bytes)
	e.cancelOnWorkerLocked(w, d.JobID, d.Gen, CodeCreditExceeded)
	e.failAtIngressLocked(d, CodeCreditExceeded, fmt.Sprintf(
		"the worker sent output past the job's output credit (%d outputs, %d bytes): it must wait for more credit", b.credit.granted.Events, b.credit.granted.Bytes))
}
