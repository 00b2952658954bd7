package worker_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
	"github.com/switchyard/switchyard/worker"
)

// startHandle runs a Worker made by New against addr; the test's cleanup
// stops it.
func startHandle(t *testing.T, addr string, cfg worker.Config) (*worker.Worker, *runningWorker) {
	t.Helper()
	w, err := worker.New(testConfig(cfg, addr), blockUntilCancelled(nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rw := &runningWorker{cancel: cancel, done: make(chan error, 1)}
	go func() { rw.done <- w.Run(ctx) }()
	t.Cleanup(func() {
		if err := rw.stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return w, rw
}

// startDeclaringA starts a Worker declaring model=a on a fake node and
// returns the node, the worker and its session.
func startDeclaringA(t *testing.T) (*fakeNode, *worker.Worker, *fakeSession) {
	t.Helper()
	f := newFakeNode()
	addr := f.start(t)
	w, _ := startHandle(t, addr, worker.Config{Capabilities: []string{"model=a"}})
	return f, w, f.nextSession(t)
}

// setAsync calls SetCapabilities in a goroutine and delivers its result.
func setAsync(w *worker.Worker, caps ...string) <-chan error {
	ch := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		ch <- w.SetCapabilities(ctx, caps)
	}()
	return ch
}

// expectUpdate returns the capabilities of the next message, which must be
// an UpdateCapabilities.
func (s *fakeSession) expectUpdate(t *testing.T) []string {
	t.Helper()
	m := s.next(t)
	u := m.GetUpdateCapabilities()
	if u == nil {
		t.Fatalf("want UpdateCapabilities, got %v", m)
	}
	return u.Capabilities
}

func (s *fakeSession) answerUpdate(t *testing.T, a *pb.CapabilitiesUpdated) {
	t.Helper()
	s.send(t, &pb.NodeMessage{Msg: &pb.NodeMessage_CapabilitiesUpdated{CapabilitiesUpdated: a}})
}

// SetCapabilities sends the new set on the live session, returns once the
// node accepts it, and a reconnect registers with it.
func TestSetCapabilitiesAccepted(t *testing.T) {
	f, w, s := startDeclaringA(t)
	if !slices.Equal(s.reg.Capabilities, []string{"model=a"}) {
		t.Fatalf("register capabilities = %v", s.reg.Capabilities)
	}
	res := setAsync(w, "model=b", "gpu=x")
	if got := s.expectUpdate(t); !slices.Equal(got, []string{"model=b", "gpu=x"}) {
		t.Fatalf("update = %v", got)
	}
	select {
	case err := <-res:
		t.Fatalf("SetCapabilities returned %v before the node answered", err)
	case <-time.After(50 * time.Millisecond):
	}
	s.answerUpdate(t, &pb.CapabilitiesUpdated{Capabilities: []string{"gpu=x", "model=b"}})
	if err := recv(t, res, "SetCapabilities"); err != nil {
		t.Fatalf("SetCapabilities: %v", err)
	}
	if got := w.Capabilities(); !slices.Equal(got, []string{"model=b", "gpu=x"}) {
		t.Fatalf("Capabilities() = %v", got)
	}

	close(s.drop)
	s2 := f.nextSession(t)
	if !slices.Equal(s2.reg.Capabilities, []string{"model=b", "gpu=x"}) {
		t.Fatalf("re-register capabilities = %v, want the updated set", s2.reg.Capabilities)
	}
}

// A refusal is a *CapabilitiesError, keeps the old set and the session.
func TestSetCapabilitiesRefused(t *testing.T) {
	f, w, s := startDeclaringA(t)
	res := setAsync(w, "bad")
	s.expectUpdate(t)
	s.answerUpdate(t, &pb.CapabilitiesUpdated{Code: "invalid_worker", Message: `capability "bad": want key=value`})
	err := recv(t, res, "SetCapabilities")
	var ce *worker.CapabilitiesError
	if !errors.As(err, &ce) || ce.Code != "invalid_worker" {
		t.Fatalf("SetCapabilities = %v, want a CapabilitiesError invalid_worker", err)
	}
	if got := w.Capabilities(); !slices.Equal(got, []string{"model=a"}) {
		t.Fatalf("Capabilities() = %v, want the old set", got)
	}
	// Same session: the next update goes out on it.
	res = setAsync(w, "model=b")
	s.expectUpdate(t)
	s.answerUpdate(t, &pb.CapabilitiesUpdated{Capabilities: []string{"model=b"}})
	if err := recv(t, res, "SetCapabilities"); err != nil {
		t.Fatal(err)
	}
	if n := f.registers.Load(); n != 1 {
		t.Fatalf("registers = %d, want 1", n)
	}
}

// Concurrent calls go out one at a time: the second only after the first
// was answered.
func TestSetCapabilitiesOneInFlight(t *testing.T) {
	_, w, s := startDeclaringA(t)
	r1, r2 := setAsync(w, "model=b"), setAsync(w, "model=c")
	first := s.expectUpdate(t)
	select {
	case m := <-s.msgs:
		t.Fatalf("second message %v before the first update was answered", m)
	case <-time.After(100 * time.Millisecond):
	}
	s.answerUpdate(t, &pb.CapabilitiesUpdated{Capabilities: first})
	second := s.expectUpdate(t)
	s.answerUpdate(t, &pb.CapabilitiesUpdated{Capabilities: second})
	for _, r := range []<-chan error{r1, r2} {
		if err := recv(t, r, "SetCapabilities"); err != nil {
			t.Fatal(err)
		}
	}
	if got := w.Capabilities(); !slices.Equal(got, second) {
		t.Fatalf("Capabilities() = %v, want the last applied %v", got, second)
	}
}

// An update the session took down with it is sent again on the next
// session, which registered with the old set.
func TestSetCapabilitiesResentAfterReconnect(t *testing.T) {
	f, w, s := startDeclaringA(t)
	res := setAsync(w, "model=b")
	s.expectUpdate(t)
	close(s.drop)
	s2 := f.nextSession(t)
	if !slices.Equal(s2.reg.Capabilities, []string{"model=a"}) {
		t.Fatalf("re-register capabilities = %v, want the old set (never answered)", s2.reg.Capabilities)
	}
	if got := s2.expectUpdate(t); !slices.Equal(got, []string{"model=b"}) {
		t.Fatalf("resent update = %v", got)
	}
	s2.answerUpdate(t, &pb.CapabilitiesUpdated{Capabilities: []string{"model=b"}})
	if err := recv(t, res, "SetCapabilities"); err != nil {
		t.Fatal(err)
	}
}

// A node that ends the session over the update (one that does not know the
// message answers InvalidArgument) gets it once, not on every reconnect.
func TestSetCapabilitiesNodeEndsSession(t *testing.T) {
	f, w, s := startDeclaringA(t)
	res := setAsync(w, "model=b")
	s.expectUpdate(t)
	s.endWith <- status.Error(codes.InvalidArgument, "unknown worker message")
	err := recv(t, res, "SetCapabilities")
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("SetCapabilities = %v, want InvalidArgument", err)
	}
	s2 := f.nextSession(t) // Run reconnects as for any session that ended
	if !slices.Equal(s2.reg.Capabilities, []string{"model=a"}) {
		t.Fatalf("re-register capabilities = %v", s2.reg.Capabilities)
	}
	select {
	case m := <-s2.msgs:
		t.Fatalf("unexpected %v on the next session", m)
	case <-time.After(100 * time.Millisecond):
	}
}

// When ctx ends after the update went out, SetCapabilities returns, and the
// node's later answer still decides what the worker declares.
func TestSetCapabilitiesContextEndsAfterSend(t *testing.T) {
	_, w, s := startDeclaringA(t)
	ctx, cancel := context.WithCancel(context.Background())
	res := make(chan error, 1)
	go func() { res <- w.SetCapabilities(ctx, []string{"model=b"}) }()
	s.expectUpdate(t)
	cancel()
	if err := recv(t, res, "SetCapabilities"); !errors.Is(err, context.Canceled) {
		t.Fatalf("SetCapabilities = %v, want Canceled", err)
	}
	s.answerUpdate(t, &pb.CapabilitiesUpdated{Capabilities: []string{"model=b"}})
	deadline := time.Now().Add(wait)
	for !slices.Equal(w.Capabilities(), []string{"model=b"}) {
		if time.Now().After(deadline) {
			t.Fatalf("Capabilities() = %v after the node accepted model=b", w.Capabilities())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Before Run connects SetCapabilities waits (bounded by ctx); after Run
// returned it fails with ErrStopped, as does a second Run.
func TestSetCapabilitiesLifecycle(t *testing.T) {
	f := newFakeNode()
	addr := f.start(t)
	w, err := worker.New(worker.Config{Server: addr, Queue: "q"}, blockUntilCancelled(nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := w.SetCapabilities(ctx, []string{"model=b"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("SetCapabilities before Run = %v, want DeadlineExceeded", err)
	}

	// A call made before Run is sent once the session is registered.
	res := setAsync(w, "model=b")
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(rctx) }()
	s := f.nextSession(t)
	s.expectUpdate(t)
	s.answerUpdate(t, &pb.CapabilitiesUpdated{Capabilities: []string{"model=b"}})
	if err := recv(t, res, "SetCapabilities"); err != nil {
		t.Fatal(err)
	}
	if err := w.Run(context.Background()); !errors.Is(err, worker.ErrStopped) {
		t.Fatalf("second Run = %v, want ErrStopped", err)
	}
	stop()
	if err := recv(t, done, "Run"); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := w.SetCapabilities(context.Background(), []string{"model=c"}); !errors.Is(err, worker.ErrStopped) {
		t.Fatalf("SetCapabilities after Run = %v, want ErrStopped", err)
	}
}
