package runs_test

import (
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/integration/runs"
)

func TestViolations(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	run := func(w string, gen uint64, from, to int) runs.Run {
		r := runs.Run{Worker: w, Gen: gen, Start: at(from)}
		if to >= 0 {
			r.End = at(to)
		}
		return r
	}
	tests := []struct {
		name     string
		attempts []uint64
		rs       []runs.Run
		killed   map[string]time.Time
		want     []string // one substring per violation, in order
	}{
		{name: "one run", attempts: []uint64{1}, rs: []runs.Run{run("w1", 1, 0, 10)}},
		{name: "no run", attempts: nil},
		{name: "a second generation after the first ended unseen",
			rs: []runs.Run{run("w1", 1, 0, 10), run("w2", 2, 20, 30)}},
		{name: "a generation started twice",
			rs:   []runs.Run{run("w1", 1, 0, 10), run("w2", 1, 20, 30)},
			want: []string{"generation 1 started twice"}},
		{name: "ran again after its output reached the requester", attempts: []uint64{1},
			rs:   []runs.Run{run("w1", 1, 0, 10), run("w2", 2, 20, 30)},
			want: []string{"ran again (w2@gen2"}},
		{name: "two runs at once",
			rs:   []runs.Run{run("w1", 1, 0, 30), run("w2", 2, 20, 40)},
			want: []string{"run w2@gen2[00:00:00.020-00:00:00.040] started while run w1@gen1"}},
		{name: "a run after one with no end",
			rs:   []runs.Run{run("w1", 1, 0, -1), run("w2", 2, 20, 40)},
			want: []string{"started while run w1@gen1[00:00:00.000-no end]"}},
		{name: "a run after one whose worker was killed",
			rs:     []runs.Run{run("w1", 1, 0, -1), run("w2", 2, 20, 40)},
			killed: map[string]time.Time{"w1": at(15)}},
		{name: "a run before the kill of the worker of one with no end",
			rs:     []runs.Run{run("w1", 1, 0, -1), run("w2", 2, 20, 40)},
			killed: map[string]time.Time{"w1": at(25)},
			want:   []string{"started while run w1@gen1"}},
		{name: "a kill of another worker ends nothing",
			rs:     []runs.Run{run("w1", 1, 0, -1), run("w2", 2, 20, 40)},
			killed: map[string]time.Time{"w2": at(15)},
			want:   []string{"started while run w1@gen1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := runs.Violations(tt.attempts, tt.rs, tt.killed)
			if len(got) != len(tt.want) {
				t.Fatalf("got %d violations %q, want %d like %q", len(got), got, len(tt.want), tt.want)
			}
			for i, w := range tt.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("violation %d = %q, want it to contain %q", i, got[i], w)
				}
			}
		})
	}
}
