package peer_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/peer"
)

// ender is a core.Receiver that reports each final message (one with an
// End) it handles.
type ender struct {
	recorder
	ended chan struct{}
}

func (s *ender) HandleForward(string, core.Delivery) error { return nil }
func (s *ender) HandleMessage(_ string, m core.Message) {
	if m.End != nil {
		s.ended <- struct{}{}
	}
}

// BenchmarkResponseLeg measures the host's side of a job's response leg:
// Expect, then 16 outputs of 32 B and a final reply sent by Send, from
// node a (the host) to node b (the ingress) over loopback, 64 jobs at a
// time. Both nodes run in the process, so its allocs/op count both ends.
func BenchmarkResponseLeg(b *testing.B) {
	const jobs, outputs = 64, 16
	h := &ender{ended: make(chan struct{}, jobs)}
	srv := startNode(b, "b", "127.0.0.1:0", h, nil)
	r := startNode(b, "a", "", nil, func(c *peer.Config) {
		*c = peer.Config{Node: "a", Secret: secret, MaxMessageBytes: 1 << 20, Heartbeat: time.Second,
			Addr: func(string) (string, bool) { return srv.addr, true }}
	})
	out := json.RawMessage(`"` + string(make([]byte, 30)) + `"`)
	for i := range out[1 : len(out)-1] {
		out[1+i] = 'x'
	}
	job := func(i int) {
		id := fmt.Sprintf("j%d", i)
		r.Expect("b", id, 1, "q", time.Minute)
		for range outputs {
			r.Send("b", core.Message{Kind: core.MsgReply, JobID: id, Gen: 1, Queue: "q", Consumer: "c", Output: out, TTL: time.Minute})
		}
		r.Send("b", core.Message{Kind: core.MsgReply, JobID: id, Gen: 1, Queue: "q", Consumer: "c", End: &core.End{Code: "ok"}, TTL: time.Minute})
	}
	job(-1) // open the connection and the reply stream
	<-h.ended
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += jobs {
		n := min(jobs, b.N-i)
		for k := range n {
			job(i + k)
		}
		for range n {
			<-h.ended
		}
	}
}
