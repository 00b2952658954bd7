package peer

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/internal/pbcodec"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// Conversions between the engine's routing types and their wire form.
//
// What does not survive the trip, on purpose: an empty (non-nil)
// json.RawMessage, map or slice comes back nil, because proto3 cannot tell
// empty from absent and no receiver treats them differently (an empty
// RawMessage is not JSON). RetryAfter travels in whole milliseconds,
// rounded up. Everything else is exact.
//
// Raw JSON is shared, not copied: core treats a json.RawMessage as
// immutable once built. Maps and slices are copied, so a message queued by
// Send is a snapshot the engine may go on editing.

var kindToPB = map[core.MessageKind]pb.PeerMessage_Kind{
	core.MsgForward: pb.PeerMessage_KIND_FORWARD,
	core.MsgDeliver: pb.PeerMessage_KIND_DELIVER,
	core.MsgReply:   pb.PeerMessage_KIND_REPLY,
	core.MsgRelease: pb.PeerMessage_KIND_RELEASE,
	core.MsgUnbind:  pb.PeerMessage_KIND_UNBIND,
	core.MsgCancel:  pb.PeerMessage_KIND_CANCEL,
	core.MsgGrant:   pb.PeerMessage_KIND_GRANT,
}

var kindFromPB = func() map[pb.PeerMessage_Kind]core.MessageKind {
	m := make(map[pb.PeerMessage_Kind]core.MessageKind, len(kindToPB))
	for k, v := range kindToPB {
		m[v] = k
	}
	return m
}()

// errInvalidMessage marks a message that cannot be converted.
var errInvalidMessage = errors.New("invalid peer message")

// rawJSON returns b as a json.RawMessage, nil when empty.
func rawJSON(b []byte) json.RawMessage {
	if len(b) == 0 {
		return nil
	}
	return json.RawMessage(b)
}

// rawBytes returns r as bytes, nil when empty.
func rawBytes(r json.RawMessage) []byte {
	if len(r) == 0 {
		return nil
	}
	return []byte(r)
}

func copyMap(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	return maps.Clone(m)
}

func copySlice(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return slices.Clone(s)
}

// DeliveryToPB returns d in its wire form.
func DeliveryToPB(d core.Delivery) *pb.PeerDelivery {
	traceparent, tracestate := core.FormatTrace(d.Trace)
	return &pb.PeerDelivery{
		Traceparent:    traceparent,
		Tracestate:     tracestate,
		JobId:          d.JobID,
		Generation:     d.Gen,
		Queue:          d.Queue,
		Ingress:        d.Ingress,
		Input:          rawBytes(d.Input),
		Options:        rawBytes(d.Options),
		Capabilities:   copyMap(d.Capabilities),
		Zone:           d.Zone,
		TtlNs:          int64(d.TTL),
		MaxOutputBytes: d.MaxOutputBytes,
		MaxQueueDepth:  int64(d.MaxQueueDepth),
		MaxQueueBytes:  d.MaxQueueBytes,
		Exclude:        copySlice(d.Exclude),
		Front:          d.Front,
		WindowEvents:   uint64(max(d.Window.Events, 0)),
		WindowBytes:    uint64(max(d.Window.Bytes, 0)),
		Subject:        d.Subject,
		Weight:         uint32(max(d.Weight, 0)),
		Priority:       int32(d.Priority),
		AffinityKey:    d.AffinityKey,
		Epoch:          d.Epoch,
		LatencyFirst:   d.LatencyFirst,
	}
}

// DeliveryFromPB returns the delivery p carries. It fails on a delivery
// without a job id: nothing could refer to it.
func DeliveryFromPB(p *pb.PeerDelivery) (core.Delivery, error) {
	if p == nil {
		return core.Delivery{}, fmt.Errorf("%w: no delivery", errInvalidMessage)
	}
	if p.GetJobId() == "" {
		return core.Delivery{}, fmt.Errorf("%w: delivery without a job id", errInvalidMessage)
	}
	return core.Delivery{
		JobID:          p.GetJobId(),
		Gen:            p.GetGeneration(),
		Queue:          p.GetQueue(),
		Ingress:        p.GetIngress(),
		Input:          rawJSON(p.GetInput()),
		Options:        rawJSON(p.GetOptions()),
		Capabilities:   copyMap(p.GetCapabilities()),
		Zone:           p.GetZone(),
		TTL:            time.Duration(p.GetTtlNs()),
		MaxOutputBytes: p.GetMaxOutputBytes(),
		MaxQueueDepth:  int(p.GetMaxQueueDepth()),
		MaxQueueBytes:  p.GetMaxQueueBytes(),
		Exclude:        copySlice(p.GetExclude()),
		Front:          p.GetFront(),
		Window:         credit(p.GetWindowEvents(), p.GetWindowBytes()),
		// A malformed trace context is dropped, never the job: the
		// receiver's spans then start a trace of their own.
		Trace:       core.ParseTrace(p.GetTraceparent(), p.GetTracestate()),
		Subject:     p.GetSubject(),
		Weight:      int(min(p.GetWeight(), core.MaxWeight)),
		Priority:    min(max(int(p.GetPriority()), core.MinPriority), core.MaxPriority),
		AffinityKey: p.GetAffinityKey(),
		Epoch:       p.GetEpoch(),
		// A sender that carries no hint: false, the host batches as ever.
		LatencyFirst: p.GetLatencyFirst(),
	}, nil
}

