package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/resume"
	"github.com/switchyard/switchyard/core/stream"
)

// discardWriter is a ResponseWriter that throws bytes away, to measure the
// SSE writer alone: history read, token, envelope, encoding.
type discardWriter struct{ h http.Header }

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (d *discardWriter) WriteHeader(int)             {}
func (d *discardWriter) Flush()                      {}

// BenchmarkSSEWriter replays a finished job's history through the SSE sink
// and reports events per second and bytes per event.
func BenchmarkSSEWriter(b *testing.B) {
	ring, err := resume.NewKeyring("k0", resume.GenerateKey("k0"))
	if err != nil {
		b.Fatal(err)
	}
	const n = 4096
	j := &core.Job{ID: "j_bench0000000000", History: core.NewHistory(n+2, 64<<20)}
	j.History.Append(core.EventAccepted, 0, []byte(`{"queue":"q","ttl_ms":1000}`))
	for i := range n {
		d, _ := json.Marshal(map[string]any{"data": fmt.Sprintf("token-%d ", i)})
		j.History.Append(core.EventOutput, 1, d)
	}
	j.History.Append(core.EventDone, 1, []byte(`{"outcome":"completed"}`))
	pos := stream.Positions{Keyring: ring, TTL: time.Hour, Snapshot: 1}
	caller, filter := stream.CallerFingerprint(""), stream.FilterFingerprint(nil)
	sg, err := pos.Signer(j, caller, filter)
	if err != nil {
		b.Fatal(err)
	}
	signer := func(dst []byte, ev core.Event, now time.Time) []byte {
		t, _ := sg.AppendSign(dst, ev.Stream, ev.Seq, now)
		return t
	}
	pol := stream.DefaultPolicy()
	pol.MaxLagEvents = 1 << 20
	var bytes int64
	b.ResetTimer()
	for range b.N {
		w := &countingWriter{discardWriter: discardWriter{h: http.Header{}}}
		res := stream.Run(context.Background(), stream.Request{
			Job: j, Policy: pol,
			Token: signer,
		}, &sseSink{sseConn: sseConn{w: w, rc: http.NewResponseController(w)}, job: j, snap: 1})
		if res.End != stream.EndTerminal {
			b.Fatalf("end %s", res.End)
		}
		bytes += w.n
	}
	b.ReportMetric(float64(b.N*(n+2))/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(bytes)/float64(b.N*(n+2)), "B/event")
}

type countingWriter struct {
	discardWriter
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

var _ io.Writer = (*countingWriter)(nil)
