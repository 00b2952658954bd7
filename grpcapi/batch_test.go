package grpcapi

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/stream"
	"github.com/switchyard/switchyard/internal/coretest"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// A batch's bytes are proto's for the JobEventBatch of its events, however
// many it holds and however far its buffer grew; every buffer returns to
// the pool once gRPC freed what it was handed (or the batch was released
// unsent).
func TestWireBatchEncodesAsProto(t *testing.T) {
	pool := newCountingPool()
	c := newCodec()
	b := &wireBatch{pool: pool}
	evs := testEvents()
	r := rand.New(rand.NewPCG(5, 6))
	for start := 0; start < len(evs); {
		end := min(len(evs), start+1+r.IntN(40))
		for _, ev := range evs[start:end] {
			w := wireOf(pool, ev)
			n, err := w.size()
			if err != nil {
				t.Fatal(err)
			}
			b.add(w, n)
		}
		if b.n != end-start {
			t.Fatalf("batch counts %d events, want %d", b.n, end-start)
		}
		want, err := proto.Marshal(&pb.JobEventBatch{Events: evs[start:end]})
		if err != nil {
			t.Fatal(err)
		}
		if b.len() != len(want) {
			t.Fatalf("batch of events %d..%d: len %d, proto's %d", start, end, b.len(), len(want))
		}
		got, err := c.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Materialize(), want) {
			t.Fatalf("batch of events %d..%d: encoded\n%x\nproto\n%x", start, end, got.Materialize(), want)
		}
		if b.n != 0 || b.len() != 0 {
			t.Fatalf("the batch holds %d events (%d bytes) after it was handed over", b.n, b.len())
		}
		got.Free()
		start = end
	}
	// An unsent batch goes back with release.
	b.add(wireOf(pool, evs[2]), proto.Size(evs[2]))
	b.release()
	if n := pool.outstanding(); n != 0 {
		t.Errorf("%d buffers never returned to the pool", n)
	}
	// An empty batch encodes to nothing.
	if got := b.marshal(); got.Len() != 0 {
		t.Errorf("empty batch encoded %d bytes", got.Len())
	}
}

// A replay is one read of the history: one message on a batched stream,
// the same events (and tokens) as the per-event stream's messages.
func TestGRPCBatchedRunOverTheSink(t *testing.T) {
	j := testJob(t)
	coretest.Append(t, j, core.EventAccepted, `{"queue":"q"}`)
	coretest.Append(t, j, core.EventOutput, `{"data":"a"}`)
	coretest.Append(t, j, core.EventDone, `{"outcome":"completed"}`)
	per, batched := newFakeStream(), newFakeStream()
	runSink(t, j, 0, per)
	res := runSink(t, j, 64<<10, batched)
	if res.End != stream.EndTerminal || res.LastSeq != 3 {
		t.Fatalf("result %+v", res)
	}
	if got := batched.messages(); !slices.Equal(got, []int{3}) {
		t.Errorf("batched messages %v, want one of 3 events", got)
	}
	if got := per.messages(); !slices.Equal(got, []int{1, 1, 1}) {
		t.Errorf("per-event messages %v", got)
	}
	if !slices.EqualFunc(per.events(), batched.events(), func(a, b *pb.JobEvent) bool { return proto.Equal(a, b) }) {
		t.Errorf("batched events %v, per-event %v", batched.events(), per.events())
	}
	if batched.headersSent() != 0 {
		t.Errorf("headers sent on their own %d times: they go with the first batch", batched.headersSent())
	}
}

// A batch adds no wait: the first output after the stream opened goes out
// on its own, ahead of what was ready with it (stream.Run's early flush),
// and the rest in one message.
func TestGRPCBatchedFirstOutputGoesAlone(t *testing.T) {
	j := testJob(t)
	coretest.Append(t, j, core.EventAccepted, `{"queue":"q"}`)
	f := newFakeStream()
	// The accepted event's Send waits while the worker's burst lands.
	f.blockThen(t, func() {
		for _, d := range []string{"a", "b", "c", "d"} {
			coretest.Append(t, j, core.EventOutput, `{"data":"`+d+`"}`)
		}
		coretest.Append(t, j, core.EventDone, `{"outcome":"completed"}`)
		f.unblock()
	})
	runSink(t, j, 64<<10, f)
	if got := f.messages(); !slices.Equal(got, []int{1, 1, 4}) {
		t.Errorf("messages of %v events, want accepted | the first output | the rest", got)
	}
	if got := f.kinds(); !slices.Equal(got, []string{"accepted", "output", "output", "output", "output", "done"}) {
		t.Errorf("sent %v", got)
	}
}

