package core

import (
	"errors"
	"slices"
	"sync"
	"unsafe"
)

// EventKind names an event on a job's stream. The names are the SSE event
// names, a surface clients script against: keep them stable.
type EventKind string

// Event kinds.
const (
	// EventAccepted is the first event: the node took the job.
	EventAccepted EventKind = "accepted"
	// EventOutput is one chunk of output, in the order the worker sent it.
	EventOutput EventKind = "output"
	// EventDone ends a job that completed.
	EventDone EventKind = "done"
	// EventError ends a job that did not complete; its data carries the code.
	EventError EventKind = "error"
	// EventRestart opens the job's next stream generation: its worker was
	// lost after it had produced output, and the job, which opted into
	// restarts, runs again from the start. What came before belongs to
	// the previous generation.
	EventRestart EventKind = "restart"
)

// Terminal reports whether k ends a stream.
func (k EventKind) Terminal() bool { return k == EventDone || k == EventError }

// Event is one entry in a job's history. Data is the JSON the transports
// send as is.
type Event struct {
	Seq  uint64
	Kind EventKind
	// Gen is the binding generation that produced the event (the
	// "attempt" of the stream envelope; 0 before a worker was bound).
	Gen uint64
	// Stream is the stream generation the event belongs to: 1 until the
	// job's first restart event, which opens generation 2, and so on.
	// Sequence numbers go on across generations: a seq names one event.
	Stream uint64
	Data   []byte
	// cum is the summed Data bytes of every event up to and including this
	// one, so the byte distance between two positions is one subtraction.
	cum int64
}

// ErrHistoryGone is returned for a position older than the retained history.
var ErrHistoryGone = errors.New("core: position is older than the retained history")

// History is a job's event log on its ingress node: the retained history
// that every stream of the job reads with its own cursor. A reader never
// blocks the writer and never holds memory of its own beyond its cursor: a
// slow reader shows up as distance between its cursor and the head, which
// the transport bounds (terminating or skipping), not as a growing queue.
//
// Retention is bounded by count and bytes; the oldest events go first, but
// the newest event is always kept.
type History struct {
	mu        sync.Mutex
	events    []Event
	next      uint64
	maxEvents int
	maxBytes  int64
	ended     bool
	// wake is closed by the next Append; nil until a reader asks for it
	// (wakeLocked), so that an Append no reader waits on allocates none.
	wake chan struct{}
	// gen is the stream generation of the next event; starts[i] is the
	// seq of the restart event that opened generation i+2.
	gen    uint64
	starts []uint64
	// lagFuncs are LagFunc's callbacks, each run by the Append that takes
	// the head past its bounds; lagIDs names them for their stop funcs.
	lagFuncs []lagFunc
	lagIDs   uint64
}

// lagFunc is one LagFunc: run f once the head's Seq passes seq or the
// data appended in all passes cum bytes.
type lagFunc struct {
	seq uint64
	cum int64
	id  uint64
	f   func()
}

// NewHistory returns an empty history retaining at most maxEvents events and
// maxBytes bytes of data.
func NewHistory(maxEvents int, maxBytes int64) *History {
	return &History{next: 1, gen: 1, maxEvents: max(maxEvents, 1), maxBytes: maxBytes}
}

// Append adds an event and wakes every reader. Appending after a terminal
// event is refused: a job has exactly one terminal outcome. The LagFunc
// callbacks it fires run in its goroutine, after the history's lock is
// released.
func (h *History) Append(kind EventKind, gen uint64, data []byte) (Event, bool) {
	ev, fired, ok := h.append(kind, gen, data)
	for _, f := range fired {
		f()
	}
	return ev, ok
}

