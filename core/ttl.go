package core

import "time"

// Budget is a relative TTL as received at one hop: the TTL the sender
// measured, and the local monotonic instant it arrived. Clocks are never
// compared across nodes; each hop subtracts only time it measured itself.
type Budget struct {
	TTL time.Duration
	At  time.Time
}

// Remaining is the TTL left at now, measured on this node's monotonic clock.
// It may be negative: a budget that ran out is failed where it is found,
// never forwarded.
func (b Budget) Remaining(now time.Time) time.Duration {
	return b.TTL - now.Sub(b.At)
}

// DispatchTimeout is how long a consumer gets to accept a job whose budget
// has remaining left: a fraction of it, so that accept cannot eat the time
// the work still needs, between floor and ceiling, and never more than half
// of what is left. The ceiling is the whole story only for very long TTLs.
func DispatchTimeout(remaining, floor, ceiling time.Duration, fraction float64) time.Duration {
	if remaining <= 0 {
		return 0
	}
	d := time.Duration(float64(remaining) * fraction)
	d = max(d, floor)
	d = min(d, ceiling, remaining/2)
	return max(d, time.Millisecond)
}
