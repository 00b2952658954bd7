package stall_test

import (
	"testing"
	"time"

	"github.com/switchyard/switchyard/integration/stall"
)

func TestMeasure(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	run := func(w string, from, to int) stall.Run {
		r := stall.Run{Worker: w, Start: at(from)}
		if to >= 0 {
			r.End = at(to)
		}
		return r
	}
	job := func(posted, ended int, runs ...stall.Run) stall.Job {
		j := stall.Job{Posted: at(posted), Runs: runs}
		if ended >= 0 {
			j.Ended = at(ended)
		}
		return j
	}
	// The fault is at 0; worker b is down from then on, c is live with 2
	// slots.
	workers := []stall.Worker{{Name: "b", Slots: 2, DownFrom: at(0)}, {Name: "c", Slots: 2}}
	tests := []struct {
		name                      string
		jobs                      []stall.Job
		runs                      []stall.Run
		first, longest, gap       time.Duration
		firstWorker               string
		longestWaiting, freeSlots int
		wait, overtaken           time.Duration
	}{
		{
			name:  "nothing posted",
			first: -1,
		},
		{
			// Posted at 100, c free, started at 400: a 300ms stall.
			name:  "a new job waits while c is idle",
			jobs:  []stall.Job{job(100, 2000, run("c", 400, 1900))},
			first: 400 * time.Millisecond, firstWorker: "c",
			longest: 300 * time.Millisecond, gap: 300 * time.Millisecond, longestWaiting: 1, freeSlots: 2,
			wait: 300 * time.Millisecond,
		},
		{
			// c's two slots are busy until 1000 with older jobs: waiting
			// then is queueing, not a stall; the job starts at 1050.
			name: "a new job queues behind busy slots",
			jobs: []stall.Job{
				job(-2000, 1000, run("c", -2000, 1000)),
				job(-1500, 1500, run("c", -1500, 1500)),
				job(200, 3000, run("c", 1050, 2900)),
			},
			runs:  []stall.Run{run("c", -2000, 1000), run("c", -1500, 1500)},
			first: 1050 * time.Millisecond, firstWorker: "c",
			longest: 50 * time.Millisecond, gap: 850 * time.Millisecond, longestWaiting: 1, freeSlots: 1,
			wait: 850 * time.Millisecond,
		},
		{
			// A start on c of anything breaks a stall; the job posted
			// before the fault is not waiting by this measure.
			name: "a start breaks the stall, an old job is left out",
			jobs: []stall.Job{
				job(-100, -1),
				job(100, -1, run("c", 900, -1)),
				job(200, -1, run("c", 2900, -1)),
			},
			first: 900 * time.Millisecond, firstWorker: "c",
			// 100..900 (800ms), then 900..2900 with one slot free (2s).
			longest: 2 * time.Second, gap: 2 * time.Second, longestWaiting: 1, freeSlots: 1,
			wait: 2700 * time.Millisecond,
		},
		{
			// A run started on b (down) neither counts as a start nor
			// ends the stall; the job stops waiting once it started.
			name:  "a start on a down worker",
			jobs:  []stall.Job{job(100, -1, run("b", 500, -1)), job(100, -1, run("c", 3000, -1))},
			first: 3 * time.Second, firstWorker: "c",
			longest: 2900 * time.Millisecond, gap: 2900 * time.Millisecond, longestWaiting: 2, freeSlots: 2,
			wait: 2900 * time.Millisecond,
		},
		{
			// Posted at 100, held elsewhere; the job posted at 300 starts
			// on c at 600, the held one only at 2600: overtaken for 2s.
			name:  "a job overtaken by a later one",
			jobs:  []stall.Job{job(100, -1, run("c", 2600, -1)), job(300, -1, run("c", 600, 1000))},
			first: 600 * time.Millisecond, firstWorker: "c",
			// From 600 the held job waits with a slot free: a stall too.
			longest: 2 * time.Second, gap: 2 * time.Second, longestWaiting: 1, freeSlots: 1,
			wait: 2500 * time.Millisecond, overtaken: 2 * time.Second,
		},
		{
			name:    "open at the end of the window",
			jobs:    []stall.Job{job(1000, -1)},
			first:   -1,
			longest: 4 * time.Second, gap: 4 * time.Second, longestWaiting: 1, freeSlots: 2,
			wait: 4 * time.Second,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runs := tt.runs
			for _, j := range tt.jobs {
				for _, r := range j.Runs {
					if r.Start.After(at(-1)) {
						runs = append(runs, r)
					}
				}
			}
			got := stall.Measure(at(0), at(5000), tt.jobs, runs, workers)
			if got.FirstStart != tt.first || got.FirstWorker != tt.firstWorker {
				t.Errorf("first start = %v on %q, want %v on %q", got.FirstStart, got.FirstWorker, tt.first, tt.firstWorker)
			}
			if got.Longest != tt.longest || got.LongestGap != tt.gap {
				t.Errorf("longest stall = %v, gap = %v; want %v, %v", got.Longest, got.LongestGap, tt.longest, tt.gap)
			}
			if got.LongestWait != tt.wait || got.Overtaken != tt.overtaken {
				t.Errorf("longest wait = %v, overtaken %v; want %v, %v", got.LongestWait, got.Overtaken, tt.wait, tt.overtaken)
			}
			if tt.longest > 0 && (got.LongestWaiting != tt.longestWaiting || got.LongestFree != tt.freeSlots) {
				t.Errorf("longest stall with %d waiting, %d free; want %d, %d", got.LongestWaiting, got.LongestFree, tt.longestWaiting, tt.freeSlots)
			}
		})
	}
}
