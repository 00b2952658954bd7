package worker

import (
	"testing"
)

// TestSendQueueHoldsForReadyJobs: a put flushes at once while no job is
// ready to start; while one is, frames stay queued (up to holdLimit) and
// the start of the last ready job sends them, in the order they were put.
func TestSendQueueHoldsForReadyJobs(t *testing.T) {
	var sent []*frame
	q := newSendQueue(1024, func(f *frame) error { sent = append(sent, f); return nil }, func(error) {})
	put := func() (*frame, bool) {
		f := new(frame)
		hold, ok := q.put(f, nil, nil)
		if !ok {
			t.Fatal("put refused")
		}
		return f, hold
	}

	// Alone: every put is to be flushed.
	if _, hold := put(); hold {
		t.Fatal("a put with no job ready holds its frame")
	}
	if err := q.flush(flushLimit); err != nil || len(sent) != 1 {
		t.Fatalf("flush: %v, %d sent", err, len(sent))
	}

	// Two jobs ready: frames wait for the second to start.
	sent = nil
	q.readied()
	q.readied()
	var want []*frame
	for range 3 {
		f, hold := put()
		if !hold {
			t.Fatal("a put with jobs ready does not hold")
		}
		want = append(want, f)
	}
	q.started()
	if len(sent) != 0 {
		t.Fatalf("%d frames sent with a job still ready", len(sent))
	}
	q.started()
	if len(sent) != len(want) {
		t.Fatalf("the last ready job's start sent %d frames, want %d", len(sent), len(want))
	}
	for i := range want {
		if sent[i] != want[i] {
			t.Fatalf("frame %d sent out of order", i)
		}
	}

	// Held frames are bounded: the put that reaches holdLimit flushes.
	q.readied()
	for i := 1; i <= holdLimit; i++ {
		if _, hold := put(); hold != (i < holdLimit) {
			t.Fatalf("put %d of %d: hold = %v", i, holdLimit, hold)
		}
	}
	q.started()
}
