package peer_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/peer"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// fullDelivery sets every field of core.Delivery.
func fullDelivery() core.Delivery {
	return core.Delivery{
		JobID: "job-1", Gen: 7, Queue: "q", Ingress: "node-a",
		Input: json.RawMessage(`{"prompt":"hi"}`), Options: json.RawMessage(`{"x":1}`),
		Capabilities: map[string]string{"model": "demo", "gpu": "a100"}, Zone: "eu-1",
		TTL: 1234567891 * time.Nanosecond, MaxOutputBytes: 1 << 20,
		MaxQueueDepth: 42, MaxQueueBytes: 1 << 30,
		Exclude: []string{"c-1", "c-2"}, Front: true,
		Window:  core.OutputCredit{Events: 512, Bytes: 2 << 20},
		Trace:   sampleTrace(),
		Subject: "team-a", Weight: 3, Priority: -2, AffinityKey: "session-42", Epoch: 77,
		LatencyFirst: true,
	}
}

// sampleTrace is a sampled span context with a tracestate, as a receiver
// reads it: remote.
func sampleTrace() trace.SpanContext {
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ts, _ := trace.ParseTraceState("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7")
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, TraceState: ts, Remote: true})
}

// fullMessage sets every field of core.Message (no real message does).
func fullMessage() core.Message {
	d := fullDelivery()
	return core.Message{
		Kind: core.MsgReply, JobID: "job-1", Gen: 7, Queue: "q",
		Delivery: &d, Consumer: "c-3", WorkerName: "w",
		Accepted: true, Output: json.RawMessage(`"chunk"`),
		End:      &core.End{Code: core.CodeWorkerError, Detail: "boom", Result: json.RawMessage(`{"r":2}`)},
		Rejected: true, Running: true, Reason: "busy", Code: core.CodeCancelled,
		TTL:    987654321 * time.Nanosecond,
		Credit: core.OutputCredit{Events: 1 << 40, Bytes: 1 << 50},
	}
}

// The samples must set every field, so a field added to core without its
// wire form fails here rather than vanishing between nodes.
func TestSamplesSetEveryField(t *testing.T) {
	for _, v := range []any{fullDelivery(), fullMessage(), *fullMessage().End, core.Error{Code: "c", Detail: "d", Field: "f", RetryAfter: 1}} {
		rv := reflect.ValueOf(v)
		for i := range rv.NumField() {
			if rv.Field(i).IsZero() {
				t.Errorf("%T.%s is not set in the sample: add it to the proto, convert.go and the sample", v, rv.Type().Field(i).Name)
			}
		}
	}
}

// wire marshals and unmarshals p, as a peer would see it.
func wire[T proto.Message](t *testing.T, p T) T {
	t.Helper()
	b, err := proto.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	out := p.ProtoReflect().New().Interface().(T)
	if err := proto.Unmarshal(b, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// roundTrip converts in to its wire form and back, once directly and once
// through the encoded bytes (wire), and fails t unless each time gives
// want. It returns what each gave, by whether it went through the bytes.
func roundTrip[T any, P proto.Message](t *testing.T, in, want T, toPB func(T) (P, error), fromPB func(P) (T, error)) map[bool]T {
	t.Helper()
	out := map[bool]T{}
	for _, viaWire := range []bool{false, true} {
		p, err := toPB(in)
		if err != nil {
			t.Fatal(err)
		}
		if viaWire {
			p = wire(t, p)
		}
		got, err := fromPB(p)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("wire=%v:\n got %#v\nwant %#v", viaWire, got, want)
		}
		out[viaWire] = got
	}
	return out
}

func TestDeliveryRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name   string
		in     core.Delivery
		want   core.Delivery // zero: in
		sameAs bool
	}{
		{name: "every field", in: fullDelivery()},
		{name: "absent JSON, maps and slices stay nil", in: core.Delivery{JobID: "j"}},
		{name: "negative TTL (already expired)", in: core.Delivery{JobID: "j", TTL: -time.Millisecond}},
		{name: "nanosecond TTL is exact", in: core.Delivery{JobID: "j", TTL: time.Nanosecond}},
		{
			name: "a malformed trace context is dropped, not the job",
			in:   core.Delivery{JobID: "j", Trace: trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}})},
			want: core.Delivery{JobID: "j"},
		},
		{
			name: "empty JSON, map and slice come back absent",
			in:   core.Delivery{JobID: "j", Input: json.RawMessage{}, Options: json.RawMessage{}, Capabilities: map[string]string{}, Exclude: []string{}},
			want: core.Delivery{JobID: "j"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.want
			if want.JobID == "" {
				want = tc.in
			}
			roundTrip(t, tc.in, want, func(d core.Delivery) (*pb.PeerDelivery, error) { return peer.DeliveryToPB(d), nil }, peer.DeliveryFromPB)
		})
	}
}