// Events ready together beyond the bound go in the next message; one
// event larger than the bound goes alone, whole.
func TestGRPCBatchedSinkSplitsAtItsBound(t *testing.T) {
	const bound = 1000
	j := testJob(t)
	coretest.Append(t, j, core.EventAccepted, `{"queue":"q"}`)
	for i := range 10 {
		coretest.Append(t, j, core.EventOutput, `{"data":"`+strings.Repeat(string(rune('a'+i)), 300)+`"}`)
	}
	coretest.Append(t, j, core.EventOutput, `{"data":"`+strings.Repeat("z", 3*bound)+`"}`)
	coretest.Append(t, j, core.EventDone, `{"outcome":"completed"}`)
	per, f := newFakeStream(), newFakeStream()
	runSink(t, j, 0, per)
	runSink(t, j, bound, f)
	evs, msgs := f.events(), f.messages()
	if !slices.EqualFunc(per.events(), evs, func(a, b *pb.JobEvent) bool { return proto.Equal(a, b) }) {
		t.Fatalf("batched events differ from the per-event stream's")
	}
	if len(msgs) < 5 || len(msgs) >= len(evs) {
		t.Errorf("messages of %v events: want the 13 split at %d bytes, but batched", msgs, bound)
	}
	for i, at := 0, 0; i < len(msgs); i++ {
		group := evs[at : at+msgs[i]]
		at += msgs[i]
		size := proto.Size(&pb.JobEventBatch{Events: group})
		if len(group) > 1 && size > bound {
			t.Errorf("message %d: %d events in %d bytes, past the bound", i, len(group), size)
		}
		if len(group) == 1 && size > bound && !strings.Contains(string(group[0].GetDataJson()), "zzz") {
			t.Errorf("message %d: one event of %d bytes, which fits the bound with others", i, size)
		}
		if i+1 < len(msgs) {
			// A message is cut only where the next event would not fit.
			next := evs[at]
			if withNext := proto.Size(&pb.JobEventBatch{Events: append(slices.Clone(group), next)}); withNext <= bound {
				t.Errorf("message %d cut at %d bytes, though the next event fit (%d)", i, size, withNext)
			}
		}
	}
}

// A batched stream's writes fail where the batch is sent: at Flush, or at
// the Event that sends a full batch; every write after a failed Send
// fails; events left unsent count as a failed last write.
func TestGRPCBatchedSinkSendErrorFailsLaterWrites(t *testing.T) {
	j := testJob(t)
	f := newFakeStream()
	s := newSink(f, j, 42, 64<<10)
	defer s.close()
	ev := coretest.Append(t, j, core.EventOutput, `{}`)
	_ = s.SetWriteDeadline(time.Now().Add(time.Hour))
	if err := s.Event(ev, nil); err != nil {
		t.Fatalf("event: %v", err)
	}
	if !s.lastWriteFailed() {
		t.Error("an event left unsent does not count as a failed last write")
	}
	boom := errors.New("transport is closing")
	f.mu.Lock()
	f.sendErr = boom
	f.mu.Unlock()
	if err := s.Flush(); !errors.Is(err, boom) {
		t.Fatalf("flush: %v, want %v", err, boom)
	}
	f.mu.Lock()
	f.sendErr = nil
	f.mu.Unlock()
	if err := s.Event(ev, nil); !errors.Is(err, boom) {
		t.Errorf("event after a failed Send: %v, want %v", err, boom)
	}
	if err := s.Flush(); !errors.Is(err, boom) {
		t.Errorf("flush after a failed Send: %v, want %v", err, boom)
	}
	if len(f.events()) != 0 || !s.lastWriteFailed() {
		t.Errorf("sent %v after a failed Send (lastWriteFailed %v)", f.kinds(), s.lastWriteFailed())
	}
}
