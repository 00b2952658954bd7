package core

import (
	"errors"
	"fmt"
	"sync/atomic"
)

// ErrSendQueueFull is why a WorkerConn could not queue an offer or a
// cancel: its Outbox is at a bound. The transport drops the session,
// exactly as a stall would drop it.
var ErrSendQueueFull = errors.New("worker send queue full")

// Outbox is a worker session's send queue, the one both transports use:
// the engine queues into it with its lock held and never blocks (Offer);
// the session's writer is its one reader. It is bounded by a count and by
// bytes (WorkerSendQueue gives both).
type Outbox[T any] struct {
	c     chan Queued[T]
	bytes atomic.Int64
	max   int64
	done  <-chan struct{}
}

// Queued is a message in an Outbox, with the size it counts against the
// byte bound until the writer takes it (Take).
type Queued[T any] struct {
	v    T
	size int64
}

// NewOutbox makes an outbox of count messages and maxBytes bytes at most.
// Once done is closed it takes nothing more.
func NewOutbox[T any](count int, maxBytes int64, done <-chan struct{}) *Outbox[T] {
	return &Outbox[T]{c: make(chan Queued[T], count), max: maxBytes, done: done}
}

// Offer queues v, of size bytes, without blocking, or fails with
// ErrSendQueueFull when either bound would be passed (or with another
// error once the session has ended).
func (o *Outbox[T]) Offer(v T, size int64) error {
	if n := o.bytes.Add(size); n > o.max {
		o.bytes.Add(-size)
		return fmt.Errorf("%w: %d bytes queued, %d more would pass the bound of %d", ErrSendQueueFull, n-size, size, o.max)
	}
	select {
	case o.c <- Queued[T]{v, size}:
		return nil
	case <-o.done:
		o.bytes.Add(-size)
		return errors.New("session ended")
	default:
		o.bytes.Add(-size)
		return fmt.Errorf("%w: %d messages queued", ErrSendQueueFull, cap(o.c))
	}
}

// Put queues v, waiting for room, and reports false if the session ended
// first. It is for the few messages that answer the worker itself (one at
// a time), never for the engine's.
func (o *Outbox[T]) Put(v T, size int64) bool {
	o.bytes.Add(size)
	select {
	case o.c <- Queued[T]{v, size}:
		return true
	case <-o.done:
		o.bytes.Add(-size)
		return false
	}
}

// C is what the writer receives from; it hands each message to Take.
func (o *Outbox[T]) C() <-chan Queued[T] { return o.c }

// Take releases q's bytes and returns its message.
func (o *Outbox[T]) Take(q Queued[T]) T {
	o.bytes.Add(-q.size)
	return q.v
}

// Len is the count of messages the outbox holds.
func (o *Outbox[T]) Len() int { return len(o.c) }

// Bytes is the byte count the outbox holds.
func (o *Outbox[T]) Bytes() int64 { return o.bytes.Load() }
