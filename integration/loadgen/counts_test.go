package loadgen

import (
	"maps"
	"testing"
)

// Each job counts once as submitted and once by its answer; an accepted
// one also by its end, or as unknown.
func TestCounts(t *testing.T) {
	var c Counts
	for _, j := range []Job{
		{PostErr: "connection reset"},
		{Status: 429, Refusal: "queue_full"},
		{Status: 429, Refusal: "queue_full"},
		{Status: 503, Refusal: "no_capable_worker"},
		{Status: 200, Terminal: "done", Terminals: 1},
		{Status: 200, Terminal: "error", Code: "expired", Terminals: 1},
		{Status: 200, Terminal: "error", Code: "worker_lost", Terminals: 2},
		{Status: 200, Broken: "EOF"},
	} {
		c.Add(&j)
	}
	if c.Submitted != 8 || c.PostErrors != 1 || c.Accepted != 4 || c.Unknown != 1 {
		t.Errorf("submitted %d, POST errors %d, accepted %d, unknown %d; want 8, 1, 4, 1", c.Submitted, c.PostErrors, c.Accepted, c.Unknown)
	}
	if want := map[string]int{"queue_full": 2, "no_capable_worker": 1}; !maps.Equal(c.Refused, want) {
		t.Errorf("refused %v, want %v", c.Refused, want)
	}
	if want := map[string]int{"completed": 1, "expired": 1, "worker_lost": 1}; !maps.Equal(c.Ended, want) {
		t.Errorf("ended %v, want %v", c.Ended, want)
	}
}

func TestByCode(t *testing.T) {
	for _, tt := range []struct {
		m    map[string]int
		want string
	}{
		{nil, "0"},
		{map[string]int{"expired": 0}, "0"},
		{map[string]int{"worker_lost": 2, "expired": 1}, "3: expired 1, worker_lost 2"},
		{map[string]int{"queue_full": 1, "cancelled": 0}, "1: queue_full 1"},
	} {
		if got := ByCode(tt.m); got != tt.want {
			t.Errorf("ByCode(%v) = %q, want %q", tt.m, got, tt.want)
		}
	}
}