// credit is an output credit from its wire form; past what an int64
// holds, it is as good as no bound.
func credit(events, bytes uint64) core.OutputCredit {
	return core.OutputCredit{Events: int64(min(events, math.MaxInt64)), Bytes: int64(min(bytes, math.MaxInt64))}
}

// MessageToPB returns m in its wire form. It fails on a kind the wire does
// not know: that is a bug in the caller, never a peer's doing.
func MessageToPB(m core.Message) (*pb.PeerMessage, error) {
	p := new(pb.PeerMessage)
	if err := messageIntoPB(m, p); err != nil {
		return nil, err
	}
	return p, nil
}

// messageIntoPB is MessageToPB into p, a zero message: the response leg
// allocates a reply's wire form with its item.
func messageIntoPB(m core.Message, p *pb.PeerMessage) error {
	k, ok := kindToPB[m.Kind]
	if !ok {
		return fmt.Errorf("%w: unknown kind %q", errInvalidMessage, m.Kind)
	}
	p.Kind = k
	p.JobId = m.JobID
	p.Generation = m.Gen
	p.Queue = m.Queue
	p.Consumer = m.Consumer
	p.WorkerName = m.WorkerName
	p.Accepted = m.Accepted
	p.Output = rawBytes(m.Output)
	p.Rejected = m.Rejected
	p.Running = m.Running
	p.Reason = m.Reason
	p.Code = string(m.Code)
	p.TtlNs = int64(m.TTL)
	p.CreditEvents = uint64(max(m.Credit.Events, 0))
	p.CreditBytes = uint64(max(m.Credit.Bytes, 0))
	if m.Delivery != nil {
		p.Delivery = DeliveryToPB(*m.Delivery)
	}
	if m.End != nil {
		p.End = &pb.PeerEnd{Code: string(m.End.Code), Detail: m.End.Detail, Result: rawBytes(m.End.Result)}
	}
	return nil
}

// MessageFromPB returns the message p carries. It fails, wrapping
// errInvalidMessage, on what no handler could act on: an unknown kind, no
// job id, or a forward or deliver without its delivery.
func MessageFromPB(p *pb.PeerMessage) (core.Message, error) {
	k, ok := kindFromPB[p.GetKind()]
	if !ok {
		return core.Message{}, fmt.Errorf("%w: unknown kind %v", errInvalidMessage, p.GetKind())
	}
	if p.GetJobId() == "" {
		return core.Message{}, fmt.Errorf("%w: %s without a job id", errInvalidMessage, k)
	}
	m := core.Message{
		Kind:       k,
		JobID:      p.GetJobId(),
		Gen:        p.GetGeneration(),
		Queue:      p.GetQueue(),
		Consumer:   p.GetConsumer(),
		WorkerName: p.GetWorkerName(),
		Accepted:   p.GetAccepted(),
		Output:     rawJSON(p.GetOutput()),
		Rejected:   p.GetRejected(),
		Running:    p.GetRunning(),
		Reason:     p.GetReason(),
		Code:       core.Code(p.GetCode()),
		TTL:        time.Duration(p.GetTtlNs()),
		Credit:     credit(p.GetCreditEvents(), p.GetCreditBytes()),
	}
	if p.Delivery != nil {
		d, err := DeliveryFromPB(p.Delivery)
		if err != nil {
			return core.Message{}, err
		}
		m.Delivery = &d
	} else if k == core.MsgForward || k == core.MsgDeliver {
		return core.Message{}, fmt.Errorf("%w: %s of job %s without a delivery", errInvalidMessage, k, m.JobID)
	}
	if e := p.GetEnd(); e != nil {
		m.End = &core.End{Code: core.Code(e.GetCode()), Detail: e.GetDetail(), Result: rawJSON(e.GetResult())}
	}
	return m, nil
}

