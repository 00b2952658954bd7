package peer

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Resending after a failure: which failures another attempt may cure, and
// the backoff between attempts, for Forward, a delivery stream's and the
// unicast queue's Posts, and a response leg whose reply stream failed; and
// the error a Forward ends with when its attempts do.

// transient reports whether a failed attempt may succeed if made again:
// the peer was unreachable or not ready, the attempt timed out, or its
// connection was closed under it (the pool drops connections to addresses
// that left the view). The caller checks its own context first.
func transient(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Aborted:
		return true
	}
	return false
}

// permanent reports whether a failed Post can never succeed as it is, so
// resending it would only stall the queue behind it: the peer refuses this
// node's credentials or its protocol version, does not know the call, or
// finds the batch malformed or too large.
func permanent(err error) bool {
	if errors.Is(err, ErrClosed) {
		return true
	}
	switch status.Code(err) {
	case codes.Unauthenticated, codes.FailedPrecondition, codes.PermissionDenied, codes.Unimplemented, codes.InvalidArgument, codes.ResourceExhausted:
		return true
	}
	return false
}

// sleep waits out the backoff before attempt+1: false when ctx ended, or
// the router closed, first.
func (r *router) sleep(ctx context.Context, attempt int) bool {
	t := time.NewTimer(r.backoff(attempt))
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-r.ctx.Done():
		return false
	}
}

// backoff is the wait before attempt+1, with jitter (see sleep).
func (r *router) backoff(attempt int) time.Duration {
	d := r.cfg.RetryMax
	if attempt < 30 {
		d = min(r.cfg.RetryMin<<attempt, r.cfg.RetryMax)
	}
	return d/2 + rand.N(d/2+1)
}

// fail is the forward's error for err.
func (c *forwardCall) fail(err error) error {
	return fmt.Errorf("peer: forward job %s to %s: %w", c.d.JobID, c.node, err)
}

// ended is the forward's error once its context ended (or the router
// closed) during an attempt that failed with err, or after it.
func (c *forwardCall) ended(err error) error {
	if c.last != nil {
		err = c.last
	}
	if c.r.ctx.Err() != nil {
		return c.fail(fmt.Errorf("%w (last attempt: %w)", ErrClosed, err))
	}
	return c.fail(fmt.Errorf("%w (last attempt: %w)", context.Cause(c.ctx), err))
}
