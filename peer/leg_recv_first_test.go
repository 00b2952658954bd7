package peer

import (
	"slices"
	"testing"

	"github.com/switchyard/switchyard/core"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// kindRecorder is a core.Receiver that keeps what HandleMessage was given,
// in order; any other method is not expected here (nil interface).
type kindRecorder struct {
	core.Receiver
	got []string
}

func (r *kindRecorder) HandleMessage(_ string, m core.Message) {
	switch {
	case m.Accepted:
		r.got = append(r.got, "accepted")
	case m.Output != nil:
		r.got = append(r.got, string(m.Output))
	case m.End != nil:
		r.got = append(r.got, "end")
	}
}

// handleItem reports a leg's first output handed to the receiver (the
// reader yields on it for a leg alone on its stream) once: not for an
// accept before it, not for a resend of it whose ack was lost, not for the
// outputs after it; and every item still reaches the receiver once, in
// order.
func TestHandleItemReportsALegsFirstOutputOnce(t *testing.T) {
	rs := &respondIn{inCall: inCall{from: "h"}, session: "s1"}
	leg := &inLeg{key: inLegKey{"h", "job-1", 2}}
	rcv := &kindRecorder{}
	reply := func(seq uint64, out string, accepted bool, end bool) *pb.RespondItem {
		m := &pb.PeerMessage{Kind: pb.PeerMessage_KIND_REPLY, JobId: "job-1", Generation: 2, Queue: "q", Output: []byte(out), Accepted: accepted}
		if end {
			m.End = &pb.PeerEnd{}
		}
		return &pb.RespondItem{Seq: seq, Message: m}
	}
	steps := []struct {
		name  string
		it    *pb.RespondItem
		first bool
	}{
		{"accept", reply(0, "", true, false), false},
		{"first output", reply(1, `"a"`, false, false), true},
		{"its resend", reply(1, `"a"`, false, false), false},
		{"second output", reply(2, `"b"`, false, false), false},
		{"end", reply(3, "", false, true), false},
	}
	for _, s := range steps {
		latest, first := rs.handleItem(rcv, leg, s.it)
		if !latest || first != s.first {
			t.Fatalf("%s: handleItem reported latest %v, first output %v; want true, %v", s.name, latest, first, s.first)
		}
	}
	if want := []string{"accepted", `"a"`, `"b"`, "end"}; !slices.Equal(rcv.got, want) {
		t.Fatalf("the receiver got %q, want %q", rcv.got, want)
	}
}

// ingressJobs is a core.IngressLoad that holds n jobs.
type ingressJobs int

func (n ingressJobs) IngressJobs() int { return int(n) }

// The reply stream reader yields for a leg's first output only when the
// leg is the only one open on the stream and its job the only one the
// node holds as their ingress: not for a leg alone on the stream while the
// ingress holds others (the load the legs do not show), not with other
// legs open, and never for a receiver that does not tell its load.
func TestReplyReaderYieldsOnlyForAJobAloneAtItsIngress(t *testing.T) {
	one := map[inLegKey]*inLeg{{"h", "job-1", 1}: {}}
	two := map[inLegKey]*inLeg{{"h", "job-1", 1}: {}, {"h", "job-2", 1}: {}}
	for _, tc := range []struct {
		name string
		legs map[inLegKey]*inLeg
		load core.IngressLoad
		want bool
	}{
		{"one leg, one ingress job", one, ingressJobs(1), true},
		{"one leg, two ingress jobs", one, ingressJobs(2), false},
		{"one leg, 64 ingress jobs", one, ingressJobs(64), false},
		{"two legs, one ingress job", two, ingressJobs(1), false},
		{"one leg, a receiver without its load", one, nil, false},
	} {
		rd := &respondReader{legs: tc.legs, load: tc.load}
		if got := rd.alone(); got != tc.want {
			t.Errorf("%s: alone() = %v, want %v", tc.name, got, tc.want)
		}
	}
}
