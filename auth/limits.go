package auth

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/switchyard/switchyard/core"
)

// admission is one key's limits and what they count: a token bucket for
// its rate and the number of its jobs not yet ended. It outlives reloads
// of the key file as long as the key stays in it (Store keeps it by the
// key's hash), so rotating another key or editing a limit does not reset
// what this key has used.
type admission struct {
	mu       sync.Mutex
	limits   Limits
	bucket   *rate.Limiter // nil: no rate limit
	inFlight int
}

func newAdmission(l Limits) *admission {
	a := &admission{}
	a.set(l)
	return a
}

// set applies (new) limits; the counts stay.
func (a *admission) set(l Limits) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.limits = l
	switch {
	case l.Rate <= 0:
		a.bucket = nil
	case a.bucket == nil:
		a.bucket = rate.NewLimiter(rate.Limit(l.Rate), l.Burst)
	default:
		a.bucket.SetLimit(rate.Limit(l.Rate))
		a.bucket.SetBurst(l.Burst)
	}
}

// Admit takes one job's worth of the identity's limits, or refuses it with
// rate_limited (and a Retry-After) when the key is over its rate or has
// max_in_flight jobs not yet ended. On success, release must be called
// exactly once: when the job ends, or at once if no job was created after
// all (a refusal further on, or an idempotency key that matched an
// existing job). A refusal takes nothing, so a client that retries after
// Retry-After is not punished for the refused attempt.
//
// The counts are this node's: behind a load balancer over n nodes a key
// may get up to n times its limits (docs: "Securing a node").
func (id *Identity) Admit(now time.Time) (release func(), err error) {
	a := id.admission
	if a == nil {
		return func() {}, nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.limits.MaxInFlight > 0 && a.inFlight >= a.limits.MaxInFlight {
		return nil, &core.Error{Code: core.CodeRateLimited, RetryAfter: time.Second,
			Detail: fmt.Sprintf("the key has %d jobs in flight on this node, its max_in_flight; retry once one has ended", a.inFlight)}
	}
	if a.bucket != nil {
		r := a.bucket.ReserveN(now, 1)
		if !r.OK() {
			// Burst 0 with a rate: Validate refuses it; never here.
			return nil, &core.Error{Code: core.CodeRateLimited, RetryAfter: time.Second, Detail: "the key may submit no job"}
		}
		if wait := r.DelayFrom(now); wait > 0 {
			r.CancelAt(now)
			return nil, &core.Error{Code: core.CodeRateLimited, RetryAfter: roundUp(wait),
				Detail: fmt.Sprintf("the key is over its rate of %g jobs a second (burst %d) on this node", a.limits.Rate, a.limits.Burst)}
		}
	}
	a.inFlight++
	var once sync.Once
	return func() {
		once.Do(func() {
			a.mu.Lock()
			a.inFlight--
			a.mu.Unlock()
		})
	}, nil
}

// Submit submits env to queue on e as this identity, the one way every
// front door submits: admitted first (Admit), the job owned by the
// identity's subject and scheduled under its share, the admission released
// when the job ends, or at once when no new job was made (a refusal, or an
// idempotency key that matched an existing job). opts' Owner, Share and
// OnEnd are the identity's; the rest is the caller's. The results are
// core.Engine.Submit's.
func (id *Identity) Submit(ctx context.Context, e *core.Engine, queue string, env *core.Envelope, opts core.SubmitOptions) (j *core.Job, existing bool, err error) {
	release, err := id.Admit(time.Now())
	if err != nil {
		return nil, false, err
	}
	opts.Owner, opts.Share, opts.OnEnd = id.Owner(), id.Share(), release
	j, existing, err = e.Submit(ctx, queue, env, opts)
	if err != nil || existing {
		release()
	}
	return j, existing, err
}

// roundUp is a wait as a whole number of seconds, at least one: what
// Retry-After can say.
func roundUp(d time.Duration) time.Duration {
	return time.Duration(math.Ceil(d.Seconds())) * time.Second
}