func (h *History) append(kind EventKind, gen uint64, data []byte) (ev Event, fired []func(), ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended {
		return Event{}, nil, false
	}
	var cum int64
	if n := len(h.events); n > 0 {
		cum = h.events[n-1].cum
	}
	if kind == EventRestart {
		h.gen++
		h.starts = append(h.starts, h.next)
	}
	ev = Event{Seq: h.next, Kind: kind, Gen: gen, Stream: h.gen, Data: data, cum: cum + int64(len(data))}
	h.next++
	if n := len(h.events); n == cap(h.events) {
		// Fewer steps than append's doubling from one: 2, 8, 32, then
		// doubling. A job's events (its accepted event, a few outputs or
		// a few dozen, its end) take two or three arrays, not six, and
		// the end's compaction trims the spare.
		more := n
		switch {
		case n == 0:
			more = 2
		case n < 32:
			more = 3 * n
		}
		h.events = slices.Grow(h.events, more)
	}
	h.events = append(h.events, ev)
	h.ended = kind.Terminal()
	for len(h.events) > 1 && (len(h.events) > h.maxEvents || h.retainedBytes() > h.maxBytes) {
		h.events[0] = Event{}
		h.events = h.events[1:]
	}
	if h.ended {
		h.compactLocked()
	}
	if h.wake != nil {
		close(h.wake)
		h.wake = nil
	}
	h.lagFuncs = slices.DeleteFunc(h.lagFuncs, func(w lagFunc) bool {
		if ev.Seq > w.seq || ev.cum > w.cum {
			fired = append(fired, w.f)
			return true
		}
		return false
	})
	return ev, fired, true
}

// compactLocked packs a history that will not grow again (its terminal
// event is in) for the time it is retained for late readers: the events
// move to a slice of exactly their number (append leaves up to as much
// again spare), and their data to one buffer instead of one allocation
// each. Readers holding events from before keep theirs: data is never
// written in place.
func (h *History) compactLocked() {
	n := 0
	for _, ev := range h.events {
		n += len(ev.Data)
	}
	buf := make([]byte, 0, n)
	events := make([]Event, len(h.events))
	for i, ev := range h.events {
		start := len(buf)
		buf = append(buf, ev.Data...)
		ev.Data = buf[start:len(buf):len(buf)]
		events[i] = ev
	}
	h.events = events
}

// footprint is the memory the history's events hold: their slice and
// their data (see Job.footprint).
func (h *History) footprint() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := int64(cap(h.events))*int64(unsafe.Sizeof(Event{})) + int64(cap(h.starts))*8
	if len(h.events) > 0 {
		n += h.retainedBytes()
	}
	return n
}

func (h *History) retainedBytes() int64 {
	first := h.events[0]
	return h.events[len(h.events)-1].cum - first.cum + int64(len(first.Data))
}

// Read is what a reader gets from Since.
type Read struct {
	// Events after the cursor, oldest first, at most the number asked for.
	Events []Event
	// Ended is true when the terminal event is in the history.
	Ended bool
	// Lag is how many events, and how many data bytes, lie after the cursor.
	LagEvents int
	LagBytes  int64
	// Wake is closed by the next Append.
	Wake <-chan struct{}
}

// Since returns up to max events with Seq > after. It returns ErrHistoryGone
// (and the oldest retained Seq) when events after the cursor are no longer
// retained: the caller must tell its client to resync, never skip silently.
func (h *History) Since(after uint64, max int) (Read, uint64, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := Read{Ended: h.ended, Wake: h.wakeLocked()}
	if len(h.events) == 0 {
		return r, 0, nil
	}
	first := h.events[0].Seq
	if after+1 < first {
		return r, first, ErrHistoryGone
	}
	i := int(after + 1 - first)
	if i >= len(h.events) {
		return r, first, nil
	}
	last := h.events[len(h.events)-1]
	r.LagEvents = len(h.events) - i
	r.LagBytes = last.cum - h.events[i].cum + int64(len(h.events[i].Data))
	n := min(r.LagEvents, max)
	r.Events = append([]Event(nil), h.events[i:i+n]...)
	return r, first, nil
}

// Generation returns the stream generation of the newest event: 1 plus
// the restart events appended.
func (h *History) Generation() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.gen
}

