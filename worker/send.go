package worker

import (
	"sync"
	"sync/atomic"

	"github.com/switchyard/switchyard/internal/chans"
)

// flushLimit is the most frames a job's goroutine, or the receive loop,
// sends for others in one go before it leaves the rest to the writer: a
// handler pays for its own output, not for long for everybody's.
const flushLimit = 32

// maxBatchFrames and maxBatchBytes bound a batch (batch.go): the frames a
// flusher sends in one message, and their bytes. A frame larger than
// maxBatchBytes goes alone. maxBatchBytes is far below any node's maximum
// message size (at least 64 KiB above its largest input). A batch of n
// frames is 2n non-empty buffers (a header and a frame each), and gRPC's
// writer lists them with its own header for each write in a list it
// keeps only while its capacity is at most 64 entries; appended one by
// one, a list grows 16, 37, 74: past 37 entries (18 frames) every write
// would allocate a list of its own.
const (
	maxBatchFrames = 18
	maxBatchBytes  = 32 << 10
)

// holdLimit is the most frames a put leaves queued for a job about to
// start (sendQueue.ready), and at most half the queue: past it, the put
// flushes.
const holdLimit = 64

// sendQueue is a session's way out, a bounded FIFO of frames. Whoever puts
// a frame then flushes: it sends what is queued, its own frame and those
// put meanwhile, unless another goroutine is sending, which then sends
// them (flat combining). A job's output goes out from the job's goroutine,
// with no hand-off to another goroutine and no wake-up per frame, and in
// the order it was put: a job's frames (its Accept, its outputs, its end)
// are put one after the other, so they go out in that order.
//
// Every frame put is sent: a flusher that finds the queue not empty after
// releasing the send lock takes it again, or, past its flushLimit, kicks
// the writer goroutine, which flushes without a limit.
//
// Jobs that are ready together go out together: while a job handed to a
// job goroutine has not started yet (ready), a put leaves its frame queued
// (up to holdLimit frames), and the goroutine that starts the last such
// job flushes before it runs it. gRPC's writer writes to the connection
// whenever it runs out of messages; frames of several jobs sent back to
// back share its writes, where sent job by job each job's end is a write.
// A job running alone never waits: with none ready, every put flushes.
// A ready job waits only for a P, as gRPC's writer would for the frames
// sent meanwhile.
//
// To a node that takes batches, a flusher sends the frames it finds
// queued together as one Batch message (up to maxBatchFrames and
// maxBatchBytes), in their order: a message each costs both ends far
// more than the bytes of a small output. Only what is queued when the
// flusher looks goes together: a frame never waits for company, so a
// lone frame goes alone, at once.
type sendQueue struct {
	// send sends one frame on the stream; sendBatch several as one Batch
	// (nil: the node takes no batches); fail ends the session after a
	// send failed.
	send      func(*frame) error
	sendBatch func(*batch) error
	fail      func(error)

	sendMu sync.Mutex // held by the one goroutine sending
	// taken holds the frames taken for one send (under sendMu).
	taken []*frame

	mu   sync.Mutex
	q    []*frame // q[head:] is queued
	head int
	max  int
	// room wakes the puts that wait on a full queue once a frame leaves
	// it.
	room wakeup

	kick chan struct{} // buffered 1: the writer has frames to send
	// sent is set by each flush that sent something; the writer's
	// heartbeat goes out only after an interval in which none did.
	sent atomic.Bool
	// ready counts the jobs handed to a job goroutine that has not
	// started them (session.start).
	ready atomic.Int32
}

func newSendQueue(max int, send func(*frame) error, sendBatch func(*batch) error, fail func(error)) *sendQueue {
	return &sendQueue{send: send, sendBatch: sendBatch, fail: fail, max: max, kick: make(chan struct{}, 1)}
}