// The wire form is a snapshot: editing the engine's delivery after
// converting it changes nothing that was queued.
func TestDeliveryToPBCopiesMapsAndSlices(t *testing.T) {
	d := fullDelivery()
	p := peer.DeliveryToPB(d)
	d.Capabilities["model"] = "other"
	d.Exclude[0] = "other"
	if p.GetCapabilities()["model"] != "demo" || p.GetExclude()[0] != "c-1" {
		t.Fatalf("wire form shares the delivery's map or slice: %v", p)
	}
}

func TestDeliveryFromPBRefusesNoJobID(t *testing.T) {
	for _, p := range []*pb.PeerDelivery{nil, {Queue: "q"}} {
		if _, err := peer.DeliveryFromPB(p); err == nil {
			t.Errorf("%v: no error", p)
		}
	}
}

func TestMessageRoundTrip(t *testing.T) {
	d := fullDelivery()
	for _, tc := range []struct {
		name string
		in   core.Message
		want *core.Message // nil: in
	}{
		{name: "every field", in: fullMessage()},
		{name: "forward", in: core.Message{Kind: core.MsgForward, JobID: "j", Gen: 2, Queue: "q", Delivery: &d}},
		{name: "deliver", in: core.Message{Kind: core.MsgDeliver, JobID: "j", Gen: 2, Queue: "q", Delivery: &d, Consumer: "c", WorkerName: "w"}},
		{name: "reply accepted", in: core.Message{Kind: core.MsgReply, JobID: "j", Gen: 2, Consumer: "c", Accepted: true}},
		{name: "reply output", in: core.Message{Kind: core.MsgReply, JobID: "j", Gen: 2, Output: json.RawMessage(`[1,2]`), TTL: 3 * time.Second}},
		{name: "reply success end: present though every field is empty", in: core.Message{Kind: core.MsgReply, JobID: "j", Gen: 2, End: &core.End{}}},
		{name: "reply failed end", in: core.Message{Kind: core.MsgReply, JobID: "j", End: &core.End{Code: core.CodeWorkerError, Detail: "x", Result: json.RawMessage(`null`)}}},
		{name: "release rejected", in: core.Message{Kind: core.MsgRelease, JobID: "j", Gen: 3, Consumer: "c", Rejected: true, Reason: "no"}},
		{name: "release lost", in: core.Message{Kind: core.MsgRelease, JobID: "j", Gen: 3, Consumer: "c", Reason: "worker gone"}},
		{name: "unbind", in: core.Message{Kind: core.MsgUnbind, JobID: "j", Gen: 3, Queue: "q", Consumer: "c"}},
		{name: "cancel", in: core.Message{Kind: core.MsgCancel, JobID: "j", Gen: 3, Code: core.CodeExpired}},
		{name: "grant", in: core.Message{Kind: core.MsgGrant, JobID: "j", Gen: 3, Queue: "q", Credit: core.OutputCredit{Events: 1024, Bytes: 4 << 20}}},
		{
			name: "empty output is absent",
			in:   core.Message{Kind: core.MsgReply, JobID: "j", Output: json.RawMessage{}, End: &core.End{Result: json.RawMessage{}}},
			want: &core.Message{Kind: core.MsgReply, JobID: "j", End: &core.End{}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.in
			if tc.want != nil {
				want = *tc.want
			}
			for viaWire, got := range roundTrip(t, tc.in, want, peer.MessageToPB, peer.MessageFromPB) {
				if (got.End == nil) != (want.End == nil) || (got.Delivery == nil) != (want.Delivery == nil) {
					t.Errorf("wire=%v: presence of End or Delivery changed", viaWire)
				}
			}
		})
	}
}