// RefusalToPB returns the wire form of a dispatcher's refusal.
func RefusalToPB(e *core.Error) *pb.PeerRefusal {
	return &pb.PeerRefusal{
		Code:         string(e.Code),
		Detail:       e.Detail,
		Field:        e.Field,
		RetryAfterMs: int64((e.RetryAfter + time.Millisecond - 1) / time.Millisecond),
	}
}

// RefusalFromPB returns the *core.Error a refusal carries.
func RefusalFromPB(p *pb.PeerRefusal) *core.Error {
	return &core.Error{
		Code:       core.Code(p.GetCode()),
		Detail:     p.GetDetail(),
		Field:      p.GetField(),
		RetryAfter: time.Duration(p.GetRetryAfterMs()) * time.Millisecond,
	}
}

// ForwardResponse is the answer to a Forward the dispatcher decided:
// accepted for nil, the refusal for a *core.Error. ok is false for any
// other error: the dispatcher could not decide, which is no answer.
func ForwardResponse(err error) (res *pb.ForwardResponse, ok bool) {
	if err == nil {
		return &pb.ForwardResponse{}, true
	}
	var ce *core.Error
	if !errors.As(err, &ce) {
		return nil, false
	}
	if ce == nil {
		// A func returning *core.Error handed back as error: its nil
		// meant "no refusal".
		return &pb.ForwardResponse{}, true
	}
	return &pb.ForwardResponse{Refusal: RefusalToPB(ce)}, true
}

// ForwardError is the verdict a ForwardResponse carries: nil when the
// dispatcher holds the job, else its refusal as a *core.Error.
func ForwardError(res *pb.ForwardResponse) error {
	if r := res.GetRefusal(); r != nil {
		return RefusalFromPB(r)
	}
	return nil
}

// errNoWireForm marks a message that cannot be marshalled.
var errNoWireForm = errors.New("no valid wire form")

// wireValid fails when m cannot be marshalled (checkUTF8). The messages
// every job sends several of, PeerMessage and PeerDelivery, are checked
// field by field without reflection: that walk cost more CPU per job than
// anything else the reply path does besides sending. TestWireValidCovers
// walks their descriptors and fails for a string field added to either
// (or to a message nested in them) that this misses.
func wireValid(m proto.Message) error {
	switch m := m.(type) {
	case *pb.PeerMessage:
		return peerMessageUTF8(m)
	case *pb.PeerDelivery:
		return deliveryUTF8(m)
	}
	return checkUTF8(m.ProtoReflect())
}

func peerMessageUTF8(m *pb.PeerMessage) error {
	for _, f := range [...]struct{ name, v string }{
		{"job_id", m.GetJobId()}, {"queue", m.GetQueue()}, {"consumer", m.GetConsumer()},
		{"worker_name", m.GetWorkerName()}, {"reason", m.GetReason()}, {"code", m.GetCode()},
		{"end.code", m.GetEnd().GetCode()}, {"end.detail", m.GetEnd().GetDetail()},
	} {
		if !utf8.ValidString(f.v) {
			return fmt.Errorf("%w: field %s is not valid UTF-8", errNoWireForm, f.name)
		}
	}
	if d := m.GetDelivery(); d != nil {
		return deliveryUTF8(d)
	}
	return nil
}

func deliveryUTF8(d *pb.PeerDelivery) error {
	for _, f := range [...]struct{ name, v string }{
		{"job_id", d.GetJobId()}, {"queue", d.GetQueue()}, {"ingress", d.GetIngress()}, {"zone", d.GetZone()},
		{"traceparent", d.GetTraceparent()}, {"tracestate", d.GetTracestate()},
		{"subject", d.GetSubject()}, {"affinity_key", d.GetAffinityKey()}, {"incarnation", d.GetIncarnation()},
	} {
		if !utf8.ValidString(f.v) {
			return fmt.Errorf("%w: field %s is not valid UTF-8", errNoWireForm, f.name)
		}
	}
	for k, v := range d.GetCapabilities() {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return fmt.Errorf("%w: field capabilities is not valid UTF-8", errNoWireForm)
		}
	}
	for _, c := range d.GetExclude() {
		if !utf8.ValidString(c) {
			return fmt.Errorf("%w: field exclude is not valid UTF-8", errNoWireForm)
		}
	}
	return nil
}

// checkUTF8 is pbcodec.CheckUTF8 as wireValid reports it.
func checkUTF8(m protoreflect.Message) error {
	if err := pbcodec.CheckUTF8(m); err != nil {
		return fmt.Errorf("%w: %w", errNoWireForm, err)
	}
	return nil
}