// put queues f. While the queue is full it waits for room, or until stop
// or stop2 (nil: never) is closed, and then reports false. hold is true
// when the caller need not flush: a job is ready to start, whose
// goroutine flushes (started), and the queue is below holdLimit.
func (q *sendQueue) put(f *frame, stop, stop2 <-chan struct{}) (hold, ok bool) {
	q.mu.Lock()
	for len(q.q)-q.head >= q.max {
		room := q.room.next()
		q.mu.Unlock()
		// A full queue has a flusher, or the writer was kicked.
		select {
		case <-room:
		case <-stop:
			return false, false
		case <-stop2:
			return false, false
		}
		q.mu.Lock()
	}
	if len(q.q) == cap(q.q) && q.head > 0 {
		n := copy(q.q, q.q[q.head:])
		clear(q.q[n:])
		q.q, q.head = q.q[:n], 0
	}
	q.q = append(q.q, f)
	n := len(q.q) - q.head
	q.mu.Unlock()
	// Read after f is queued: a job that starts after this read flushes
	// f (started).
	return n < min(holdLimit, q.max/2) && q.ready.Load() > 0, true
}

// readied counts a job handed to a job goroutine; that goroutine calls
// started before it runs the job.
func (q *sendQueue) readied() { q.ready.Add(1) }

// started is called by a job goroutine before it runs a job readied for
// it. The last of the ready jobs to start flushes what was held for them.
func (q *sendQueue) started() {
	if q.ready.Add(-1) == 0 {
		// What was held, at most holdLimit frames, and what the jobs
		// still running put meanwhile.
		_ = q.flush(2 * holdLimit)
	}
}

// take appends to dst the oldest frames queued, at most n and, past the
// first, at most maxBytes of them in all; none when the queue is empty.
func (q *sendQueue) take(dst []*frame, n, maxBytes int) []*frame {
	q.mu.Lock()
	defer q.mu.Unlock()
	size := 0
	for q.head < len(q.q) && n > 0 {
		f := q.q[q.head]
		size += f.buf[0].Len()
		if size > maxBytes && len(dst) > 0 {
			break
		}
		dst = append(dst, f)
		q.q[q.head] = nil
		q.head++
		n--
	}
	if q.head == len(q.q) {
		q.q, q.head = q.q[:0], 0
	}
	if len(dst) > 0 {
		q.room.wake()
	}
	return dst
}

// sendFrames sends fs, in order: as one batch when there are several and
// the node takes batches, else one by one. The caller holds sendMu.
func (q *sendQueue) sendFrames(fs []*frame) error {
	if len(fs) > 1 && q.sendBatch != nil {
		return q.sendBatch(newBatch(fs))
	}
	for _, f := range fs {
		if err := q.send(f); err != nil {
			return err
		}
	}
	return nil
}

func (q *sendQueue) empty() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.head == len(q.q)
}

// flush sends what is queued unless another goroutine is sending. It
// sends at most limit frames (0: no limit) and kicks the writer for the
// rest. It returns the error of a failed send, which ended the session.
func (q *sendQueue) flush(limit int) error {
	budget := limit
	for q.sendMu.TryLock() {
		sent := false
		for limit == 0 || budget > 0 {
			n := maxBatchFrames
			if limit != 0 {
				n = min(n, budget)
			}
			fs := q.take(q.taken[:0], n, maxBatchBytes)
			if len(fs) == 0 {
				break
			}
			err := q.sendFrames(fs)
			clear(fs) // gRPC holds what it still needs
			q.taken = fs[:0]
			if err != nil {
				q.sendMu.Unlock()
				q.fail(err)
				return err
			}
			sent = true
			budget -= len(fs)
		}
		q.sendMu.Unlock()
		if sent {
			q.sent.Store(true)
		}
		if q.empty() {
			return nil
		}
		// Frames were put while the lock was held, by goroutines that
		// could not take it.
		if limit != 0 && budget <= 0 {
			chans.Notify(q.kick)
			return nil
		}
	}
	return nil
}
