package core_test

import (
	"math/rand/v2"
	"testing"

	"github.com/switchyard/switchyard/core"
)

var allStates = []core.State{
	core.StateQueued, core.StateOffered, core.StateRunning,
	core.StateCompleted, core.StateFailed, core.StateCancelled, core.StateExpired,
}

// diagram is the state machine drawn in job.go, written out edge by edge
// independently of CanMove.
var diagram = map[core.State][]core.State{
	core.StateQueued:  {core.StateOffered, core.StateFailed, core.StateCancelled, core.StateExpired},
	core.StateOffered: {core.StateRunning, core.StateQueued, core.StateCompleted, core.StateFailed, core.StateCancelled, core.StateExpired},
	core.StateRunning: {core.StateQueued, core.StateCompleted, core.StateFailed, core.StateCancelled, core.StateExpired},
}

func allowed(from, to core.State) bool {
	for _, s := range diagram[from] {
		if s == to {
			return true
		}
	}
	return false
}

func TestStateTerminal(t *testing.T) {
	want := map[core.State]bool{
		core.StateQueued: false, core.StateOffered: false, core.StateRunning: false,
		core.StateCompleted: true, core.StateFailed: true, core.StateCancelled: true, core.StateExpired: true,
		core.State("bogus"): false,
	}
	for s, w := range want {
		if got := s.Terminal(); got != w {
			t.Errorf("%s.Terminal() = %v, want %v", s, got, w)
		}
	}
}

func TestStateCanMoveTable(t *testing.T) {
	for _, from := range allStates {
		for _, to := range allStates {
			if got, want := from.CanMove(to), allowed(from, to); got != want {
				t.Errorf("%s.CanMove(%s) = %v, want %v", from, to, got, want)
			}
		}
		if from.CanMove(core.State("bogus")) {
			t.Errorf("%s.CanMove(bogus) = true", from)
		}
	}
	// A few edges spelled out, so a reader sees the rules that matter.
	spot := []struct {
		from, to core.State
		ok       bool
	}{
		{core.StateQueued, core.StateRunning, false},   // must be offered first
		{core.StateQueued, core.StateCompleted, false}, // nothing ran
		{core.StateRunning, core.StateOffered, false},  // back through the queue only
		{core.StateCompleted, core.StateFailed, false}, // one terminal outcome
		{core.StateCancelled, core.StateQueued, false}, // never redelivered
		{core.StateExpired, core.StateOffered, false},
		{core.StateRunning, core.StateQueued, true}, // reclaim with no output
		{core.StateOffered, core.StateQueued, true}, // reject
	}
	for _, s := range spot {
		if got := s.from.CanMove(s.to); got != s.ok {
			t.Errorf("%s.CanMove(%s) = %v, want %v", s.from, s.to, got, s.ok)
		}
	}
}

// TestStateMachineRandomWalks drives random walks through CanMove: once a
// walk reaches a terminal state nothing moves it again, so each walk has at
// most one terminal state, and every move it makes is an edge of the diagram.
func TestStateMachineRandomWalks(t *testing.T) {
	rng := rand.New(rand.NewPCG(20260921, 1))
	reachedTerminal := map[core.State]int{}
	for walk := range 5000 {
		s := core.StateQueued
		terminals := 0
		var path []core.State
		for range 50 {
			to := allStates[rng.IntN(len(allStates))]
			if !s.CanMove(to) {
				continue
			}
			if !allowed(s, to) {
				t.Fatalf("walk %d: CanMove allowed %s → %s, not in the diagram (path %v)", walk, s, to, path)
			}
			if s.Terminal() {
				t.Fatalf("walk %d: left terminal state %s for %s (path %v)", walk, s, to, path)
			}
			s = to
			path = append(path, s)
			if s.Terminal() {
				terminals++
				reachedTerminal[s]++
			}
		}
		if terminals > 1 {
			t.Fatalf("walk %d reached %d terminal states: %v", walk, terminals, path)
		}
		if s.Terminal() {
			for _, to := range allStates {
				if s.CanMove(to) {
					t.Fatalf("walk %d: terminal %s can move to %s", walk, s, to)
				}
			}
		}
	}
	// The walks are long enough that every outcome is reachable; if one is
	// not, the machine (or this test) lost an edge.
	for _, s := range allStates {
		if s.Terminal() && reachedTerminal[s] == 0 {
			t.Errorf("no walk reached %s", s)
		}
	}
}
