package integration_test

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	sse "github.com/tmaxmax/go-sse"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/worker"
)

var streamOutputs = flag.Int("stream.outputs", 100_000, "outputs per stream in BenchmarkStreamThroughput")

// BenchmarkStreamThroughput is one stream's throughput, the shape
// (the demo worker with no delay streaming N words back, one output each,
// to a client reading as fast as it can): through one node, across nodes
// (reader on n1, worker on n3), and from a plain SSE writer — a bare
// net/http handler writing events of the same size from memory, flushing
// every 64 (as a node's stream writer does at most) — read by the same
// client and parser. It prints events/s and MB/s of each, and checks that
// every output arrived, in order, then done. make bench runs it once.
func BenchmarkStreamThroughput(b *testing.B) {
	n := *streamOutputs
	body := wordsInput(n)
	type figure struct {
		name            string
		events          int
		bytes           int64
		took, waited    time.Duration
		eventsPerSec    float64
		megabytesPerSec float64
	}
	var figs []figure
	measure := func(b *testing.B, name string, read func() (streamTally, time.Duration), waited func() time.Duration) figure {
		var f figure
		for range b.N {
			st, took := read()
			if st.err != nil || len(st.controls) > 0 || st.last.Type != "done" || st.outputs != n {
				b.Fatalf("%s: %d of %d outputs, last %s, controls %v, err %v", name, st.outputs, n, st.last.Type, st.controls, st.err)
			}
			f = figure{name: name, events: st.events, bytes: st.bytes, took: took}
		}
		if waited != nil {
			f.waited = waited()
		}
		f.eventsPerSec = float64(f.events) / f.took.Seconds()
		f.megabytesPerSec = float64(f.bytes) / f.took.Seconds() / 1e6
		b.ReportMetric(f.eventsPerSec, "events/s")
		b.ReportMetric(f.megabytesPerSec, "MB/s")
		figs = append(figs, f)
		return f
	}
	viaNode := func(ingress *switchyard.Node) (streamTally, time.Duration) {
		t0 := time.Now()
		res := post(context.Background(), b, ingress, "demo", body, true)
		defer res.Body.Close()
		st := tallyStream(res.Body, 0)
		return st, time.Since(t0)
	}
	waitedOn := func(nodes ...*switchyard.Node) func() time.Duration {
		return func() time.Duration {
			var s float64
			for _, nd := range nodes {
				s += metric(b, nd, "switchyard_worker_credit_wait_seconds_total", nil)
			}
			return time.Duration(s * float64(time.Second))
		}
	}

	var eventSize int64
	b.Run("one node", func(b *testing.B) {
		nd := MustStartNode(b, nil)
		MustStartWorker(b, nd, worker.Config{}, worker.Tokens(0))
		f := measure(b, "one node", func() (streamTally, time.Duration) { return viaNode(nd) }, waitedOn(nd))
		eventSize = f.bytes / int64(f.events)
	})
	b.Run("reader on n1, worker on n3", func(b *testing.B) {
		nodes := startCluster(b, 3, nil)
		MustStartWorker(b, nodes[2], worker.Config{Name: "w3"}, worker.Tokens(0))
		for _, nd := range nodes {
			waitFor(b, 5*time.Second, "n3 dispatches demo", func() bool { return dispatcherOf(nd, "demo") == "n3" })
		}
		measure(b, "reader on n1, worker on n3", func() (streamTally, time.Duration) { return viaNode(nodes[0]) }, waitedOn(nodes...))
	})
	b.Run("plain SSE writer", func(b *testing.B) {
		if eventSize == 0 {
			b.Skip("needs the one-node figure for the event size")
		}
		url := plainSSE(b, n, int(eventSize))
		measure(b, "plain SSE writer", func() (streamTally, time.Duration) {
			t0 := time.Now()
			res, err := http.Get(url)
			if err != nil {
				b.Fatal(err)
			}
			defer res.Body.Close()
			st := tallyStream(res.Body, 0)
			return st, time.Since(t0)
		}, nil)
	})
	var out strings.Builder
	fmt.Fprintf(&out, "one stream of %d outputs (+ accepted, done), read by one client with go-sse's parser:\n", n)
	for _, f := range figs {
		fmt.Fprintf(&out, "  %-28s %9.0f events/s %6.1f MB/s  (%d events, %d bytes, %s", f.name, f.eventsPerSec, f.megabytesPerSec, f.events, f.bytes, f.took.Round(time.Millisecond))
		if f.waited > 0 || f.name != "plain SSE writer" {
			fmt.Fprintf(&out, "; the worker waited %s for its reader", f.waited.Round(time.Millisecond))
		}
		out.WriteString(")\n")
	}
	// Straight to stdout: a parent benchmark's b.Log shows only under -v.
	fmt.Print(out.String())
}

// plainSSE serves n+2 events of size bytes each (accepted, n outputs,
// done) as a bare net/http handler writing from memory, each with its seq
// in the data as a node's events carry it, flushing every 64: the ceiling
// of one SSE stream on this machine with this client. It returns its URL.
func plainSSE(b *testing.B, n, size int) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		id := strings.Repeat("i", 140) // a resume token's length
		for seq := 1; seq <= n+2; seq++ {
			kind := "output"
			switch seq {
			case 1:
				kind = "accepted"
			case n + 2:
				kind = "done"
			}
			m := &sse.Message{Type: sse.Type(kind), ID: sse.ID(id)}
			data := fmt.Sprintf(`{"seq":%d,"data":"`, seq)
			pad := max(size-len(data)-len(kind)-len(id)-25, 0)
			m.AppendData(data + strings.Repeat("x", pad) + `"}`)
			if _, err := m.WriteTo(w); err != nil {
				return
			}
			if seq%64 == 0 {
				if rc.Flush() != nil {
					return
				}
			}
		}
		_ = rc.Flush()
	})}
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}