// GenerationOf returns the stream generation the event seq belongs to (or
// would, for a seq not appended yet), whether or not it is still retained.
func (h *History) GenerationOf(seq uint64) uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	g := uint64(1)
	for _, s := range h.starts {
		if seq < s {
			break
		}
		g++
	}
	return g
}

// Head returns the Seq of the newest event (0 when empty).
func (h *History) Head() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.next - 1
}

// SkipTo returns the cursor a drop-oldest stream should jump to from after,
// so that what is left behind the head is within maxEvents and maxBytes; it
// returns after unchanged when that already holds. The newest event is
// never skipped.
func (h *History) SkipTo(after uint64, maxEvents int, maxBytes int64) uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.events) == 0 {
		return after
	}
	first := h.events[0].Seq
	if after+1 < first {
		after = first - 1
	}
	last := h.events[len(h.events)-1]
	for i := int(after + 1 - first); i < len(h.events)-1; i++ {
		lagEvents := len(h.events) - i
		lagBytes := last.cum - h.events[i].cum + int64(len(h.events[i].Data))
		if lagEvents <= maxEvents && lagBytes <= maxBytes {
			break
		}
		after = h.events[i].Seq
	}
	return after
}

// Lag returns how many events, and data bytes, lie after the cursor, and a
// channel closed by the next Append. A cursor older than the retained
// history counts everything retained.
func (h *History) Lag(after uint64) (events int, bytes int64, wake <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, _, events, bytes = h.lagLocked(after)
	return events, bytes, h.wakeLocked()
}

// wakeLocked is the channel the next Append closes, made now if no reader
// asked for one since the last Append.
func (h *History) wakeLocked() <-chan struct{} {
	if h.wake == nil {
		h.wake = make(chan struct{})
	}
	return h.wake
}

// lagLocked measures the lag after a cursor: base is the cursor as far as
// the retained events go (a cursor older than them counts everything
// retained), baseCum the data appended up to it, and events and bytes what
// lies after base.
func (h *History) lagLocked(after uint64) (base uint64, baseCum int64, events int, bytes int64) {
	if len(h.events) == 0 {
		return after, 0, 0, 0
	}
	first, last := h.events[0], h.events[len(h.events)-1]
	switch {
	case after < first.Seq:
		base, baseCum = first.Seq-1, first.cum-int64(len(first.Data))
	case after >= last.Seq:
		base, baseCum = last.Seq, last.cum
	default:
		base, baseCum = after, h.events[after-first.Seq].cum
	}
	return base, baseCum, int(last.Seq - base), last.cum - baseCum
}

// LagFunc is Lag for a reader that only needs to hear when the lag after
// its cursor passes maxEvents or maxBytes (a stream's slow-consumer
// watcher), without a goroutine of its own waiting for it: over reports
// that the lag already has, and then f is not kept; otherwise f runs once,
// in the goroutine of the Append that takes the head past those bounds as
// measured from after (with no lock of the history held), and not on
// every Append, so a stream that keeps up costs nothing per event. f must
// not block: it runs on the job's event path. The bounds are measured
// from the cursor given: a reader that moved on calls again when f runs.
// stop drops f if it has not run, and reports whether it dropped it.
func (h *History) LagFunc(after uint64, maxEvents int, maxBytes int64, f func()) (events int, bytes int64, over bool, stop func() bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	base, baseCum, events, bytes := h.lagLocked(after)
	if events > maxEvents || bytes > maxBytes {
		return events, bytes, true, nil
	}
	h.lagIDs++
	id := h.lagIDs
	h.lagFuncs = append(h.lagFuncs, lagFunc{seq: base + uint64(maxEvents), cum: baseCum + maxBytes, id: id, f: f})
	return events, bytes, false, func() bool { return h.stopLagFunc(id) }
}

func (h *History) stopLagFunc(id uint64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := len(h.lagFuncs)
	h.lagFuncs = slices.DeleteFunc(h.lagFuncs, func(w lagFunc) bool { return w.id == id })
	return len(h.lagFuncs) < n
}