// Every kind core names has a wire form, and the wire kinds map back.
func TestEveryKindHasAWireForm(t *testing.T) {
	d := fullDelivery()
	for _, k := range []core.MessageKind{core.MsgForward, core.MsgDeliver, core.MsgReply, core.MsgRelease, core.MsgUnbind, core.MsgCancel, core.MsgGrant} {
		p, err := peer.MessageToPB(core.Message{Kind: k, JobID: "j", Delivery: &d})
		if err != nil {
			t.Errorf("%s: %v", k, err)
			continue
		}
		if m, err := peer.MessageFromPB(p); err != nil || m.Kind != k {
			t.Errorf("%s came back as %q, %v", k, m.Kind, err)
		}
	}
	if _, err := peer.MessageToPB(core.Message{Kind: "gossip", JobID: "j"}); err == nil {
		t.Error("an unknown kind converted")
	}
}

func TestMessageFromPBRefuses(t *testing.T) {
	for name, p := range map[string]*pb.PeerMessage{
		"unspecified kind":         {JobId: "j"},
		"unknown kind":             {Kind: 99, JobId: "j"},
		"no job id":                {Kind: pb.PeerMessage_KIND_CANCEL},
		"forward without delivery": {Kind: pb.PeerMessage_KIND_FORWARD, JobId: "j"},
		"deliver without delivery": {Kind: pb.PeerMessage_KIND_DELIVER, JobId: "j"},
		"delivery without job id":  {Kind: pb.PeerMessage_KIND_DELIVER, JobId: "j", Delivery: &pb.PeerDelivery{Queue: "q"}},
	} {
		if m, err := peer.MessageFromPB(p); err == nil {
			t.Errorf("%s: converted to %#v", name, m)
		}
	}
}

func TestRefusalRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name     string
		in, want *core.Error
	}{
		{name: "every field", in: &core.Error{Code: core.CodeQueueFull, Detail: "full", Field: "queue", RetryAfter: time.Second}},
		{name: "no hint", in: &core.Error{Code: core.CodeDraining, Detail: "bye"}},
		{
			name: "a sub-millisecond hint rounds up, never to no hint",
			in:   &core.Error{Code: core.CodeQueueFull, RetryAfter: 1500 * time.Microsecond},
			want: &core.Error{Code: core.CodeQueueFull, RetryAfter: 2 * time.Millisecond},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.want
			if want == nil {
				want = tc.in
			}
			res, ok := peer.ForwardResponse(fmt.Errorf("dispatch: %w", tc.in))
			if !ok {
				t.Fatal("a wrapped *core.Error is not an answer")
			}
			err := peer.ForwardError(wire(t, res))
			var got *core.Error
			if !errors.As(err, &got) || !reflect.DeepEqual(got, want) {
				t.Fatalf("got %#v, want %#v", err, want)
			}
		})
	}
}

func TestForwardResponse(t *testing.T) {
	res, ok := peer.ForwardResponse(nil)
	if !ok || peer.ForwardError(wire(t, res)) != nil {
		t.Errorf("accepted: got %v, %v", res, ok)
	}
	var typedNil *core.Error
	if res, ok := peer.ForwardResponse(typedNil); !ok || peer.ForwardError(res) != nil {
		t.Errorf("typed nil *core.Error: got %v, %v; want accepted", res, ok)
	}
	if _, ok := peer.ForwardResponse(errors.New("disk on fire")); ok {
		t.Error("an unclassified error became an answer")
	}
}

// A delivery whose trace context does not parse is still the job: its
// trace context is dropped, and the receiver's spans start a trace.
func TestDeliveryMalformedTrace(t *testing.T) {
	for _, tp := range []string{"garbage", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"} {
		d, err := peer.DeliveryFromPB(&pb.PeerDelivery{JobId: "j", Traceparent: tp, Tracestate: "a=b"})
		if err != nil || d.JobID != "j" || d.Trace.IsValid() {
			t.Errorf("traceparent %q: %+v, %v; want the job without a trace", tp, d, err)
		}
	}
}
