package stream_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/stream"
	"github.com/switchyard/switchyard/internal/syncbuf"
	"github.com/switchyard/switchyard/internal/ticktest"
)

// call is one thing Run did to a sink, in order.
type call struct {
	Op    string // "event", "control", "heartbeat", "flush"
	At    time.Time
	Event core.Event
	Token string
	Ctl   stream.Control
	// Data is the control's data after a JSON round trip, as a client would
	// see it (numbers are float64).
	Data map[string]any
}

// deadlineCall is one SetWriteDeadline: when Run called it and the deadline.
type deadlineCall struct {
	At, Deadline time.Time
}

// fakeSink records what Run writes, in order. Hooks may block or fail a
// call; they run without the sink's lock held so a test can inspect the
// sink while Run is blocked in one.
type fakeSink struct {
	calls     syncbuf.List[call]
	deadlines syncbuf.List[deadlineCall]

	onEvent     func(ev core.Event) error
	onControl   func(c stream.Control) error
	onHeartbeat func() error
	onFlush     func() error

	mu        sync.Mutex // guards aborted
	abortOnce sync.Once
	aborted   chan struct{}
}

var _ stream.Sink = (*fakeSink)(nil)

// Abort records the watcher's abort; a test that blocks the sink uses
// aborted to unblock itself.
func (s *fakeSink) Abort(time.Time) {
	s.record(call{Op: "abort"})
	s.abortOnce.Do(func() { close(s.abortedCh()) })
}

func (s *fakeSink) abortedCh() chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.aborted == nil {
		s.aborted = make(chan struct{})
	}
	return s.aborted
}

func (s *fakeSink) record(c call) {
	c.At = time.Now()
	s.calls.Append(c)
}

func (s *fakeSink) Event(ev core.Event, token []byte) error {
	if s.onEvent != nil {
		if err := s.onEvent(ev); err != nil {
			return err
		}
	}
	s.record(call{Op: "event", Event: ev, Token: string(token)})
	return nil
}

func (s *fakeSink) Control(c stream.Control, data map[string]any) error {
	if s.onControl != nil {
		if err := s.onControl(c); err != nil {
			return err
		}
	}
	b, err := json.Marshal(data)
	if err != nil {
		return fmt.Errorf("control data does not marshal: %w", err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	s.record(call{Op: "control", Ctl: c, Data: m})
	return nil
}

func (s *fakeSink) Heartbeat() error { return s.bare("heartbeat", s.onHeartbeat) }

func (s *fakeSink) Flush() error { return s.bare("flush", s.onFlush) }

// bare is a call of op that carries nothing: its hook, if set, may fail
// it (then nothing is recorded).
func (s *fakeSink) bare(op string, hook func() error) error {
	if hook != nil {
		if err := hook(); err != nil {
			return err
		}
	}
	s.record(call{Op: op})
	return nil
}

func (s *fakeSink) SetWriteDeadline(t time.Time) error {
	s.deadlines.Append(deadlineCall{At: time.Now(), Deadline: t})
	return nil
}

// ops returns the calls filtered to the given ops (all when none given).
func (s *fakeSink) ops(ops ...string) []call {
	var out []call
	for _, c := range s.calls.All() {
		if len(ops) == 0 || containsStr(ops, c.Op) {
			out = append(out, c)
		}
	}
	return out
}

// events returns the job events written so far.
func (s *fakeSink) events() []core.Event {
	var out []core.Event
	for _, c := range s.ops("event") {
		out = append(out, c.Event)
	}
	return out
}

// controls returns the control events written so far.
func (s *fakeSink) controls() []call { return s.ops("control") }

func (s *fakeSink) count(op string) int { return len(s.ops(op)) }

// trace is a compact rendering of the calls, for failure messages.
func (s *fakeSink) trace() string {
	var b strings.Builder
	for _, c := range s.calls.All() {
		switch c.Op {
		case "event":
			fmt.Fprintf(&b, "event(%d %s %q) ", c.Event.Seq, c.Event.Kind, c.Token)
		case "control":
			fmt.Fprintf(&b, "control(%s %v) ", c.Ctl, c.Data)
		default:
			b.WriteString(c.Op + " ")
		}
	}
	return b.String()
}

func containsStr(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// waitFor polls cond until it holds, failing the test after 5s: no bare
// sleeps standing in for synchronisation.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	ticktest.WaitFor(t, 5*time.Second, what, cond)
}

// runAsync starts Run on its own goroutine, under a context the test's
// cleanup cancels, and returns a function that waits (bounded) for its
// Result. The cleanup waits too, so a test that fails early never leaves the
// goroutine for goleak to find.
func runAsync(t *testing.T, ctx context.Context, req stream.Request, sink stream.Sink) func() stream.Result {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan stream.Result, 1)
	go func() { done <- stream.Run(ctx, req, sink) }()
	var (
		res stream.Result
		got bool
	)
	t.Cleanup(func() {
		cancel()
		if got {
			return
		}
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Errorf("Run did not return after its context was cancelled")
		}
	})
	return func() stream.Result {
		t.Helper()
		if !got {
			select {
			case res = <-done:
				got = true
			case <-time.After(5 * time.Second):
				t.Fatalf("Run did not return in time; sink saw: %s", sinkTrace(sink))
			}
		}
		return res
	}
}

func sinkTrace(s stream.Sink) string {
	if fs, ok := s.(*fakeSink); ok {
		return fs.trace()
	}
	return "?"
}

// runSync runs a stream expected to end by itself, bounded: a Run that
// never returns fails the test instead of hanging it.
func runSync(t *testing.T, req stream.Request, sink stream.Sink) stream.Result {
	t.Helper()
	return runAsync(t, context.Background(), req, sink)()
}
