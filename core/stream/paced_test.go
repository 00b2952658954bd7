package stream_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/stream"
	"github.com/switchyard/switchyard/internal/coretest"
)

// positions records what a paced stream reports with Request.Sent.
type positions struct {
	mu   sync.Mutex
	seqs []uint64
}

func (p *positions) sent(seq uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seqs = append(p.seqs, seq)
}

func (p *positions) all() []uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.seqs)
}

// A paced stream (its job's owner) is never judged by how far behind it
// is: with a queue five times its bound, held up for a while but never
// for the stall timeout, it writes every event and ends with the job. It
// reports its position after the flushes that moved it, in order, up to
// the terminal event.
func TestPacedStreamIsNotJudgedByLag(t *testing.T) {
	j := acceptedJob(t, 1000)
	b := newBlocker(2)
	sink := &fakeSink{onEvent: b.onEvent}
	p := shortClocks()
	p.MaxLagEvents = 5
	p.Stall = 40 * time.Millisecond
	var pos positions
	wait := runAsync(t, context.Background(), stream.Request{Job: j, Policy: p, Token: seqTokens, Sent: pos.sent}, sink)
	t.Cleanup(b.Release)

	coretest.Append(t, j, core.EventOutput, `{"data":"first"}`)
	waitChan(t, "the sink to block", b.blocked)
	appendOutputs(t, j, 25) // five times the bound
	time.Sleep(p.Stall / 2)
	b.Release()
	coretest.Append(t, j, core.EventDone, `{"outcome":"completed"}`)

	res := wait()
	if res.End != stream.EndTerminal || res.LastSeq != 28 {
		t.Fatalf("Result = %+v, want terminal at 28 (%s)", res, sink.trace())
	}
	if got := seqsOf(sink.events()); len(got) != 28 {
		t.Fatalf("wrote %d events, want 28: %v", len(got), got)
	}
	if n := len(sink.controls()); n != 0 {
		t.Fatalf("controls written: %s", sink.trace())
	}
	got := pos.all()
	if len(got) == 0 || got[len(got)-1] != 28 {
		t.Fatalf("positions reported = %v, want the last at 28", got)
	}
	for i := 1; i < len(got); i++ {
		if got[i] <= got[i-1] {
			t.Fatalf("positions reported = %v: want each higher than the one before", got)
		}
	}
}

// A paced stream whose client stops reading is terminated once it made
// no progress for the stall timeout — a slow consumer, with the resume
// hint — however little is queued behind it.
func TestPacedStreamStalls(t *testing.T) {
	j := acceptedJob(t, 1000)
	sink := &fakeSink{}
	sink.onEvent = func(ev core.Event) error {
		if ev.Seq >= 3 {
			<-sink.abortedCh() // the client stopped reading: the write blocks until the abort
			return errors.New("write aborted")
		}
		return nil
	}
	p := shortClocks()
	p.Stall = 40 * time.Millisecond
	var pos positions
	start := time.Now()
	wait := runAsync(t, context.Background(), stream.Request{Job: j, Policy: p, Token: seqTokens, Sent: pos.sent}, sink)
	appendOutputs(t, j, 2) // seqs 2, 3: two events queued, far below any bound

	res := wait()
	took := time.Since(start)
	if res.End != stream.EndSlow || res.LastSeq != 2 {
		t.Fatalf("Result = %+v, want slow with LastSeq 2 (%s)", res, sink.trace())
	}
	if took < p.Stall {
		t.Errorf("terminated after %s, before the stall timeout %s", took, p.Stall)
	}
	wantTerminated(t, sink, "slow_consumer", 2)
	// 2 was written in the batch whose flush never came: it may not be
	// reported; 3 never got through.
	if got := pos.all(); len(got) > 0 && got[len(got)-1] > 2 {
		t.Errorf("positions reported = %v, want none past 2", got)
	}
}

// A paced stream with nothing to send is never stalled, however long the
// job is quiet: the stall clock runs only while something waits to be
// written.
func TestPacedStreamQuietJobIsNotStalled(t *testing.T) {
	j := acceptedJob(t, 1000)
	sink := &fakeSink{}
	p := shortClocks()
	p.Stall = 20 * time.Millisecond
	var pos positions
	wait := runAsync(t, context.Background(), stream.Request{Job: j, Policy: p, Token: seqTokens, Sent: pos.sent}, sink)
	time.Sleep(5 * p.Stall) // quiet, but within the idle timeout (200ms)
	coretest.Append(t, j, core.EventOutput, `{"data":"late"}`)
	coretest.Append(t, j, core.EventDone, `{"outcome":"completed"}`)
	if res := wait(); res.End != stream.EndTerminal {
		t.Fatalf("Result = %+v, want terminal (%s)", res, sink.trace())
	}
}
