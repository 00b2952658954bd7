package grpcapi

import (
	"bytes"
	"reflect"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// goid is the calling goroutine's id, from its stack trace's header.
func goid(t *testing.T) uint64 {
	b := make([]byte, 64)
	b = b[:runtime.Stack(b, false)]
	f := bytes.Fields(b)
	if len(f) < 2 {
		t.Fatalf("stack header %q", b)
	}
	id, err := strconv.ParseUint(string(f[1]), 10, 64)
	if err != nil {
		t.Fatalf("stack header %q: %v", b, err)
	}
	return id
}

// on runs f on r and waits for it, returning the runner's goroutine id.
func on(t *testing.T, r *runners, f func()) uint64 {
	done := make(chan uint64)
	r.run(func() {
		f()
		done <- goid(t)
	})
	return <-done
}

func TestRunnersReuseTheLastIdle(t *testing.T) {
	var wg sync.WaitGroup
	r := &runners{wg: &wg}
	defer wg.Wait()
	defer r.close()

	first := on(t, r, func() {})
	waitIdle(t, r, 1)
	if again := on(t, r, func() {}); again != first {
		t.Fatalf("second run on goroutine %d, want the idle runner %d", again, first)
	}
	waitIdle(t, r, 1)

	// Two at once: a second runner starts; the one that finished last is
	// the next one reused.
	release := make(chan struct{})
	ids := make(chan uint64, 2)
	for range 2 {
		r.run(func() {
			id := goid(t)
			<-release
			ids <- id
		})
	}
	release <- struct{}{}
	a := <-ids
	waitIdle(t, r, 1)
	release <- struct{}{}
	b := <-ids
	waitIdle(t, r, 2)
	if a == b {
		t.Fatalf("two runs at once shared goroutine %d", a)
	}
	if next := on(t, r, func() {}); next != b {
		t.Fatalf("run on goroutine %d, want the last to finish, %d (the other is %d)", next, b, a)
	}
}

func TestRunnersKeepAtMostMaxIdle(t *testing.T) {
	var wg sync.WaitGroup
	r := &runners{wg: &wg}
	release := make(chan struct{})
	var ran sync.WaitGroup
	for range maxIdleRunners + 5 {
		ran.Add(1)
		r.run(func() {
			defer ran.Done()
			<-release
		})
	}
	close(release)
	ran.Wait()
	waitIdle(t, r, maxIdleRunners)
	r.close()
	wg.Wait() // every runner ended: the idle ones by close, the rest by themselves
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.idle) != 0 {
		t.Fatalf("%d runners idle after close", len(r.idle))
	}
}

func TestRunnersAfterClose(t *testing.T) {
	var wg sync.WaitGroup
	r := &runners{wg: &wg}
	on(t, r, func() {})
	r.close()
	ran := false
	on(t, r, func() { ran = true })
	wg.Wait() // the run after close ended its goroutine
	if !ran {
		t.Fatal("a run after close did not run")
	}
}

// waitIdle waits until n runners wait (a runner queues itself just after
// its run's function returned).
func waitIdle(t *testing.T, r *runners, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		r.mu.Lock()
		got := len(r.idle)
		r.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d runners idle, want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// Every stream of the JobService receives its request on a runner: the
// service registers the generated description with its stream handlers
// replaced, and a stream added to the proto must be added there too.
func TestServiceDescReplacesEveryStream(t *testing.T) {
	d := (&JobServer{}).serviceDesc()
	gen := pb.JobService_ServiceDesc
	if len(d.Streams) != len(gen.Streams) || len(d.Methods) != len(gen.Methods) || d.ServiceName != gen.ServiceName {
		t.Fatalf("description %+v differs from the generated one's shape %+v", d, gen)
	}
	for i, st := range d.Streams {
		g := gen.Streams[i]
		if st.StreamName != g.StreamName || st.ServerStreams != g.ServerStreams || st.ClientStreams != g.ClientStreams {
			t.Errorf("stream %d: %+v, generated %+v", i, st, g)
		}
		if reflect.ValueOf(st.Handler).Pointer() == reflect.ValueOf(g.Handler).Pointer() {
			t.Errorf("stream %s keeps the generated handler: its request is received on gRPC's goroutine", st.StreamName)
		}
	}
}
