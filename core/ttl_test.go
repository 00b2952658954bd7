package core_test

import (
	"testing"
	"time"

	"github.com/switchyard/switchyard/core"
)

func TestBudgetRemaining(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	b := core.Budget{TTL: time.Second, At: at}
	tests := []struct {
		now  time.Time
		want time.Duration
	}{
		{at, time.Second},
		{at.Add(250 * time.Millisecond), 750 * time.Millisecond},
		{at.Add(time.Second), 0},
		{at.Add(1500 * time.Millisecond), -500 * time.Millisecond},
		// A clock read before the arrival (cannot happen on a monotonic
		// clock, but the arithmetic is still plain subtraction).
		{at.Add(-100 * time.Millisecond), 1100 * time.Millisecond},
	}
	for _, tt := range tests {
		if got := b.Remaining(tt.now); got != tt.want {
			t.Errorf("Remaining(at%+v) = %v, want %v", tt.now.Sub(at), got, tt.want)
		}
	}
}

func TestDispatchTimeout(t *testing.T) {
	const (
		floor   = 100 * time.Millisecond
		ceiling = 5 * time.Second
	)
	tests := []struct {
		name      string
		remaining time.Duration
		fraction  float64
		want      time.Duration
	}{
		{"fraction of remaining", 10 * time.Second, 0.25, 2500 * time.Millisecond},
		{"other fraction", 10 * time.Second, 0.1, time.Second},
		{"ceiling", time.Minute, 0.25, ceiling},
		{"floor", 600 * time.Millisecond, 0.1, floor},
		{"half of remaining beats the floor", 150 * time.Millisecond, 0.25, 75 * time.Millisecond},
		{"half of remaining beats the fraction", time.Second, 0.9, 500 * time.Millisecond},
		{"half of remaining beats the ceiling", 8 * time.Second, 0.9, 4 * time.Second},
		{"zero remaining", 0, 0.25, 0},
		{"negative remaining", -time.Second, 0.25, 0},
		{"tiny remaining gets the 1ms minimum", time.Millisecond, 0.25, time.Millisecond},
		{"1ns remaining gets the 1ms minimum", 1, 0.25, time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := core.DispatchTimeout(tt.remaining, floor, ceiling, tt.fraction); got != tt.want {
				t.Errorf("DispatchTimeout(%v, %.2f) = %v, want %v", tt.remaining, tt.fraction, got, tt.want)
			}
		})
	}
}

// TestDispatchTimeoutBounds sweeps remaining from 2ms to 2 minutes: the
// timeout is never more than half of what is left, never more than the
// ceiling, and at least the floor whenever half the budget allows it.
func TestDispatchTimeoutBounds(t *testing.T) {
	const (
		floor   = 50 * time.Millisecond
		ceiling = 2 * time.Second
	)
	for _, fraction := range []float64{0.01, 0.25, 0.5, 0.99} {
		for r := 2 * time.Millisecond; r <= 2*time.Minute; r = r*5/4 + time.Millisecond {
			d := core.DispatchTimeout(r, floor, ceiling, fraction)
			if d > r/2 {
				t.Fatalf("DispatchTimeout(%v, %v) = %v, more than half of remaining", r, fraction, d)
			}
			if d > ceiling {
				t.Fatalf("DispatchTimeout(%v, %v) = %v, above the ceiling", r, fraction, d)
			}
			if r/2 >= floor && d < floor {
				t.Fatalf("DispatchTimeout(%v, %v) = %v, below the floor", r, fraction, d)
			}
			if d <= 0 {
				t.Fatalf("DispatchTimeout(%v, %v) = %v, not positive", r, fraction, d)
			}
		}
	}
}
