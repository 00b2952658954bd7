package stream_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/resume"
	"github.com/switchyard/switchyard/core/stream"
	"github.com/switchyard/switchyard/internal/coretest"
)

// A stream's Signer signs every event, restart and later generations
// included, exactly as Positions.Token does, and its tokens resume after
// their event; it allocates nothing per event.
func TestSignerIsToken(t *testing.T) {
	ring, err := resume.NewKeyring("k1", resume.Key{ID: "k1", Secret: bytes.Repeat([]byte{7}, 32)})
	if err != nil {
		t.Fatal(err)
	}
	pos := stream.Positions{Keyring: ring, TTL: time.Hour, Snapshot: 3}
	caller, filter := stream.CallerFingerprint("Bearer x"), stream.FilterFingerprint(nil)
	j := newJob(100, 1<<20)
	coretest.Append(t, j, core.EventAccepted, `{}`)
	coretest.Append(t, j, core.EventOutput, `{"data":"a"}`)
	j.History.Append(core.EventRestart, 2, []byte(`{"reason":"worker_lost","last_seq":2}`))
	coretest.Append(t, j, core.EventOutput, `{"data":"b"}`)
	coretest.Append(t, j, core.EventDone, `{"outcome":"completed"}`)
	s, err := pos.Signer(j, caller, filter)
	if err != nil {
		t.Fatal(err)
	}
	rd, _, err := j.History.Since(0, 100)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, ev := range rd.Events {
		got, err := s.AppendSign([]byte("id: "), ev.Stream, ev.Seq, now)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := pos.Token(j, ev.Seq, caller, filter)
		if string(got) != "id: "+want {
			t.Errorf("event %d: %q, want %q", ev.Seq, got[4:], want)
		}
		if seq, err := pos.Verify(j, want, caller, filter); err != nil || seq != ev.Seq {
			t.Errorf("event %d: resumes after %d, %v", ev.Seq, seq, err)
		}
	}
	if raceDetector {
		return
	}
	buf := make([]byte, 0, resume.MaxTokenLen)
	ev := rd.Events[3]
	if n := testing.AllocsPerRun(100, func() { buf, _ = s.AppendSign(buf[:0], ev.Stream, ev.Seq, now) }); n != 0 {
		t.Errorf("%v allocations per signed event, want 0", n)
	}
}

// A door's stream signs its events with no allocation per event: what a
// 16-output job costs to write does not grow with a token per event.
func TestRunSignsWithoutAllocating(t *testing.T) {
	if raceDetector {
		t.Skip("-race allocates where a plain build does not")
	}
	ring, err := resume.NewKeyring("k1", resume.Key{ID: "k1", Secret: bytes.Repeat([]byte{7}, 32)})
	if err != nil {
		t.Fatal(err)
	}
	pos := stream.Positions{Keyring: ring, TTL: time.Hour, Snapshot: 1}
	caller, filter := stream.CallerFingerprint(""), stream.FilterFingerprint(nil)
	run := func(n int) float64 {
		j := newJob(n+2, 1<<20)
		coretest.Append(t, j, core.EventAccepted, `{}`)
		for range n {
			coretest.Append(t, j, core.EventOutput, `{"data":"0123456789abcdef0123456789abcdef"}`)
		}
		coretest.Append(t, j, core.EventDone, `{"outcome":"completed"}`)
		s, err := pos.Signer(j, caller, filter)
		if err != nil {
			t.Fatal(err)
		}
		tokens := func(dst []byte, ev core.Event, now time.Time) []byte {
			dst, _ = s.AppendSign(dst, ev.Stream, ev.Seq, now)
			return dst
		}
		sink := discardSink{}
		return testing.AllocsPerRun(20, func() {
			stream.Run(context.Background(), stream.Request{Job: j, Policy: stream.DefaultPolicy(), Token: tokens, Writers: &stream.Writers{}}, sink)
		})
	}
	// What Run allocates per stream (its writer, timer, token buffer) and
	// per read of the history is the same for 16 outputs as for 60, both
	// one read (readBatch): nothing per event.
	if a, b := run(16), run(60); b > a {
		t.Errorf("allocations per stream: %v with 16 outputs, %v with 60: some are per event", a, b)
	}
}

// discardSink takes every write and keeps nothing.
type discardSink struct{}

func (discardSink) Event(core.Event, []byte) error               { return nil }
func (discardSink) Control(stream.Control, map[string]any) error { return nil }
func (discardSink) Heartbeat() error                             { return nil }
func (discardSink) Flush() error                                 { return nil }
func (discardSink) SetWriteDeadline(time.Time) error             { return nil }
func (discardSink) Abort(time.Time)                              {}

// The node's streams are counted together, whatever their transport: the
// processors they share are the node's.
func TestWritersAreTheNodes(t *testing.T) {
	m := stream.NewMetrics(prometheus.NewRegistry())
	if m.For("sse").Writers() != m.For("grpc").Writers() {
		t.Error("each transport counts its own writers")
	}
}
